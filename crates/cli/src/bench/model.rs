//! `deepinfer bench model`: the model's own speed, in the spirit of `llama-bench` — decode
//! at given batch sizes and prefill at given prompt lengths, straight through the model
//! runner (no scheduler, no HTTP) — against this machine's roofs measured in the same run.
//!
//! Decode steps are rolled back after each timing (truncation is free by design), so every
//! repetition runs the same step on the same cache. Bytes and FLOPs come from the model's
//! own counters: every weight byte a step reads (the stored format: FP8 codes and scales,
//! packed FP4, BF16, …, experts only when selected), plus the cached keys attention and the
//! indexer read.

use super::streamed;
use crate::load_args::LoadArgs;
use crate::ranks;
use anyhow::{Context, Result};
use clap::Args;
use deepinfer_engine::cache::{CacheBudget, CacheConfig, CacheManager, SeqId};
use deepinfer_engine::runner::{ModelRunner, SeqWork};
use deepinfer_model::kernels::cpu::isa;
use deepinfer_model::kernels::roofline::{fma_peak, read_bandwidth};
use deepinfer_model::parallel::CollectiveStats;
use deepinfer_model::profile::{self, Op, Snapshot};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct ModelArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// Memory for the cache pools, in MiB.
    #[arg(long, default_value_t = 2048)]
    cache_budget_mib: usize,
    /// Decode steps per row when the experts stream from disk (each step fresh tokens).
    #[arg(long, default_value_t = 32)]
    pub steps: usize,
    /// Checkpoint directory.
    #[arg(long)]
    model: PathBuf,
    /// Decode batch sizes (sequences stepping together, one token each).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    batch: Vec<usize>,
    /// Tokens each sequence appends per decode step: 1 is plain decoding, `k + 1` is the
    /// step that verifies `k` draft tokens (the speculative-decoding cost curve).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    tokens_per_seq: Vec<usize>,
    /// Tokens already in each sequence's cache when decode is timed.
    #[arg(long, default_value_t = 128)]
    pub context: usize,
    /// Prefill prompt lengths (one sequence, one step each; 0: none).
    #[arg(long, value_delimiter = ',', default_value = "128,512")]
    prompt: Vec<usize>,
    /// Repetitions per measurement; the median is reported.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub reps: usize,
    /// Also print time per op kind for one decode step and one prefill.
    #[arg(long)]
    pub profile: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Time the products in the faster order that a server without prefix caching uses
    /// (`--no-enable-prefix-caching`), not the batch-invariant one.
    #[arg(long)]
    batch_variant: bool,
}

#[derive(Serialize, Clone)]
pub(super) struct Roofs {
    read_gbs: f64,
    fma_gflops: f64,
}

#[derive(Serialize)]
pub(super) struct DecodeRow {
    batch: usize,
    /// Tokens each sequence appends per step (1: plain decode; more: a verify step).
    tokens_per_seq: usize,
    context: usize,
    ms_per_step: f64,
    tokens_per_s: f64,
    /// Weight and cache bytes one step reads.
    bytes_per_step: u64,
    bytes_per_token: f64,
    gbs: f64,
    /// Medians of the roofs measured right before each repetition; the percentages are
    /// medians of each repetition against its own roofs.
    pub roofs: Roofs,
    pct_of_bandwidth: f64,
    gflops: f64,
    pct_of_fma: f64,
    /// "bandwidth" or "fma": whichever roof gives the longer lower bound for the step.
    binding_roof: &'static str,
    pct_of_binding_roof: f64,
    /// Under `mpirun`: rank 0's collectives per step.
    collectives: Option<CollectivesRow>,
}

/// Rank 0's collectives per step (see `CollectiveStats`): their time includes waiting
/// for the slowest rank.
#[derive(Serialize)]
struct CollectivesRow {
    ms_per_step: f64,
    calls_per_step: f64,
    kb_per_step: f64,
}

impl CollectivesRow {
    /// The collectives between two snapshots, over `steps` steps.
    fn between(before: Option<CollectiveStats>, steps: usize) -> Option<Self> {
        let (before, now) = (before?, ranks::world()?.stats());
        let d = now.since(&before);
        let n = steps.max(1) as f64;
        Some(Self {
            ms_per_step: d.seconds * 1e3 / n,
            calls_per_step: d.calls as f64 / n,
            kb_per_step: d.bytes as f64 / 1e3 / n,
        })
    }

    fn print(row: &Option<Self>) {
        if let Some(r) = row {
            println!(
                "       rank 0 in collectives: {:.2} ms/step ({:.0} calls, {:.1} KB)",
                r.ms_per_step, r.calls_per_step, r.kb_per_step
            );
        }
    }
}

fn collective_stats() -> Option<CollectiveStats> {
    ranks::world().map(|w| w.stats())
}

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
    collectives: Option<CollectivesRow>,
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn roofs(threads: usize) -> Roofs {
    Roofs {
        read_gbs: read_bandwidth(256 << 20, threads, 5),
        fma_gflops: fma_peak(threads, 5),
    }
}

/// A quick reading of both roofs, taken right before each timed repetition: on a shared
/// machine they drift from one minute to the next, so every repetition is set against the
/// roofs of its own moment.
pub(super) fn quick_roofs(threads: usize) -> Roofs {
    Roofs {
        read_gbs: read_bandwidth(256 << 20, threads, 2),
        fma_gflops: fma_peak(threads, 1),
    }
}

/// Deterministic token ids spread over the vocabulary.
pub(super) fn tokens(n: usize, vocab: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729 + 13) % vocab) as u32)
        .collect()
}

/// The model and its cache, driven directly (no scheduler).
pub(super) struct Bench {
    pub runner: ModelRunner,
    pub cache: CacheManager,
}

impl Bench {
    /// Feeds `ids` to a fresh sequence in chunks of `chunk` tokens.
    pub fn prefill(&mut self, seq: SeqId, ids: &[u32], chunk: usize) -> Result<()> {
        self.cache.ensure_capacity(seq, ids.len())?;
        for (i, part) in ids.chunks(chunk.max(1)).enumerate() {
            let start = i * chunk.max(1);
            let work = SeqWork {
                seq,
                start,
                tokens: part,
                num_logits: 1,
                history: &ids[..start],
            };
            self.runner.step(&mut self.cache, &[work])?;
        }
        Ok(())
    }
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
    let comm = collective_stats();
    for _ in 0..reps {
        let roofs = quick_roofs(threads);
        timed.push((step(bench)?.0, roofs));
    }
    let mut row = summarize(b, t, args.context, &counters, &timed);
    row.collectives = CollectivesRow::between(comm, reps);
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

/// A decode row from one step's counters and each repetition's time with the roofs
/// measured right before it.
pub(super) fn summarize(
    b: usize,
    t: usize,
    context: usize,
    counters: &Snapshot,
    timed: &[(f64, Roofs)],
) -> DecodeRow {
    let bytes = counters.weight_bytes + counters.cache_bytes;
    let flops = counters.flops as f64;
    let lower_bounds = |r: &Roofs| {
        (
            bytes as f64 / (r.read_gbs * 1e9),
            flops / (r.fma_gflops * 1e9),
        )
    };
    let each = |f: &dyn Fn(f64, f64, f64) -> f64| -> f64 {
        median(
            timed
                .iter()
                .map(|(secs, r)| {
                    let (t_bw, t_fma) = lower_bounds(r);
                    f(t_bw, t_fma, *secs)
                })
                .collect(),
        )
    };
    let secs = median(timed.iter().map(|x| x.0).collect());
    let roofs = Roofs {
        read_gbs: median(timed.iter().map(|x| x.1.read_gbs).collect()),
        fma_gflops: median(timed.iter().map(|x| x.1.fma_gflops).collect()),
    };
    let (t_bw, t_fma) = lower_bounds(&roofs);
    DecodeRow {
        batch: b,
        tokens_per_seq: t,
        context,
        ms_per_step: secs * 1e3,
        tokens_per_s: (b * t) as f64 / secs,
        bytes_per_step: bytes,
        bytes_per_token: bytes as f64 / (b * t) as f64,
        gbs: bytes as f64 / secs / 1e9,
        roofs,
        pct_of_bandwidth: each(&|bw, _, s| 100.0 * bw / s),
        gflops: flops / secs / 1e9,
        pct_of_fma: each(&|_, fma, s| 100.0 * fma / s),
        binding_roof: if t_bw >= t_fma { "bandwidth" } else { "fma" },
        pct_of_binding_roof: each(&|bw, fma, s| 100.0 * bw.max(fma) / s),
        collectives: None,
    }
}

pub(super) fn print_decode_row(row: &DecodeRow) {
    println!(
        "{:>6} {:>7} {:>8} {:>9.2} {:>9.2} {:>11.1} {:>8.1} {:>7.1}% {:>9.1} {:>7.1}% {:>8.1}% {}",
        row.batch,
        row.tokens_per_seq,
        row.context,
        row.ms_per_step,
        row.tokens_per_s,
        row.bytes_per_token / 1e6,
        row.gbs,
        row.pct_of_bandwidth,
        row.gflops,
        row.pct_of_fma,
        row.pct_of_binding_roof,
        row.binding_roof
    );
}

/// Prints one step's time per op kind (it must have run with profiling on), and for the
/// matrix products the bytes and FLOPs they did against the roofs.
pub(super) fn print_profile(title: &str, d: &Snapshot, steps: usize, roofs: &Roofs) {
    let total: u64 = d.time_ns.iter().sum();
    println!("{title} — time per op kind (per step, profiled run)");
    println!(
        "  {:<14} {:>10} {:>7} {:>8} {:>9} {:>7} {:>6} {:>8} {:>6}",
        "op", "ms", "share", "calls", "MB", "GB/s", "% BW", "GFLOP/s", "% FMA"
    );
    for op in Op::ALL {
        let (ns, calls) = (d.time_ns[op as usize], d.calls[op as usize]);
        if calls == 0 {
            continue;
        }
        let (bytes, flops) = (d.op_bytes[op as usize], d.op_flops[op as usize]);
        let traffic = if bytes > 0 {
            let secs = ns as f64 / 1e9;
            let (gbs, gflops) = (bytes as f64 / secs / 1e9, flops as f64 / secs / 1e9);
            format!(
                " {:>9.1} {:>7.1} {:>5.0}% {:>8.1} {:>5.0}%",
                bytes as f64 / 1e6 / steps as f64,
                gbs,
                100.0 * gbs / roofs.read_gbs,
                gflops,
                100.0 * gflops / roofs.fma_gflops
            )
        } else {
            String::new()
        };
        println!(
            "  {:<14} {:>10.3} {:>6.1}% {:>8}{traffic}",
            op.name(),
            ns as f64 / 1e6 / steps as f64,
            100.0 * ns as f64 / total.max(1) as f64,
            calls / steps as u64
        );
    }
    println!(
        "  {:<14} {:>10.3}",
        "total",
        total as f64 / 1e6 / steps as f64
    );
    // What the parallel passes cost beyond their work: every call above is at most one.
    let calls: u64 = d.calls.iter().sum::<u64>() / steps as u64;
    let threads = rayon::current_num_threads();
    let us = deepinfer_model::kernels::awake::with_workers_awake(|| {
        deepinfer_model::kernels::linear::pass_cost(2 * threads, 5.0, 1000)
    });
    println!(
        "  hand-offs: at most {calls} parallel passes × {us:.2} µs (a pass's cost beyond its work in this pool) = {:.3} ms",
        calls as f64 * us / 1e3
    );
}

/// Runs inside a compute pool, as the engine does (the parallel loops start from a worker).
pub fn run(args: ModelArgs) -> Result<()> {
    args.load.threads.install()?;
    deepinfer_engine::engine::compute_pool()?.install(|| bench(args))
}

fn bench(args: ModelArgs) -> Result<()> {
    let threads = rayon::current_num_threads();
    let budget = args.load.budget_beside(args.cache_budget_mib << 20);
    let dir = args.load.resolve(&args.model)?;
    if ranks::world().is_some_and(|w| w.rank() != 0) {
        // The other ranks serve their part inside `load` and end there; they must not
        // probe the roofs while rank 0 does.
        args.load.load(&dir, budget, |_, _| {})?;
    }
    // Before the weights: the bandwidth probe's buffer is not then counted on top of them.
    let r0 = roofs(threads);
    let t = Instant::now();
    let mut model = args.load.load(&dir, budget, |_, _| {})?;
    eprintln!(
        "loaded {} in {:.1} s",
        args.model.display(),
        t.elapsed().as_secs_f64()
    );
    model.set_batch_invariant(!args.batch_variant);
    let vocab = model.config.vocab_size;
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
    let mut bench = Bench {
        cache,
        runner: ModelRunner::new(model),
    };
    let reps = args.reps.max(1);
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
            streamed_rows.push(streamed::decode_run(&mut bench, store, &args, b, threads)?);
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
            let row = decode_row(&mut bench, &args, b, t.max(1), threads)?;
            print_decode_row(&row);
            CollectivesRow::print(&row.collectives);
            decode.push(row);
        }
    }
    let dspark = match store {
        None => super::drafter::dspark_row(&mut bench, &args, threads)?,
        Some(_) => None,
    };

    let mut prefill_rows = Vec::new();
    println!();
    println!(
        "{:>8} {:>10} {:>10} {:>9} {:>7} {:>15} {:>8}",
        "prompt", "ms", "tok/s", "GFLOP/s", "% FMA", "matmul GFLOP/s", "% FMA"
    );
    for &p in args.prompt.iter().filter(|&&p| p > 0) {
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
        let (_, counters) = once(&mut bench)?;
        let (mut times, mut pct, mut fmas) = (vec![], vec![], vec![]);
        let comm = collective_stats();
        for _ in 0..reps {
            let peak = fma_peak(threads, 1);
            let (secs, _) = once(&mut bench)?;
            times.push(secs);
            pct.push(100.0 * counters.flops as f64 / secs / 1e9 / peak);
            fmas.push(peak);
        }
        let collectives = CollectivesRow::between(comm, reps);
        let secs = median(times);
        let peak = median(fmas);
        // One profiled repetition for the matrix products' own share of the time.
        profile::set_enabled(true);
        let (_, prof) = once(&mut bench)?;
        profile::set_enabled(false);
        let mm_ns: u64 = [Op::MatmulF32, Op::MatmulBf16, Op::MatmulFp8, Op::MatmulFp4]
            .iter()
            .map(|&o| prof.time_ns[o as usize])
            .sum();
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
        if args.profile && p == args.prompt[args.prompt.len() - 1] {
            let roofs = Roofs {
                fma_gflops: peak,
                ..r0.clone()
            };
            print_profile(&format!("prefill, {p} tokens"), &prof, 1, &roofs);
        }
        prefill_rows.push(row);
    }
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
