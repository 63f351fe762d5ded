//! `y = x · Wᵀ` for a weight `W: [n, k]` in its stored format ([`QMatrix`]) and activations
//! `x: [m, k]` in f32.
//!
//! Decode (small `m`) is bound by how fast the weight bytes stream in, so every kernel reads
//! each weight once per call whatever `m` is: weight rows are decoded in registers and used
//! for a group of up to four activation rows, groups loop with the rows still in L1, and
//! activation blocks loop outermost with the tile's rows in L2 (which is also what makes
//! prefill-sized `m` compute-bound rather than memory-bound).
//!
//! Work is split into tiles of weight rows, over all the products of one call
//! ([`matmuls`]): a layer's independent projections (q and kv, gate and up, every selected
//! expert) share one parallel pass instead of paying for a fork-join each.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod prepare;
mod scalar;
#[cfg(test)]
mod tests;

use crate::cpu::{isa, Isa};
use crate::matrix::{Format, QMatrix};
use rayon::prelude::*;
use std::cell::RefCell;
use std::ops::Range;

/// Multiply-adds below which a call runs on the calling thread: a fork-join costs a few
/// microseconds, about what two cores gain on this much work.
const SERIAL_WORK: usize = 1 << 18;

/// Dot product with eight independent partial sums, so the compiler can vectorise it and
/// the rounding error grows like a tree rather than a chain. Plain multiply-add, not
/// `mul_add`: without a compile-time FMA target that becomes a libm call per element.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0.0f32;
    for i in chunks * 8..a.len() {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// One product: `y[i, j] = Σ_t x[i, t] · W[rows.start + j, t]`, `x: [m, k]`,
/// `y: [m, rows.len()]`.
pub struct Matmul<'a> {
    pub w: &'a QMatrix,
    /// The weight rows used (a block of a block-diagonal projection, or all of them).
    pub rows: Range<usize>,
    pub x: &'a [f32],
    pub m: usize,
    pub y: &'a mut [f32],
}

impl<'a> Matmul<'a> {
    /// All rows of `w`.
    pub fn new(w: &'a QMatrix, x: &'a [f32], m: usize, y: &'a mut [f32]) -> Self {
        Self {
            rows: 0..w.rows,
            w,
            x,
            m,
            y,
        }
    }
}

/// `y = x · Wᵀ` (see [`Matmul`]).
pub fn matmul(w: &QMatrix, x: &[f32], m: usize, y: &mut [f32]) {
    matmuls(&mut [Matmul::new(w, x, m, y)]);
}

/// One product as the tiles see it: raw pointers, because the plans are kept in reusable
/// thread-local storage (no allocation per call) and tiles write disjoint outputs in
/// parallel.
pub(crate) struct Plan {
    w: *const QMatrix,
    /// Row 0 of the activations as the kernels read them (permuted for the fast path).
    x: *const f32,
    k: usize,
    m: usize,
    y: *mut f32,
    row0: usize,
    n: usize,
    tile_rows: usize,
    /// Tiles of the plans before this one: tile `t` of a call belongs to the last plan whose
    /// `tiles_before <= t`.
    tiles_before: usize,
    fast: bool,
}

// SAFETY: a plan only lives during the `matmuls` call that built it, while every pointer it
// holds is borrowed from that call's arguments; tiles write disjoint parts of `y`.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

impl Plan {
    fn w(&self) -> &QMatrix {
        // SAFETY: borrowed from the call's jobs for its duration.
        unsafe { &*self.w }
    }

    fn x_row(&self, i: usize) -> &[f32] {
        debug_assert!(i < self.m);
        // SAFETY: `x` holds `m · k` floats for the call's duration.
        unsafe { std::slice::from_raw_parts(self.x.add(i * self.k), self.k) }
    }

    fn tiles(&self) -> usize {
        self.n.div_ceil(self.tile_rows)
    }

    /// Writes `out[r][t]` into `y[g0 + t, row]` for the rows `rows` and `mg` activation rows.
    ///
    /// # Safety
    /// Only the tile owning `rows` may call this, and `g0 + mg <= m`.
    unsafe fn store(&self, g0: usize, mg: usize, rows: Range<usize>, out: &[[f32; 4]; 2]) {
        for (ri, row) in rows.enumerate() {
            for (t, &v) in out[ri].iter().enumerate().take(mg) {
                // SAFETY: (g0 + t, row - row0) is inside `y: [m, n]`, owned by this tile.
                unsafe { *self.y.add((g0 + t) * self.n + row - self.row0) = v };
            }
        }
    }

    /// Runs tile `t` (counted within this plan).
    fn run_tile(&self, t: usize, isa: Isa) {
        let r0 = self.row0 + t * self.tile_rows;
        let rows = r0..(r0 + self.tile_rows).min(self.row0 + self.n);
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 if self.fast => {
                // SAFETY: `Isa::Avx2` is only chosen when the CPU has AVX2 and FMA; the plan
                // is valid for the call and tile `t` is run once.
                unsafe { avx2::tile(self, rows) }
            }
            _ => scalar::tile(self, rows),
        }
    }
}

#[derive(Default)]
struct CallScratch {
    prepared: Vec<f32>,
    plans: Vec<Plan>,
}

thread_local! {
    static CALL: RefCell<CallScratch> = RefCell::default();
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's tile scratch, at least `len` floats (grown once, then reused).
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    TILE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < len {
                v.resize(len, 0.0);
            }
            f(&mut v[..len])
        }
        // Only if a tile ever ran inside another tile on this thread.
        Err(_) => f(&mut vec![0.0; len]),
    })
}

/// Whether `w` can use the fused kernels: the scales keep the rescaled products in range,
/// FP8 blocks are whole 32-chunks wide and FP4 groups are powers of two of at least 32.
fn fast_path(w: &QMatrix) -> bool {
    use crate::matrix::Data;
    w.fast_ok
        && match &w.data {
            Data::Fp8 { bc, .. } => bc % 32 == 0 || w.cols <= *bc,
            Data::Fp4 { group, .. } => group.is_power_of_two() && *group >= 32,
            Data::F32(_) | Data::Bf16(_) => true,
        }
}

/// Weight rows per tile: about 64, a whole number of FP8 row blocks.
fn tile_rows(w: &QMatrix) -> usize {
    match &w.data {
        crate::matrix::Data::Fp8 { br, .. } => br * 64usize.div_ceil(*br),
        _ => 64,
    }
}

/// Runs every product of `jobs`; the tiles of all of them form one parallel pass.
pub fn matmuls(jobs: &mut [Matmul<'_>]) {
    matmuls_on(jobs, isa())
}

/// [`matmuls`] on a given kernel family (tests compare the two).
pub(crate) fn matmuls_on(jobs: &mut [Matmul<'_>], isa: Isa) {
    for j in jobs.iter() {
        let k = j.w.cols;
        assert!(
            j.rows.start <= j.rows.end && j.rows.end <= j.w.rows,
            "matmul: rows {:?} of a {}-row matrix",
            j.rows,
            j.w.rows
        );
        assert_eq!(j.x.len(), j.m * k, "matmul: x is not [m, {k}]");
        assert_eq!(j.y.len(), j.m * j.rows.len(), "matmul: y is not [m, rows]");
    }
    let mut run = |s: &mut CallScratch| {
        plan(jobs, isa, s);
        let total: usize = s.plans.last().map_or(0, |p| p.tiles_before + p.tiles());
        let work: usize = jobs.iter().map(|j| j.m * j.rows.len() * j.w.cols).sum();
        let plans = &s.plans;
        let one = |t: usize| {
            let p = plans.partition_point(|p| p.tiles_before <= t) - 1;
            plans[p].run_tile(t - plans[p].tiles_before, isa);
        };
        if work < SERIAL_WORK || total == 1 {
            (0..total).for_each(one);
        } else {
            (0..total).into_par_iter().for_each(one);
        }
    };
    CALL.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => run(&mut s),
        Err(_) => run(&mut CallScratch::default()),
    })
}

/// Fills `s` with the plans of `jobs`, permuting activations for the fused kernels.
fn plan(jobs: &mut [Matmul<'_>], isa: Isa, s: &mut CallScratch) {
    s.plans.clear();
    let needs_prep =
        |j: &Matmul| isa == Isa::Avx2 && fast_path(j.w) && j.w.format() != Format::F32 && j.m > 0;
    let prep_len: usize = jobs
        .iter()
        .filter(|j| needs_prep(j))
        .map(|j| j.m * j.w.cols)
        .sum();
    if s.prepared.len() < prep_len {
        s.prepared.resize(prep_len, 0.0);
    }
    let mut offset = 0;
    let mut tiles_before = 0;
    for j in jobs.iter_mut() {
        let k = j.w.cols;
        let x = if needs_prep(j) {
            let format = j.w.format();
            // FP4 activations carry 2^30 (see the kernel); FP8 ones get their scales per block.
            let mult = if format == Format::Fp4 {
                2f32.powi(30)
            } else {
                1.0
            };
            let dst = &mut s.prepared[offset..offset + j.m * k];
            for (src, out) in
                j.x.chunks_exact(k.max(1))
                    .zip(dst.chunks_exact_mut(k.max(1)))
            {
                prepare::permute_row(format, src, out, mult);
            }
            offset += j.m * k;
            dst.as_ptr()
        } else {
            j.x.as_ptr()
        };
        let p = Plan {
            w: j.w,
            x,
            k,
            m: j.m,
            y: j.y.as_mut_ptr(),
            row0: j.rows.start,
            n: j.rows.len(),
            tile_rows: tile_rows(j.w),
            tiles_before,
            fast: isa == Isa::Avx2 && fast_path(j.w),
        };
        if j.m > 0 && p.tiles() > 0 {
            tiles_before += p.tiles();
            s.plans.push(p);
        }
    }
}
