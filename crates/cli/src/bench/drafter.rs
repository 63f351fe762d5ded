//! `bench model`'s DSpark row: what one draft block costs (batch 1) after the decode rows'
//! context — its weight reads (three stages, the vocabulary head over the block, the Markov
//! head once per row) against the roofs, like a decode step. Its own cache carries the
//! drafter's context rings, so the decode rows above stay plain decoding.

use super::harness::{print_decode_row, print_profile, quick_roofs, summarize, tokens};
use super::harness::{Bench, DecodeRow, ModelArgs};
use anyhow::Result;
use deepinfer_engine::cache::{default_block_tokens, CacheBudget, CacheConfig, CacheManager};
use deepinfer_engine::runner::SeqWork;
use deepinfer_model::profile::{self, Snapshot};
use deepinfer_model::v4::dspark::Draft;
use std::time::Instant;

/// The row, or `None` when the checkpoint has no drafter.
pub(super) fn dspark_row(
    bench: &mut Bench,
    args: &ModelArgs,
    threads: usize,
) -> Result<Option<DecodeRow>> {
    let Some(stages) = bench
        .runner
        .model()
        .dspark
        .as_ref()
        .map(|d| d.config.stages)
    else {
        return Ok(None);
    };
    let c = bench.runner.model().config.clone();
    let mut cache = CacheManager::new(
        &c,
        CacheConfig {
            budget: CacheBudget::Bytes(256 << 20),
            block_tokens: default_block_tokens(&c),
            prefix_caching: false,
            draft_layers: stages,
            ..CacheConfig::default()
        },
    )?;
    // The context, through the target: it leaves the context keys in the rings.
    let (p0, seq) = (args.context, cache.add_seq()?);
    let ids = tokens(p0 + 1, c.vocab_size, 3);
    cache.ensure_capacity(seq, p0)?;
    for start in (0..p0).step_by(512) {
        let work = SeqWork {
            seq,
            start,
            tokens: &ids[start..p0.min(start + 512)],
            num_logits: 1,
            history: &ids[..start],
            images: &[],
        };
        bench.runner.step(&mut cache, &[work])?;
    }
    let ctx0 = p0.saturating_sub(c.sliding_window);
    let block_size = c.dspark.as_ref().map_or(0, |d| d.block_size);
    let mut draft = Draft::default();
    let runner = &mut bench.runner;
    let mut block = || -> Result<(f64, Snapshot)> {
        let before = Snapshot::now();
        let clock = Instant::now();
        runner.draft(&mut cache, seq, ctx0..p0, ids[p0], &mut draft)?;
        Ok((
            clock.elapsed().as_secs_f64(),
            Snapshot::now().since(&before),
        ))
    };
    let (_, counters) = block()?; // warm-up: the workspace grows once
    let mut timed = Vec::new();
    for _ in 0..args.reps.max(1) {
        let roofs = quick_roofs(threads);
        timed.push((block()?.0, roofs));
    }
    let row = summarize(1, block_size, p0, &counters, &timed);
    println!();
    println!(
        "DSpark draft block: {} rows through {stages} stages, the head and the Markov chain \
         (batch 1, same columns; tok/seq = the block)",
        block_size
    );
    print_decode_row(&row);
    if args.profile {
        profile::set_enabled(true);
        let before = Snapshot::now();
        for _ in 0..args.reps.max(1) {
            block()?;
        }
        profile::set_enabled(false);
        let d = Snapshot::now().since(&before);
        print_profile("DSpark draft block", &d, args.reps.max(1), &row.roofs);
    }
    Ok(Some(row))
}
