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

mod aligned;
mod by_node;
pub use by_node::pass_cost;
mod crossover;
mod ggml;
mod planner;
mod prepare;
mod scalar;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86::amx::probe as amx_probe;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86::PREFETCH;

use crate::cpu::{isa, Isa};
use crate::matrix::{Format, QMatrix};
use aligned::AlignedVec;
use rayon::prelude::*;
use std::cell::RefCell;
use std::ops::Range;
use std::sync::OnceLock;

/// Multiply-adds below which a call runs on the calling thread: a fork-join costs a few
/// microseconds, about what two cores gain on this much work.
const SERIAL_WORK: usize = 1 << 18;

/// One product: `y[i, j] = Σ_t x[i, t] · W[rows.start + j, t]`, `x: [m, k]`,
/// `y: [m, rows.len()]`.
pub struct Matmul<'a> {
    pub w: &'a QMatrix,
    /// The weight rows used (a block of a block-diagonal projection, or all of them).
    pub rows: Range<usize>,
    pub x: &'a [f32],
    pub m: usize,
    pub y: &'a mut [f32],
    /// What the caller promises of the activations, or asks the product to make of them.
    pub inputs: Inputs,
}

/// A product's activations, as its numerics have them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Inputs {
    /// Any f32 values, multiplied as they are.
    #[default]
    F32,
    /// Every value exact in bf16 (official numerics' FP8-rounded inputs): FP8 and FP4
    /// products may then run on the AMX tiles where they are in use ([`crate::cpu::amx`]),
    /// or on bf16 dot products. A promise broken here costs precision, not safety.
    Bf16Exact,
    /// Quantised by the product first, as llama.cpp's CPU backend does, to the format its
    /// weights' blocks read ([`crate::ggml::Block::vec_dot`]). Products on other formats
    /// take the values as they are.
    VecDot,
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
            inputs: Inputs::F32,
        }
    }

    /// The same product, its activations as `inputs` describes them.
    pub fn with_inputs(self, inputs: Inputs) -> Self {
        Self { inputs, ..self }
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
    /// Row 0 of the activations as the kernels read them (permuted for the fused and
    /// decode-once paths; as given on the GEMM path, which reads `xt`).
    x: *const f32,
    k: usize,
    /// Floats from one activation row to the next.
    ldx: usize,
    /// For the GEMM path: the activations transposed in strips of `xw` columns, the last
    /// one `xw_last` wide, each `[k][width]` (columns past `m` zero), so a micro-kernel
    /// streams one strip; strip `s` starts at `xt + s · xw · k`.
    xt: *const f32,
    xw: usize,
    xw_last: usize,
    /// How the transposition lays the activations out for the kernels: the format, vector
    /// lanes and factor of [`prepare::permute_row`] (none: as they are).
    xt_layout: Option<(Format, usize, f32)>,
    /// Whether this plan fills `xt` (products sharing their activations share one copy).
    xt_owner: bool,
    /// The caller's activations, to find products that share them.
    src: *const f32,
    m: usize,
    y: *mut f32,
    row0: usize,
    n: usize,
    tile_rows: usize,
    /// Tiles per row tile, each multiplying a share of the GEMM path's activation strips: a
    /// matrix of few rows (the mHC mixes have 24) still keeps every core busy on a prefill.
    m_parts: usize,
    /// Tiles of the plans before this one: tile `t` of a call belongs to the last plan whose
    /// `tiles_before <= t`.
    tiles_before: usize,
    /// The kernel family this product runs on (its activations are laid out for it).
    family: Isa,
    /// Whether the GEMM path sums in the fused kernels' streams (batch invariance).
    pub(crate) invariant: bool,
    /// Whether this product runs on AMX tiles, its activations laid out at `pairs` (see
    /// `x86::amx`; filled by the transposition pass, by the plan that owns `xt_owner`).
    amx: bool,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pairs: *const u32,
    /// Whether this product runs the FP4 kernels on bf16 dot products, its activations
    /// packed for them ([`prepare::pack_pairs`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    dots: bool,
    /// The call's kernel family, for the products on ggml blocks (their `family` is the
    /// scalar one: no activation layout, no GEMM path; [`ggml::tile`] picks its kernels).
    call_isa: Isa,
    /// A ggml product's activations quantised to Q8_0, `m` rows (null for other formats,
    /// and for the blocks without integer dots).
    q8: *const crate::ggml::q8::Q8Row,
    /// A K-quant product's activations quantised to Q8_K, `m` rows (null unless the
    /// product quantises its input and its blocks have integer dots).
    q8k: *const crate::ggml::q8k::Q8KRow,
    /// What the caller said of the activations (a copy serves only products told alike).
    inputs: Inputs,
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

    fn ldx(&self) -> usize {
        self.ldx
    }

    /// The transposed activations of the GEMM path, their strip width and the last strip's.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn xt(&self) -> (*const f32, usize, usize) {
        (self.xt, self.xw, self.xw_last)
    }

    fn x_row(&self, i: usize) -> &[f32] {
        debug_assert!(i < self.m);
        // SAFETY: `x` holds `m` rows `ldx` apart, `k` floats each, for the call's duration.
        unsafe { std::slice::from_raw_parts(self.x.add(i * self.ldx), self.k) }
    }

    fn tiles(&self) -> usize {
        self.n.div_ceil(self.tile_rows) * self.m_parts
    }

    /// The GEMM path's activation strips that part `part` of a row tile multiplies.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn strips_of(&self, part: usize) -> Range<usize> {
        let strips = self.m.div_ceil(self.xw);
        let per = strips.div_ceil(self.m_parts);
        (part * per).min(strips)..((part + 1) * per).min(strips)
    }

    /// Writes `out[r][t]` into `y[g0 + t, row]` for the rows `rows` and `mg` activation rows.
    ///
    /// # Safety
    /// Only the tile owning `rows` may call this, and `g0 + mg <= m`.
    unsafe fn store<const R: usize, const M: usize>(
        &self,
        g0: usize,
        mg: usize,
        rows: Range<usize>,
        out: &[[f32; M]; R],
    ) {
        for (ri, row) in rows.enumerate() {
            for (t, &v) in out[ri].iter().enumerate().take(mg) {
                // SAFETY: (g0 + t, row - row0) is inside `y: [m, n]`, owned by this tile.
                unsafe { *self.y.add((g0 + t) * self.n + row - self.row0) = v };
            }
        }
    }

    /// The first weight row of tile `t`.
    fn tile_row0(&self, t: usize) -> usize {
        self.row0 + t % self.n.div_ceil(self.tile_rows) * self.tile_rows
    }

    /// Runs tile `t` (counted within this plan).
    fn run_tile(&self, t: usize) {
        let part = t / self.n.div_ceil(self.tile_rows);
        let r0 = self.tile_row0(t);
        let rows = r0..(r0 + self.tile_rows).min(self.row0 + self.n);
        #[cfg(target_arch = "x86_64")]
        if self.amx {
            // SAFETY: AMX plans are only made where it is available, for matrices it runs,
            // their activations laid out before any tile runs; tile `t` is run once.
            return unsafe { x86::amx::tile(self, rows) };
        }
        if let Format::Ggml(_) = self.w().format() {
            return ggml::tile(self, rows);
        }
        match self.family {
            // SAFETY (both arms): a family is only chosen when the CPU has it; the plan is
            // valid for the call, laid out for that family, and tile `t` is run once.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { x86::tile::<x86::Avx2>(self, rows, part) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { x86::tile::<x86::Avx512>(self, rows, part) },
            _ => scalar::tile(self, rows),
        }
    }
}

#[derive(Default)]
struct CallScratch {
    prepared: AlignedVec,
    transposed: AlignedVec,
    /// The AMX plans' activations (`u32` pairs of bf16, as f32-sized words).
    pairs: AlignedVec,
    /// The ggml products' activations as Q8_0 rows ([`ggml::quantize`]).
    q8: Vec<crate::ggml::q8::Q8Row>,
    /// The K-quant products' activations as Q8_K rows.
    q8k: Vec<crate::ggml::q8k::Q8KRow>,
    /// Copies of activations rounded as their products read them ([`Inputs::VecDot`]).
    rounded: AlignedVec,
    plans: Vec<Plan>,
    queues: by_node::NodeQueues,
}

/// Inner-dimension columns the transposition lays out at a time: a whole number of every
/// kernel layout's chunks.
const T_BLOCK: usize = 128;

impl Plan {
    /// Tasks of the transposition pass this plan needs (none off the GEMM path): one per
    /// strip, which reads its rows front to back and writes its strip in order (a task per
    /// block of columns across all rows instead jumps a page per row, and the TLB misses
    /// made the pass several times slower).
    fn transpose_tasks(&self) -> usize {
        if !self.xt_owner {
            0
        } else if self.amx {
            self.m.div_ceil(16)
        } else {
            self.m.div_ceil(self.xw)
        }
    }

    /// Task `b` of the transposition pass, on whichever path the plan takes.
    fn transpose_task(&self, b: usize) {
        #[cfg(target_arch = "x86_64")]
        if self.amx {
            let len = x86::amx::pairs_len(16, self.k);
            // SAFETY: the plan's pairs buffer holds `m.div_ceil(16)` blocks of `len`; task b
            // alone writes block b; nothing reads it before the pass ends.
            let out =
                unsafe { std::slice::from_raw_parts_mut(self.pairs.cast_mut().add(b * len), len) };
            // SAFETY: `src` is the call's activations, `m` rows of `k`.
            let x = unsafe { std::slice::from_raw_parts(self.src, self.m * self.k) };
            return x86::amx::lay_out_block(self.w().format(), x, (self.m, self.k), b, out);
        }
        self.transpose_strip(b)
    }

    /// Strip `s` of `xt`: `xt[s][kk][i - s · xw] = x'[i][kk]`, `x'` the activations in the
    /// kernels' layout; columns past `m` zeroed.
    fn transpose_strip(&self, s: usize) {
        let (k, xw) = (self.k, self.xw);
        let strips = self.m.div_ceil(xw);
        let width = if s + 1 == strips { self.xw_last } else { xw };
        // SAFETY: the plan's xt buffer holds the strips, k · width floats each; task s alone
        // writes strip s; nothing reads it before the pass ends.
        let t = unsafe {
            std::slice::from_raw_parts_mut(self.xt.cast_mut().add(s * xw * k), k * width)
        };
        let (i0, i1) = (s * xw, (s * xw + width).min(self.m));
        if i1 - i0 < width {
            t.fill(0.0);
        }
        let mut rows = [[0.0f32; T_BLOCK]; 32];
        // With batch invariance the kernels' whole chunks go stream by stream (see
        // `stream_slot`): the streams and the elements they cover.
        let streams = match self.family {
            Isa::Avx512 | Isa::Avx2 if self.invariant => {
                let lanes = if self.family == Isa::Avx512 { 16 } else { 8 };
                let chunk = prepare::chunk(self.w().format(), lanes);
                Some((2 * lanes, k / chunk * chunk))
            }
            _ => None,
        };
        let slot = |kk: usize| streams.map_or(kk, |(s, main)| stream_slot(kk, s, main));
        for k0 in (0..k).step_by(T_BLOCK) {
            let k1 = (k0 + T_BLOCK).min(k);
            // The strip's rows of this block in the kernels' layout (a block is whole
            // chunks but at the row's end), then written out row by row of `t`.
            for (i, row) in (i0..i1).zip(rows.iter_mut()) {
                let (x, row) = (&self.x_row(i)[k0..k1], &mut row[..k1 - k0]);
                match self.xt_layout {
                    Some((format, lanes, mult)) => {
                        prepare::permute_row(format, lanes, x, row, mult)
                    }
                    None => row.copy_from_slice(x),
                }
            }
            for kk in k0..k1 {
                let r = slot(kk);
                for (o, row) in t[r * width..(r + 1) * width]
                    .iter_mut()
                    .zip(&rows[..i1 - i0])
                {
                    *o = row[kk - k0];
                }
            }
        }
    }
}

thread_local! {
    /// Whether this thread's products sum in the batch-invariant order (see
    /// [`set_batch_invariant`]).
    static BATCH_INVARIANT: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
    static CALL: RefCell<CallScratch> = RefCell::default();
    static TILE: RefCell<AlignedVec> = const { RefCell::new(AlignedVec::new()) };
    static TILE2: RefCell<AlignedVec> = const { RefCell::new(AlignedVec::new()) };
    static TILE3: RefCell<AlignedVec> = const { RefCell::new(AlignedVec::new()) };
}

/// Whether products started on this thread give every row the same bits whatever batch it is
/// in (the default), or, off, let the prefill-sized GEMM sum each output in one run (faster;
/// within rounding of the decode path). Set it on every thread of a compute pool (the model
/// does, with `rayon::broadcast`).
pub fn set_batch_invariant(on: bool) {
    BATCH_INVARIANT.with(|c| c.set(on));
}

/// Runs `f` with this thread's tile scratch, at least `len` floats (grown once, then reused).
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    with_cell(&TILE, len, f)
}

/// A second scratch buffer, for code already holding the first.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn with_scratch2<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    with_cell(&TILE2, len, f)
}

/// A third scratch buffer, for code holding the first two.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn with_scratch3<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    with_cell(&TILE3, len, f)
}

/// Grows this thread's tile scratch to at least `floats` each, so later calls up to that
/// size never allocate whichever thread their tiles land on. Run it on every compute thread
/// once (the model does, with `rayon::broadcast`, before its first forward).
pub fn reserve_scratch(floats: usize) {
    for key in [&TILE, &TILE2, &TILE3] {
        key.with(|cell| {
            if let Ok(mut v) = cell.try_borrow_mut() {
                v.grow(floats);
            }
        });
    }
}

fn with_cell<R>(
    key: &'static std::thread::LocalKey<RefCell<AlignedVec>>,
    len: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => {
            v.grow(len);
            f(&mut v[..len])
        }
        // Only if a tile ever ran inside another tile on this thread.
        Err(_) => {
            let mut v = AlignedVec::new();
            v.grow(len);
            f(&mut v[..len])
        }
    })
}

/// What family `isa`'s FP4 kernels need the activations multiplied by: the AVX2 decode
/// (through E4M3) leaves its weights times `2^-30` once scaled.
fn fp4_x_mult(isa: Isa) -> f32 {
    if isa == Isa::Avx2 {
        2f32.powi(30)
    } else {
        1.0
    }
}

/// Whether family `isa` can run `w`: the scales keep the rescaled products in range, FP8
/// blocks are a multiple of 4 wide (so each lane of a decoded chunk lies in one block) and
/// FP4 groups are powers of two of at least 32.
fn runs_on(w: &QMatrix, isa: Isa) -> bool {
    use crate::matrix::Data;
    if isa == Isa::Scalar {
        return true;
    }
    w.fast_ok
        && match &w.data {
            Data::Fp8 { bc, .. } => bc.is_multiple_of(4) || w.cols <= *bc,
            Data::Fp4 { group, .. } => group.is_power_of_two() && *group >= 32,
            Data::F32(_) | Data::Bf16(_) => true,
            Data::Ggml { .. } => false,
        }
}

/// The widest family up to `isa` that runs `w` (V4.1's 32-wide FP8 blocks, say, take the
/// AVX2 kernels on an AVX-512 machine).
///
/// Among the families that can, the one leaving the fewest inputs to the scalar tail
/// (a row shorter than one chunk is all tail: that matrix runs the scalar path).
fn family(w: &QMatrix, isa: Isa) -> Isa {
    let tail = |f: Isa| {
        let lanes = if f == Isa::Avx512 { 16 } else { 8 };
        w.cols % prepare::chunk(w.format(), lanes)
    };
    [Isa::Avx512, Isa::Avx2]
        .into_iter()
        .filter(|&f| f <= isa && runs_on(w, f) && tail(f) < w.cols)
        .min_by_key(|&f| tail(f))
        .unwrap_or(Isa::Scalar)
}

#[cfg(test)]
fn fast_path(w: &QMatrix) -> bool {
    family(w, crate::cpu::detected()) != Isa::Scalar
}

/// Weight rows per tile: about 64 (128 on the GEMM path, so it packs more panels per
/// activation block), a whole number of FP8 row blocks.
fn tile_rows(w: &QMatrix, gemm: bool) -> usize {
    let rows: usize = if gemm { 128 } else { 64 };
    match &w.data {
        crate::matrix::Data::Fp8 { br, .. } => br * rows.div_ceil(*br),
        _ => rows,
    }
}

/// Activation rows from which family `isa` uses its GEMM path (none for the scalar one):
/// 16, 32, 48 or 64, whichever this core runs faster, measured at the first call
/// ([`crossover`]); 16 in this crate's tests, which exercise both paths at fixed sizes.
///
/// Below it the fused kernels decode each weight chunk in registers for a group of
/// activation rows, and a row's result never depends on the rest of the batch; from it on,
/// a tile is decoded once into panels and multiplied against columns of activations, in the
/// fused kernels' order while batch invariance is on ([`set_batch_invariant`]), else in
/// one run per output (within rounding of the former).
pub fn gemm_from(isa: Isa) -> usize {
    static MEASURED: [OnceLock<usize>; 2] = [OnceLock::new(), OnceLock::new()];
    match isa {
        Isa::Scalar => usize::MAX,
        _ if cfg!(test) => 16,
        Isa::Avx2 => *MEASURED[0].get_or_init(|| crossover::measure(isa)),
        Isa::Avx512 => *MEASURED[1].get_or_init(|| crossover::measure(isa)),
    }
}

/// Where the GEMM path's transposed activations put element `q` (kernel order) of a row's
/// first `main` elements: stream by stream (`streams` of them), each stream's elements in
/// order, so the micro-kernel that sums one stream reads its activations (and the weights'
/// panel, packed the same way) front to back. See the x86 GEMM path.
#[inline(always)]
pub(crate) fn stream_slot(q: usize, streams: usize, main: usize) -> usize {
    debug_assert!(streams.is_power_of_two() && main.is_multiple_of(streams));
    if q < main {
        let shift = streams.trailing_zeros();
        (q & (streams - 1)) * (main >> shift) + (q >> shift)
    } else {
        q
    }
}

/// Runs every product of `jobs`; the tiles of all of them form one parallel pass.
pub fn matmuls(jobs: &mut [Matmul<'_>]) {
    matmuls_with(jobs, isa(), crate::cpu::amx(), crate::choice::bf16_dots())
}

/// [`matmuls`] on a given kernel family (tests compare the two).
#[cfg(test)]
pub(crate) fn matmuls_on(jobs: &mut [Matmul<'_>], isa: Isa) {
    matmuls_with(jobs, isa, crate::cpu::amx(), crate::choice::bf16_dots())
}

/// [`matmuls`] on a given kernel family, with or without the AMX tiles (`amx`: they run the
/// products they can; see [`crate::cpu::amx`]) and the bf16 dot products (`dots`, see
/// [`crate::choice::bf16_dots`]).
pub(crate) fn matmuls_with(jobs: &mut [Matmul<'_>], isa: Isa, amx: bool, dots: bool) {
    matmuls_at(jobs, (isa, amx, dots), gemm_from(isa));
}

/// [`matmuls_with`] with the GEMM path from `gemm_from` activation rows on (see
/// [`gemm_from`]; [`crossover`] times both sides).
fn matmuls_at(jobs: &mut [Matmul<'_>], (isa, amx, dots): (Isa, bool, bool), gemm_from: usize) {
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
        planner::plan(jobs, (isa, amx, dots), gemm_from, s);
        let total: usize = s.plans.last().map_or(0, |p| p.tiles_before + p.tiles());
        let work: usize = jobs.iter().map(|j| j.m * j.rows.len() * j.w.cols).sum();
        let plans = &s.plans;
        // The GEMM path's transposed activations, a pass of their own (every tile reads all
        // of them).
        let t_tasks: usize = plans.iter().map(Plan::transpose_tasks).sum();
        if t_tasks > 0 {
            let task = |mut b: usize| {
                for p in plans.iter() {
                    if b < p.transpose_tasks() {
                        return p.transpose_task(b);
                    }
                    b -= p.transpose_tasks();
                }
            };
            (0..t_tasks).into_par_iter().for_each(task);
        }
        let one = |t: usize| {
            let p = plans.partition_point(|p| p.tiles_before <= t) - 1;
            plans[p].run_tile(t - plans[p].tiles_before);
        };
        if work < SERIAL_WORK || total == 1 {
            (0..total).for_each(one);
            return;
        }
        crate::numa::pool::with_home(|home| s.queues.fill(plans, home.map(|(_, sh)| sh)));
        s.queues.run(&one);
    };
    CALL.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => run(&mut s),
        Err(_) => run(&mut CallScratch::default()),
    })
}

/// Floats from one activation row to the next in the fused kernels' copy: rows `k` floats
/// apart with `k` a multiple of 1 024 (as model widths are) would put the same part of
/// every row in the same L1 sets, and the kernels read all of a group's rows at once.
/// Several rows keep every row on a cache line too.
fn x_stride(k: usize, m: usize) -> usize {
    if m > 1 {
        k.next_multiple_of(16) + 16
    } else {
        k
    }
}

/// Whether `j` runs on AMX tiles: they are in use (`amx`, with the AVX-512 family), its
/// activations are exact in bf16 and the tiles run its matrix (see `x86::amx`).
fn on_amx(j: &Matmul, isa: Isa, amx: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        amx && j.inputs == Inputs::Bf16Exact && j.m > 0 && isa == Isa::Avx512 && x86::amx::runs(j.w)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (j, isa, amx);
        false
    }
}

/// Whether `j` may run the FP4, BF16 or FP8 kernels on bf16 dot products, they being in use
/// (`dots`): its activations are exact in bf16, it takes the AVX-512 family, and its weights
/// keep the products normal (the activations are checked as they are packed). FP8 only
/// between [`FP8_DOTS_FROM`] rows and the GEMM's crossover (the planner's `Route::dots`
/// adds that window); FP4 and BF16 at every batch size:
/// they give the bits of the f32 fused kernels, which the GEMM path gives too, and at 8 rows
/// they already multiply at about the f32 FMA peak, which the GEMM reaches only near 512.
fn on_dots(j: &Matmul, isa: Isa, dots: bool) -> bool {
    dots && j.inputs == Inputs::Bf16Exact
        && j.w.dots_ok
        && j.m > 0
        && family(j.w, isa) == Isa::Avx512
}

/// Activation rows from which FP8 runs on bf16 dot products (below the GEMM's crossover):
/// its decode to bf16 pairs costs more than the f32 one, which fewer rows do not win back,
/// and from the crossover the GEMM is faster (docs/PERFORMANCE.md, issue 32).
pub(crate) const FP8_DOTS_FROM: usize = 8;

/// The weight rows a tile's row count is a multiple of: the AMX path's row step (two
/// tiles of 16) or any.
fn row_step(amx: bool) -> usize {
    #[cfg(target_arch = "x86_64")]
    if amx {
        return x86::amx::ROW_STEP;
    }
    let _ = amx;
    1
}
