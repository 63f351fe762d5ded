//! `deepinfer bench model`: the model's own speed, in the spirit of `llama-bench` — decode
//! at given batch sizes and prefill at given prompt lengths, straight through the model
//! runner (no scheduler, no HTTP) — against this machine's roofs measured in the same run.
//!
//! Decode steps are rolled back after each timing (truncation is free by design), so every
//! repetition runs the same step on the same cache. Bytes and FLOPs come from the model's
//! own counters: every weight byte a step reads (the stored format: FP8 codes and scales,
//! packed FP4, BF16, …, experts only when selected), plus the cached keys attention and the
//! indexer read.

use super::harness::{
    median, print_decode_row, print_profile, quick_roofs, roofs, summarize, tokens, Bench,
    CollectiveSnapshot, CollectivesRow, DecodeRow, ModelArgs, Roofs,
};
use super::streamed;
use crate::ranks;
use anyhow::{Context, Result};
use deepinfer_engine::cache::{CacheBudget, CacheConfig, CacheManager, SeqId};
use deepinfer_engine::runner::{ModelRunner, SeqWork};
use deepinfer_model::kernels::cpu::isa;
use deepinfer_model::kernels::roofline::fma_peak;
use deepinfer_model::profile::{self, Op, Snapshot};
use serde::Serialize;
use std::time::Instant;

#[derive(Serialize)]
struct PrefillRow {
    tokens: usize,
    ms: f64,
    tokens_per_s: f64,
    gflops: f64,
    /// Median of the FMA peak measured right before each repetition.
    fma_gflops: f64,
    pct_of_fma: f64,
    /// FLOP rate of the matrix products alone (from a profiled repetition).
    matmul_gflops: f64,
    matmul_pct_of_fma: f64,
    collectives: Vec<CollectivesRow>,
}

#[derive(Serialize)]
struct Report {
    model: String,
    isa: &'static str,
    threads: usize,
    roofs: Roofs,
    decode: Vec<DecodeRow>,
    /// One DSpark draft block, where the checkpoint ships the drafter.
    dspark: Option<DecodeRow>,
    /// Decode runs when the experts stream from disk (then `decode` is empty).
    streamed_decode: Vec<streamed::StreamedRow>,
    prefill: Vec<PrefillRow>,
}

/// One decode measurement: `b` sequences with `context` tokens cached each append `t`
/// tokens per step (`t > 1`: what verifying `t − 1` draft tokens costs), rolled back after
/// every repetition; with `--profile`, the first row's time per op kind too.
fn decode_row(
    bench: &mut Bench,
    args: &ModelArgs,
    b: usize,
    t: usize,
    threads: usize,
) -> Result<DecodeRow> {
    let (vocab, reps) = (bench.runner.model().config.vocab_size, args.reps.max(1));
    let seqs: Vec<SeqId> = (0..b)
        .map(|_| bench.cache.add_seq())
        .collect::<Result<_, _>>()?;
    let context: Vec<Vec<u32>> = (0..b).map(|i| tokens(args.context, vocab, i)).collect();
    for (&s, ids) in seqs.iter().zip(&context) {
        bench.prefill(s, ids, 512)?;
    }
    let next: Vec<Vec<u32>> = (0..b).map(|i| tokens(t, vocab, 1000 + i)).collect();
    let work: Vec<SeqWork> = seqs
        .iter()
        .zip(&next)
        .zip(&context)
        .map(|((&seq, ids), history)| SeqWork {
            seq,
            start: args.context,
            tokens: ids,
            num_logits: t,
            history,
            images: &[],
        })
        .collect();
    let step = |bench: &mut Bench| -> Result<(f64, Snapshot)> {
        for &s in &seqs {
            bench.cache.ensure_capacity(s, args.context + t)?;
        }
        let before = Snapshot::now();
        let clock = Instant::now();
        bench.runner.step(&mut bench.cache, &work)?;
        let secs = clock.elapsed().as_secs_f64();
        let d = Snapshot::now().since(&before);
        for &s in &seqs {
            bench.cache.truncate(s, args.context)?;
        }
        Ok((secs, d))
    };
    let (_, counters) = step(bench)?; // warm-up: the workspace grows once
    let mut timed = Vec::with_capacity(reps);
    let comm = CollectiveSnapshot::now();
    for _ in 0..reps {
        let roofs = quick_roofs(threads);
        timed.push((step(bench)?.0, roofs));
    }
    let mut row = summarize(b, t, args.context, &counters, &timed);
    let layers = bench.runner.model().config.layer_types.len();
    row.collectives = CollectivesRow::between(&comm, reps, layers);
    if args.profile && b == args.batch[0] && t == args.tokens_per_seq[0] {
        profile::set_enabled(true);
        let before = Snapshot::now();
        for _ in 0..reps {
            step(bench)?;
        }
        profile::set_enabled(false);
        print_profile(
            &format!("decode, batch {b}"),
            &Snapshot::now().since(&before),
            reps,
            &row.roofs,
        );
    }
    for s in seqs {
        bench.cache.free_seq(s)?;
    }
    Ok(row)
}

/// Runs inside a compute pool, as the engine does (the parallel loops start from a worker).
pub fn run(args: ModelArgs) -> Result<()> {
    args.load.threads.install()?;
    deepinfer_engine::engine::compute_pool()?.install(|| bench(args))
}

fn bench(args: ModelArgs) -> Result<()> {
    let threads = rayon::current_num_threads();
    let (mut bench, r0) = setup(&args, threads)?;
    print_header(&args, threads, &r0);
    let (decode, streamed_rows, dspark) = decode_rows(&mut bench, &args, threads)?;
    let prefill_rows = prefill_rows(&mut bench, &args, threads, &r0)?;
    let r1 = roofs(threads);
    println!();
    println!(
        "roofs measured again after: read bandwidth {:.1} GB/s, f32 FMA peak {:.1} GFLOP/s",
        r1.read_gbs, r1.fma_gflops
    );
    if let Some(path) = &args.json {
        let report = Report {
            model: args.model.display().to_string(),
            isa: isa().name(),
            threads,
            roofs: r0,
            decode,
            dspark,
            streamed_decode: streamed_rows,
            prefill: prefill_rows,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Loads the model (the other ranks serve their part inside the load) and its cache; the
/// roofs are read first, so the bandwidth probe's buffer is not counted on top of them.
fn setup(args: &ModelArgs, threads: usize) -> Result<(Bench, Roofs)> {
    let budget = args.load.budget_beside(args.cache_budget_mib << 20);
    let dir = args.load.resolve(&args.model)?;
    if ranks::world().is_some_and(|w| w.rank() != 0) {
        // The other ranks serve their part inside `load` and end there; they must not
        // probe the roofs while rank 0 does.
        args.load.load(&dir, budget, |_, _| {})?;
    }
    let r0 = roofs(threads);
    let t = Instant::now();
    let mut model = args.load.load(&dir, budget, |_, _| {})?;
    eprintln!(
        "loaded {} in {:.1} s",
        args.model.display(),
        t.elapsed().as_secs_f64()
    );
    model.set_batch_invariant(!args.batch_variant);
    let max_batch = args.batch.iter().copied().max().unwrap_or(1);
    let cache = CacheConfig {
        budget: CacheBudget::Bytes(args.cache_budget_mib << 20),
        max_seqs: max_batch.max(1),
        // Every timed step is rolled back.
        rollback_slack: args.tokens_per_seq.iter().copied().max().unwrap_or(1),
        block_tokens: deepinfer_engine::cache::default_block_tokens(&model.config),
        prefix_caching: false,
        ..CacheConfig::default()
    };
    let cache = CacheManager::new(&model.config, cache)?;
    // Scratch for the longest sequence the cache holds, not the config's whole context.
    let longest = cache.max_tokens_per_seq();
    model.limit_positions(longest.min(model.config.max_position_embeddings));
    let bench = Bench {
        cache,
        runner: ModelRunner::new(model),
    };
    Ok((bench, r0))
}

fn print_header(args: &ModelArgs, threads: usize, r0: &Roofs) {
    println!(
        "deepinfer bench model: {} ({} kernels, {threads} threads; {})",
        args.model.display(),
        isa().name(),
        super::gemm_choice()
    );
    println!(
        "roofs measured now: read bandwidth {:.1} GB/s, f32 FMA peak {:.1} GFLOP/s (every \
         percentage below sets a repetition against the roofs measured right before it)",
        r0.read_gbs, r0.fma_gflops
    );
}

/// The decode rows: resident (every batch × tokens-per-sequence, then one DSpark block), or
/// streamed from disk.
fn decode_rows(
    bench: &mut Bench,
    args: &ModelArgs,
    threads: usize,
) -> Result<(
    Vec<DecodeRow>,
    Vec<streamed::StreamedRow>,
    Option<DecodeRow>,
)> {
    let mut decode = Vec::new();
    let mut streamed_rows = Vec::new();
    let store = bench.runner.model().weights.expert_store.clone();
    if let Some(store) = &store {
        println!();
        println!(
            "routed experts stream from disk ({} slots, {} MiB): decode runs of {} fresh \
             tokens per sequence, against memory + disk roofs measured before each row",
            store.capacity(),
            store.cache_bytes() >> 20,
            args.steps
        );
        streamed::print_header();
        for &b in &args.batch {
            streamed_rows.push(streamed::decode_run(bench, store, args, b, threads)?);
        }
        if let Some(mib) = streamed::peak_rss_mib() {
            println!("peak RSS so far: {mib} MiB");
        }
    }
    if store.is_none() {
        println!();
        println!(
            "{:>6} {:>7} {:>8} {:>9} {:>9} {:>11} {:>8} {:>8} {:>9} {:>8} {:>14}",
            "batch",
            "tok/seq",
            "context",
            "ms/step",
            "tok/s",
            "MB/token",
            "GB/s",
            "% BW",
            "GFLOP/s",
            "% FMA",
            "% binding roof"
        );
    }
    for &b in args.batch.iter().filter(|_| store.is_none()) {
        for &t in &args.tokens_per_seq {
            let row = decode_row(bench, args, b, t.max(1), threads)?;
            print_decode_row(&row);
            CollectivesRow::print(&row.collectives);
            decode.push(row);
        }
    }
    let dspark = match store {
        None => super::drafter::dspark_row(bench, args, threads)?,
        Some(_) => None,
    };
    Ok((decode, streamed_rows, dspark))
}

/// One prefill row per prompt length.
fn prefill_rows(
    bench: &mut Bench,
    args: &ModelArgs,
    threads: usize,
    r0: &Roofs,
) -> Result<Vec<PrefillRow>> {
    let mut prefill_rows = Vec::new();
    println!();
    println!(
        "{:>8} {:>10} {:>10} {:>9} {:>7} {:>15} {:>8}",
        "prompt", "ms", "tok/s", "GFLOP/s", "% FMA", "matmul GFLOP/s", "% FMA"
    );
    for &p in args.prompt.iter().filter(|&&p| p > 0) {
        let (row, row_profile) = prefill_row(bench, args, threads, p)?;
        if args.profile && p == args.prompt[args.prompt.len() - 1] {
            let roofs = Roofs {
                fma_gflops: row.fma_gflops,
                ..r0.clone()
            };
            print_profile(&format!("prefill, {p} tokens"), &row_profile, 1, &roofs);
        }
        prefill_rows.push(row);
    }
    Ok(prefill_rows)
}

/// A prompt of `p` tokens prefilled in one step: its time and rates, then one profiled
/// repetition for the matrix products' own share (returned for `--profile`).
fn prefill_row(
    bench: &mut Bench,
    args: &ModelArgs,
    threads: usize,
    p: usize,
) -> Result<(PrefillRow, Snapshot)> {
    let vocab = bench.runner.model().config.vocab_size;
    let reps = args.reps.max(1);
    let ids = tokens(p, vocab, 7);
    let once = |bench: &mut Bench| -> Result<(f64, Snapshot)> {
        let seq = bench.cache.add_seq()?;
        bench.cache.ensure_capacity(seq, p)?;
        let before = Snapshot::now();
        let t = Instant::now();
        bench.prefill(seq, &ids, p)?;
        let secs = t.elapsed().as_secs_f64();
        let d = Snapshot::now().since(&before);
        bench.cache.free_seq(seq)?;
        Ok((secs, d))
    };
    let (_, counters) = once(bench)?;
    let (mut times, mut pct, mut fmas) = (vec![], vec![], vec![]);
    let comm = CollectiveSnapshot::now();
    for _ in 0..reps {
        let peak = fma_peak(threads, 1);
        let (secs, _) = once(bench)?;
        times.push(secs);
        pct.push(100.0 * counters.flops as f64 / secs / 1e9 / peak);
        fmas.push(peak);
    }
    let layers = bench.runner.model().config.layer_types.len();
    let collectives = CollectivesRow::between(&comm, reps, layers);
    let secs = median(times);
    let peak = median(fmas);
    // One profiled repetition for the matrix products' own share of the time.
    profile::set_enabled(true);
    let (_, prof) = once(bench)?;
    profile::set_enabled(false);
    let mm_ns: u64 = Op::MATMULS.iter().map(|&o| prof.time_ns[o as usize]).sum();
    let gflops = counters.flops as f64 / secs / 1e9;
    let mm_gflops = prof.flops as f64 / (mm_ns as f64).max(1.0);
    let row = PrefillRow {
        tokens: p,
        ms: secs * 1e3,
        tokens_per_s: p as f64 / secs,
        gflops,
        fma_gflops: peak,
        pct_of_fma: median(pct),
        matmul_gflops: mm_gflops,
        matmul_pct_of_fma: 100.0 * mm_gflops / peak,
        collectives,
    };
    println!(
        "{:>8} {:>10.1} {:>10.1} {:>9.1} {:>6.1}% {:>15.1} {:>7.1}%",
        row.tokens,
        row.ms,
        row.tokens_per_s,
        row.gflops,
        row.pct_of_fma,
        row.matmul_gflops,
        row.matmul_pct_of_fma
    );
    CollectivesRow::print(&row.collectives);
    Ok((row, prof))
}
