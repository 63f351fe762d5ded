//! Decode cost per layer kind against context length (a benchmark, not a test).
//!
//! For each context length L it prefills a sequence of L tokens, then times one decode
//! step at position L through each layer on its own (the cache filled by the prefill), and
//! the whole model. A sliding-window layer reads at most `W` keys whatever L is; a CSA
//! layer adds the indexer's scan over L/m keys plus its top-k entries; an HCA layer reads
//! every one of its L/m entries.
//!
//! Run: `cargo run --release -p deepinfer-engine --example decode_cost -- MODEL_DIR [L ...]`

use deepinfer_engine::cache::{CacheBudget, CacheConfig, CacheManager, SeqId};
use deepinfer_engine::runner::{ModelRunner, SeqWork};
use deepinfer_model::batch::SeqSpan;
use deepinfer_model::v4::block::block_forward;
use deepinfer_model::v4::carry::Carry;
use deepinfer_model::v4::pass::BlockCtx;
use deepinfer_model::v4::rows::{Angles, BatchRows};
use deepinfer_model::v4::workspace::Workspace;
use deepinfer_model::v4::Model;
use std::time::Instant;

const REPS: usize = 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As the engine runs the model: inside its compute pool.
    deepinfer_engine::engine::compute_pool()?
        .install(|| run().map_err(|e| e.to_string()))
        .map_err(Into::into)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: decode_cost MODEL_DIR [CONTEXT ...]")?;
    let mut contexts: Vec<usize> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if contexts.is_empty() {
        contexts = vec![128, 512, 2048, 8192];
    }
    let model = Model::load(std::path::Path::new(&dir))?;
    let c = model.config.clone();
    println!(
        "model {dir}: {} layers, window {}, csa m={} top-{}, hca m={}",
        c.num_hidden_layers,
        c.sliding_window,
        c.compress_rate_csa,
        c.index_topk,
        c.compress_rate_hca
    );
    let kinds: Vec<String> = (0..c.num_hidden_layers)
        .map(|l| format!("{:?}{}", c.layer_types[l], l))
        .collect();
    println!(
        "{:>8} {:>12} {}",
        "context",
        "model µs/tok",
        kinds.iter().map(|k| format!("{k:>12}")).collect::<String>()
    );
    let max_ctx = *contexts.iter().max().unwrap_or(&0);
    let cache = CacheConfig {
        budget: CacheBudget::Bytes(1 << 30),
        rollback_slack: 1,
        block_tokens: 256,
        prefix_caching: false,
        ..CacheConfig::default()
    };
    let mut cache = CacheManager::new(&model.config, cache)?;
    let mut runner = ModelRunner::new(model);
    let vocab = c.vocab_size as u32;
    let tokens: Vec<u32> = (0..max_ctx as u32 + 1)
        .map(|i| (i * 7919 + 13) % vocab)
        .collect();
    for &ctx in &contexts {
        let seq = cache.add_seq()?;
        cache.ensure_capacity(seq, ctx)?;
        for (i, part) in tokens[..ctx].chunks(512).enumerate() {
            let work = SeqWork {
                seq,
                start: i * 512,
                tokens: part,
                num_logits: 1,
                history: &tokens[..i * 512],
                images: &[],
            };
            runner.step(&mut cache, &[work])?;
        }
        // Whole-model decode step at position ctx, rolled back each time.
        let decode = SeqWork {
            seq,
            start: ctx,
            tokens: &tokens[ctx..ctx + 1],
            num_logits: 1,
            history: &tokens[..ctx],
            images: &[],
        };
        let t0 = Instant::now();
        for _ in 0..REPS {
            cache.ensure_capacity(seq, ctx + 1)?;
            runner.step(&mut cache, std::slice::from_ref(&decode))?;
            cache.truncate(seq, ctx)?;
        }
        let model_us = t0.elapsed().as_secs_f64() * 1e6 / REPS as f64;
        let per_layer = time_layers(&runner, &mut cache, seq, ctx, tokens[ctx])?;
        println!(
            "{ctx:>8} {model_us:>12.1} {}",
            per_layer
                .iter()
                .map(|us| format!("{us:>12.1}"))
                .collect::<String>()
        );
        cache.free_seq(seq)?;
    }
    Ok(())
}

/// µs per decode token of each layer alone, reading the cache a prefill of `ctx` left.
fn time_layers(
    runner: &ModelRunner,
    cache: &mut CacheManager,
    seq: SeqId,
    ctx: usize,
    token: u32,
) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    cache.ensure_capacity(seq, ctx + 1)?; // room for position ctx
    let model = runner.model();
    let c = &model.config;
    let positions = [ctx];
    let spans = [SeqSpan { start: 0, len: 1 }];
    let rows = BatchRows::new(&positions, &spans, vec![(0, ctx, 0)]);
    let mut out = Vec::new();
    let mut ws = Workspace::default();
    for (l, lw) in model.weights.layers.iter().enumerate() {
        let angles = Angles::new(model.rope_for(l), &positions, &mut ws);
        let mut x: Vec<f32> = (0..c.hc_mult * c.hidden_size)
            .map(|i| ((i % 17) as f32 - 8.0) / 8.0)
            .collect();
        let mut view = cache.view(&[seq])?;
        let ctx_l = BlockCtx {
            c,
            layer: l,
            token_ids: &[token],
            rows: &rows,
            rope: model.rope_for(l),
            angles: &angles,
        };
        let t0 = Instant::now();
        for _ in 0..REPS {
            let mut carry = Carry::default();
            block_forward(lw, &ctx_l, &mut x, &mut view, &mut carry, &mut ws)?;
            carry.recycle(&mut ws);
        }
        out.push(t0.elapsed().as_secs_f64() * 1e6 / REPS as f64);
        angles.recycle(&mut ws);
    }
    cache.truncate(seq, ctx)?;
    Ok(out)
}
