//! What the model benchmarks share: their arguments, the roofs read beside every timing,
//! the model and cache driven directly, and how a decode row is summarised and printed.

use crate::load_args::LoadArgs;
use crate::ranks;
use anyhow::Result;
use clap::Args;
use deepinfer_engine::cache::{CacheManager, SeqId};
use deepinfer_engine::runner::{ModelRunner, SeqWork};
use deepinfer_model::kernels::roofline::{fma_peak, read_bandwidth};
use deepinfer_model::parallel::CollectiveStats;
use deepinfer_model::profile::{Op, Snapshot};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ModelArgs {
    #[command(flatten)]
    pub(super) load: LoadArgs,
    /// Memory for the cache pools, in MiB.
    #[arg(long, default_value_t = 2048)]
    pub(super) cache_budget_mib: usize,
    /// Decode steps per row when the experts stream from disk (each step fresh tokens).
    #[arg(long, default_value_t = 32)]
    pub(super) steps: usize,
    /// Checkpoint directory.
    #[arg(long)]
    pub(super) model: PathBuf,
    /// Decode batch sizes (sequences stepping together, one token each).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub(super) batch: Vec<usize>,
    /// Tokens each sequence appends per decode step: 1 is plain decoding, `k + 1` is the
    /// step that verifies `k` draft tokens (the speculative-decoding cost curve).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub(super) tokens_per_seq: Vec<usize>,
    /// Tokens already in each sequence's cache when decode is timed.
    #[arg(long, default_value_t = 128)]
    pub(super) context: usize,
    /// Prefill prompt lengths (one sequence, one step each; 0: none).
    #[arg(long, value_delimiter = ',', default_value = "128,512")]
    pub(super) prompt: Vec<usize>,
    /// Repetitions per measurement; the median is reported.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub(super) reps: usize,
    /// Also print time per op kind for one decode step and one prefill.
    #[arg(long)]
    pub(super) profile: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
    /// Time the products in the faster order that a server without prefix caching uses
    /// (`--no-enable-prefix-caching`), not the batch-invariant one.
    #[arg(long)]
    pub(super) batch_variant: bool,
}

#[derive(Serialize, Clone)]
pub(super) struct Roofs {
    pub(super) read_gbs: f64,
    pub(super) fma_gflops: f64,
}

#[derive(Serialize)]
pub(super) struct DecodeRow {
    pub(super) batch: usize,
    /// Tokens each sequence appends per step (1: plain decode; more: a verify step).
    pub(super) tokens_per_seq: usize,
    pub(super) context: usize,
    pub(super) ms_per_step: f64,
    pub(super) tokens_per_s: f64,
    /// Weight and cache bytes one step reads.
    pub(super) bytes_per_step: u64,
    pub(super) bytes_per_token: f64,
    pub(super) gbs: f64,
    /// Medians of the roofs measured right before each repetition; the percentages are
    /// medians of each repetition against its own roofs.
    pub roofs: Roofs,
    pub(super) pct_of_bandwidth: f64,
    pub(super) gflops: f64,
    pub(super) pct_of_fma: f64,
    /// "bandwidth" or "fma": whichever roof gives the longer lower bound for the step.
    pub(super) binding_roof: &'static str,
    pub(super) pct_of_binding_roof: f64,
    /// Under `mpirun`: rank 0's collectives per step, along each axis of the split.
    pub(super) collectives: Vec<CollectivesRow>,
}

/// Rank 0's collectives per step along one axis (see `CollectiveStats`): their time
/// includes waiting for the slowest rank.
#[derive(Serialize)]
pub(super) struct CollectivesRow {
    axis: &'static str,
    pub(super) ms_per_step: f64,
    calls_per_step: f64,
    kb_per_step: f64,
    /// The same per layer of the model (every exchange of a split model is per layer, but
    /// for the head's and a split step's plan).
    ms_per_layer: f64,
    kb_per_layer: f64,
}

/// Each axis's collectives so far ([`CollectivesRow::between`] takes the difference).
pub(super) struct CollectiveSnapshot(Vec<CollectiveStats>);

impl CollectiveSnapshot {
    pub(super) fn now() -> Self {
        Self(ranks::axes().iter().map(|a| a.comm.stats()).collect())
    }
}

impl CollectivesRow {
    /// Each axis's collectives since `before`, over `steps` steps of a model of `layers`.
    pub(super) fn between(before: &CollectiveSnapshot, steps: usize, layers: usize) -> Vec<Self> {
        let n = steps.max(1) as f64;
        let per_layer = n * layers.max(1) as f64;
        ranks::axes()
            .iter()
            .zip(&before.0)
            .map(|(axis, before)| {
                let d = axis.comm.stats().since(before);
                Self {
                    axis: axis.name,
                    ms_per_step: d.seconds * 1e3 / n,
                    calls_per_step: d.calls as f64 / n,
                    kb_per_step: d.bytes as f64 / 1e3 / n,
                    ms_per_layer: d.seconds * 1e3 / per_layer,
                    kb_per_layer: d.bytes as f64 / 1e3 / per_layer,
                }
            })
            .collect()
    }

    pub(super) fn print(rows: &[Self]) {
        for r in rows {
            println!(
                "       rank 0 in {} collectives: {:.2} ms/step ({:.0} calls, {:.1} KB); \
                 {:.2} ms and {:.1} KB a layer",
                r.axis,
                r.ms_per_step,
                r.calls_per_step,
                r.kb_per_step,
                r.ms_per_layer,
                r.kb_per_layer
            );
        }
    }
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(super) fn roofs(threads: usize) -> Roofs {
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
                images: &[],
            };
            self.runner.step(&mut self.cache, &[work])?;
        }
        Ok(())
    }
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
        collectives: Vec::new(),
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
