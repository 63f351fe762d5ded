//! `bench model` on a model whose routed experts stream from disk: decode runs of fresh
//! tokens (a repeated step would find its experts cached), set against the roof that
//! binds — memory for every byte the step computes on plus disk for the bytes it had to
//! read — with both bandwidths measured in the same run, right before each row.

use super::harness::{tokens, Bench, ModelArgs};
use anyhow::Result;
use deepinfer_engine::cache::SeqId;
use deepinfer_engine::runner::SeqWork;
use deepinfer_model::experts::ExpertStore;
use deepinfer_model::kernels::roofline::read_bandwidth;
use deepinfer_model::profile::Snapshot;
use serde::Serialize;
use std::time::Instant;

/// Experts read to measure the disk before each row.
const DISK_PROBE_READS: usize = 192;

#[derive(Serialize)]
pub struct StreamedRow {
    batch: usize,
    steps: usize,
    ms_per_step: f64,
    tokens_per_s: f64,
    hit_rate: f64,
    disk_mb_per_token: f64,
    memory_mb_per_token: f64,
    memory_gbs: f64,
    disk_gbs: f64,
    /// The step's lower bound (memory bytes at the memory roof plus disk bytes at the disk
    /// roof) over its time.
    pct_of_roof: f64,
    /// Share of the time the forward pass waited for reads.
    wait_share: f64,
}

pub fn print_header() {
    println!(
        "{:>6} {:>6} {:>9} {:>8} {:>6} {:>10} {:>10} {:>8} {:>8} {:>7} {:>6}",
        "batch",
        "steps",
        "ms/step",
        "tok/s",
        "hit %",
        "disk MB/t",
        "mem MB/t",
        "mem GB/s",
        "disk GB/s",
        "% roof",
        "wait %"
    );
}

fn print_row(r: &StreamedRow) {
    println!(
        "{:>6} {:>6} {:>9.1} {:>8.2} {:>5.1}% {:>10.1} {:>10.1} {:>8.1} {:>8.2} {:>6.1}% {:>5.1}%",
        r.batch,
        r.steps,
        r.ms_per_step,
        r.tokens_per_s,
        100.0 * r.hit_rate,
        r.disk_mb_per_token,
        r.memory_mb_per_token,
        r.memory_gbs,
        r.disk_gbs,
        r.pct_of_roof,
        100.0 * r.wait_share
    );
}

/// `b` sequences with `args.context` tokens cached decode `args.steps` tokens each, every
/// step fresh ids; the disk is probed right before and right after the run.
pub fn decode_run(
    bench: &mut Bench,
    store: &ExpertStore,
    args: &ModelArgs,
    b: usize,
    threads: usize,
) -> Result<StreamedRow> {
    let vocab = bench.runner.model().config.vocab_size;
    let steps = args.steps.max(1);
    let seqs: Vec<SeqId> = (0..b)
        .map(|_| bench.cache.add_seq())
        .collect::<Result<_, _>>()?;
    let mut history: Vec<Vec<u32>> = (0..b).map(|i| tokens(args.context, vocab, i)).collect();
    for (&s, ids) in seqs.iter().zip(&history) {
        bench.prefill(s, ids, 512)?;
    }
    let mut step = |n: usize| -> Result<()> {
        let ids: Vec<Vec<u32>> = (0..b)
            .map(|i| tokens(1, vocab, 7 * n + 31 * i + 5))
            .collect();
        let work: Vec<SeqWork> = seqs
            .iter()
            .zip(&ids)
            .zip(&history)
            .map(|((&seq, ids), history)| SeqWork {
                seq,
                start: args.context + n,
                tokens: ids,
                num_logits: 1,
                history,
                images: &[],
            })
            .collect();
        for &s in &seqs {
            bench.cache.ensure_capacity(s, args.context + n + 1)?;
        }
        bench.runner.step(&mut bench.cache, &work)?;
        for (h, ids) in history.iter_mut().zip(&ids) {
            h.extend_from_slice(ids);
        }
        Ok(())
    };
    step(0)?; // warm-up: the workspace grows once
    let memory_gbs = read_bandwidth(256 << 20, threads, 2);
    let disk_gbs = store.expert_read_bandwidth(DISK_PROBE_READS)?;
    let (before, counters) = (store.stats(), Snapshot::now());
    let clock = Instant::now();
    for n in 1..=steps {
        step(n)?;
    }
    let secs = clock.elapsed().as_secs_f64();
    let (s, d) = (
        store.stats().since(&before),
        Snapshot::now().since(&counters),
    );
    // The disk's speed drifts too: the faster of the probes before and after is the roof.
    let disk_gbs = disk_gbs.max(store.expert_read_bandwidth(DISK_PROBE_READS)?);
    for seq in seqs {
        bench.cache.free_seq(seq)?;
    }
    let toks = (b * steps) as f64;
    let memory_bytes = (d.weight_bytes + d.cache_bytes) as f64;
    let bound = memory_bytes / (memory_gbs * 1e9) + s.bytes_read as f64 / (disk_gbs * 1e9);
    let row = StreamedRow {
        batch: b,
        steps,
        ms_per_step: secs * 1e3 / steps as f64,
        tokens_per_s: toks / secs,
        hit_rate: s.hit_rate(),
        disk_mb_per_token: s.bytes_read as f64 / 1e6 / toks,
        memory_mb_per_token: memory_bytes / 1e6 / toks,
        memory_gbs,
        disk_gbs,
        pct_of_roof: 100.0 * bound / secs,
        wait_share: s.wait_secs / secs,
    };
    print_row(&row);
    Ok(row)
}

/// This process's peak resident set (`VmHWM`), in MiB.
pub fn peak_rss_mib() -> Option<u64> {
    crate::memory::process_status_mib("VmHWM")
}
