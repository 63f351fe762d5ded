//! What a forward pass spends, by kind of work.
//!
//! Two sets of process-wide counters:
//! * **traffic**, always on (one relaxed atomic add per matrix product): weight bytes read
//!   and FLOPs done, from which benchmarks compute the share of the memory or FMA roof;
//! * **time per op kind**, only with `DEEPINFER_PROFILE=1` (it reads the clock around every
//!   op), printed by `deepinfer bench model` as a per-step table like an op census.
//!
//! Op kinds are disjoint: matrix products are timed by weight format, the rest of the
//! model's work in its own kinds, each scope net of the scopes inside it, so the column
//! adds up to the step.

use deepinfer_kernels::linear::Matmul;
use deepinfer_kernels::matrix::{Format, QMatrix};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Instant;

/// A kind of work in the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    MatmulF32,
    MatmulBf16,
    MatmulFp8,
    MatmulFp4,
    /// Products on llama.cpp's block formats (GGUF files).
    MatmulGgml,
    /// Scores, softmax with the sink and the weighted sum over window and compressed keys.
    Attention,
    /// The lightning indexer's scoring and top-k.
    Indexer,
    /// Compressor pooling, norm and rope of new entries, and cache writes.
    Compressor,
    /// mHC: stream mixing weights, Sinkhorn, collapse and write-back.
    Hyper,
    /// RMS norms, rope and the q/kv post-processing around the projections.
    NormRope,
    /// Router scores, top-k, and the expert activation between the two products.
    Moe,
    /// Embedding lookup, head collapse, gathering rows.
    Other,
}

impl Op {
    pub const ALL: [Op; 12] = [
        Op::MatmulF32,
        Op::MatmulBf16,
        Op::MatmulFp8,
        Op::MatmulFp4,
        Op::MatmulGgml,
        Op::Attention,
        Op::Indexer,
        Op::Compressor,
        Op::Hyper,
        Op::NormRope,
        Op::Moe,
        Op::Other,
    ];

    /// The matrix products' kinds, one per stored format.
    pub const MATMULS: [Op; 5] = [
        Op::MatmulF32,
        Op::MatmulBf16,
        Op::MatmulFp8,
        Op::MatmulFp4,
        Op::MatmulGgml,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::MatmulF32 => "matmul f32",
            Op::MatmulBf16 => "matmul bf16",
            Op::MatmulFp8 => "matmul fp8",
            Op::MatmulFp4 => "matmul fp4",
            Op::MatmulGgml => "matmul ggml",
            Op::Attention => "attention",
            Op::Indexer => "indexer",
            Op::Compressor => "compressor",
            Op::Hyper => "mHC",
            Op::NormRope => "norm + rope",
            Op::Moe => "moe routing",
            Op::Other => "other",
        }
    }

    fn matmul(f: Format) -> Op {
        match f {
            Format::F32 => Op::MatmulF32,
            Format::Bf16 => Op::MatmulBf16,
            Format::Fp8 => Op::MatmulFp8,
            Format::Fp4 => Op::MatmulFp4,
            Format::Ggml(_) => Op::MatmulGgml,
        }
    }
}

const N: usize = Op::ALL.len();

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
static TIME_NS: [AtomicU64; N] = [ZERO; N];
static CALLS: [AtomicU64; N] = [ZERO; N];
/// Weight bytes and FLOPs of the matrix products, by op kind (the others stay zero).
static OP_BYTES: [AtomicU64; N] = [ZERO; N];
static OP_FLOPS: [AtomicU64; N] = [ZERO; N];
static WEIGHT_BYTES: AtomicU64 = AtomicU64::new(0);
static CACHE_BYTES: AtomicU64 = AtomicU64::new(0);
static FLOPS: AtomicU64 = AtomicU64::new(0);

static FORCED: AtomicBool = AtomicBool::new(false);

/// Whether op timing is on: `DEEPINFER_PROFILE` set (to anything but `0`), or
/// [`set_enabled`] by a benchmark that wants the table for one pass.
pub fn enabled() -> bool {
    static ENV: OnceLock<bool> = OnceLock::new();
    FORCED.load(Relaxed)
        || *ENV.get_or_init(|| {
            std::env::var("DEEPINFER_PROFILE").is_ok_and(|v| v != "0" && !v.is_empty())
        })
}

/// Turns op timing on or off for the whole process (on top of `DEEPINFER_PROFILE`).
pub fn set_enabled(on: bool) {
    FORCED.store(on, Relaxed);
}

thread_local! {
    /// Time of the scopes that ended on this thread so far: an enclosing scope subtracts its
    /// children's share, so every nanosecond is counted under exactly one op.
    static CHILD_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Times the enclosing block as `op` when profiling (drop ends it), minus the scopes
/// nested in it on the same thread. Parallel tasks open no scopes: the scope around the
/// parallel loop counts its wall time.
pub struct Scope {
    op: Op,
    start: Option<(Instant, u64)>,
}

pub fn scope(op: Op) -> Scope {
    Scope {
        op,
        start: enabled().then(|| (Instant::now(), CHILD_NS.get())),
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if let Some((t, child0)) = self.start {
            let total = t.elapsed().as_nanos() as u64;
            let nested = CHILD_NS.get() - child0;
            add_time(self.op, total.saturating_sub(nested));
            CHILD_NS.set(child0 + total);
        }
    }
}

fn add_time(op: Op, ns: u64) {
    TIME_NS[op as usize].fetch_add(ns, Relaxed);
    CALLS[op as usize].fetch_add(1, Relaxed);
}

/// Counts reads of cached state (attention's keys, the indexer's keys): a decode step's
/// other stream from memory.
pub fn cache_read(bytes: usize) {
    CACHE_BYTES.fetch_add(bytes as u64, Relaxed);
}

/// Counts weight bytes read outside the matrix products (embedding rows).
pub fn weight_read(bytes: usize) {
    WEIGHT_BYTES.fetch_add(bytes as u64, Relaxed);
}

fn weight_bytes(w: &QMatrix, rows: usize) -> u64 {
    (w.stored_bytes() as u64 * rows as u64)
        .checked_div(w.rows as u64)
        .unwrap_or(0)
}

/// `y = x · Wᵀ`, counted.
pub fn matmul(w: &QMatrix, x: &[f32], m: usize, y: &mut [f32]) {
    matmuls(&mut [Matmul::new(w, x, m, y)]);
}

/// Several products in one parallel pass, counted; with profiling on, the pass's time is
/// shared among the jobs' formats by the weight bytes each reads.
pub fn matmuls(jobs: &mut [Matmul<'_>]) {
    // Indexed by the matmul ops, which come first in `Op::ALL`.
    let mut bytes = [0u64; Op::MatmulGgml as usize + 1];
    for j in jobs.iter() {
        let b = weight_bytes(j.w, j.rows.len());
        let flops = 2 * (j.m * j.rows.len() * j.w.cols) as u64;
        let op = Op::matmul(j.w.format()) as usize;
        bytes[op] += b;
        WEIGHT_BYTES.fetch_add(b, Relaxed);
        FLOPS.fetch_add(flops, Relaxed);
        OP_BYTES[op].fetch_add(b, Relaxed);
        OP_FLOPS[op].fetch_add(flops, Relaxed);
    }
    let start = enabled().then(|| (Instant::now(), CHILD_NS.get()));
    deepinfer_kernels::linear::matmuls(jobs);
    if let Some((t, child0)) = start {
        let ns = t.elapsed().as_nanos() as u64;
        let total: u64 = bytes.iter().sum::<u64>().max(1);
        for (i, &b) in bytes.iter().enumerate() {
            if b > 0 {
                add_time(Op::ALL[i], ns * b / total);
            }
        }
        CHILD_NS.set(child0 + ns);
    }
}

/// A reading of every counter.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub time_ns: [u64; N],
    pub calls: [u64; N],
    /// Weight bytes and FLOPs per op kind (matrix products only).
    pub op_bytes: [u64; N],
    pub op_flops: [u64; N],
    pub weight_bytes: u64,
    pub cache_bytes: u64,
    pub flops: u64,
}

impl Snapshot {
    pub fn now() -> Self {
        Self {
            time_ns: std::array::from_fn(|i| TIME_NS[i].load(Relaxed)),
            calls: std::array::from_fn(|i| CALLS[i].load(Relaxed)),
            op_bytes: std::array::from_fn(|i| OP_BYTES[i].load(Relaxed)),
            op_flops: std::array::from_fn(|i| OP_FLOPS[i].load(Relaxed)),
            weight_bytes: WEIGHT_BYTES.load(Relaxed),
            cache_bytes: CACHE_BYTES.load(Relaxed),
            flops: FLOPS.load(Relaxed),
        }
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            time_ns: std::array::from_fn(|i| self.time_ns[i] - earlier.time_ns[i]),
            calls: std::array::from_fn(|i| self.calls[i] - earlier.calls[i]),
            op_bytes: std::array::from_fn(|i| self.op_bytes[i] - earlier.op_bytes[i]),
            op_flops: std::array::from_fn(|i| self.op_flops[i] - earlier.op_flops[i]),
            weight_bytes: self.weight_bytes - earlier.weight_bytes,
            cache_bytes: self.cache_bytes - earlier.cache_bytes,
            flops: self.flops - earlier.flops,
        }
    }
}
