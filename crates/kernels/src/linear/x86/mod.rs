//! The x86 SIMD path of one tile — which kernel runs for which rows, activation blocking,
//! the FP8 per-block activation scaling, the scalar tails — written once over a kernel
//! family ([`Kernels`]: [`avx2::Avx2`], [`avx512::Avx512`]) that differ only in width.
//!
//! Two paths by batch size:
//! * below [`crate::linear::gemm_from`] activation rows, the fused kernels: every weight
//!   chunk decoded in registers and used for a group of activation rows, the inner
//!   dimension in blocks whose activations stay in L1. Every (weight row, activation row)
//!   pair accumulates its products in the same order whatever the group, so a decode step's
//!   rows never depend on the rest of the batch;
//! * from there on, the GEMM of [`gemm`] (prefill, and the dense products of a batched
//!   decode step).

/// `$call` with `$n` a constant equal to the run-time width `$nw`: one arm per listed
/// width, the last width for anything larger. How each family picks the GEMM micro-kernel
/// of a panel's width, written once.
macro_rules! by_width {
    ($nw:expr, [$($w:literal)*] $last:literal, |$n:ident| $call:expr) => {
        match $nw {
            $($w => {
                const $n: usize = $w;
                $call
            })*
            _ => {
                const $n: usize = $last;
                $call
            }
        }
    };
}

pub(crate) mod amx;
mod avx2;
mod avx512;
mod gemm;
mod simd;

pub(crate) use avx2::Avx2;
pub(crate) use avx512::Avx512;

use super::Plan;
use crate::buffer::WeightBytes;
use crate::formats::{bf16_to_f32, e2m1_to_f32, e4m3_to_f32, e8m0_to_f32};
use crate::matrix::Data;
use std::ops::Range;

/// A kernel family's entry points: the dot kernels of every format, the row decode and the
/// GEMM micro-kernel, for vectors of [`simd::Simd::LANES`] f32, each the one body of
/// [`simd`] compiled with the family's target features. A chunk (one decode step) is
/// `4 · LANES` elements, `8 · LANES` for FP4.
///
/// # Safety (every method)
/// The CPU supports the family; each `w[r]` points at `chunks` whole chunks of its row,
/// each `x[m]` at as many activations in the family's layout, `e` covers the rows.
pub(super) trait Kernels: simd::Simd {
    const ISA: crate::cpu::Isa;
    /// Activation rows up to which the fused kernels take two weight rows at once (each
    /// activation load then feeds two FMAs): as many as the registers hold both rows'
    /// accumulators for.
    const PAIRS_UP_TO: usize;
    /// Activation rows one fused call takes (a larger batch runs in groups, each decoding
    /// the weights again): as many as the registers hold the accumulators for beside a
    /// decoded chunk.
    const M_GROUP: usize;
    /// The dots of `n` consecutive weight rows (`ldw` elements apart, from `w`) with `M`
    /// activation rows, into `out[r · ldo + m]`: the fused kernels' row loop, two rows a call
    /// while the registers allow ([`Self::PAIRS_UP_TO`]).
    unsafe fn fp8_rows<const M: usize>(
        w: *const u8,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &(),
        out: (*mut f32, usize),
    );
    unsafe fn bf16_rows<const M: usize>(
        w: *const u16,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &(),
        out: (*mut f32, usize),
    );
    unsafe fn f32_rows<const M: usize>(
        w: *const f32,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &(),
        out: (*mut f32, usize),
    );
    unsafe fn fp4_rows<const M: usize>(
        w: *const u8,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &Fp4Scales,
        out: (*mut f32, usize),
    );
    /// [`Self::fp4_rows`] on bf16 dot products, its activations packed as bf16 pairs
    /// ([`crate::linear::prepare::pack_pairs`]): the same sums in the same order, so
    /// the same results (see [`avx512::Fp4Dots`]). Only the AVX-512 family has it, and only
    /// plans made where the CPU runs it ([`crate::choice::bf16_dots`]) call it.
    unsafe fn fp4_dots_rows<const M: usize>(
        w: *const u8,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &Fp4Scales,
        out: (*mut f32, usize),
    ) {
        let _ = (w, ldw, n, x, chunks, e, out);
        unreachable!("bf16 dot products run on the AVX-512 family only");
    }
    /// [`Self::fp8_rows`] on bf16 dot products, as [`Self::fp4_dots_rows`] (see
    /// [`avx512::Fp8Dots`]), its activations scaled by their blocks' scales and packed.
    unsafe fn fp8_dots_rows<const M: usize>(
        w: *const u8,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &(),
        out: (*mut f32, usize),
    ) {
        let _ = (w, ldw, n, x, chunks, e, out);
        unreachable!("bf16 dot products run on the AVX-512 family only");
    }
    /// [`Self::bf16_rows`] on bf16 dot products, as [`Self::fp4_dots_rows`] (see
    /// [`avx512::Bf16Dots`]).
    unsafe fn bf16_dots_rows<const M: usize>(
        w: *const u16,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &(),
        out: (*mut f32, usize),
    ) {
        let _ = (w, ldw, n, x, chunks, e, out);
        unreachable!("bf16 dot products run on the AVX-512 family only");
    }
    /// One row's whole chunks decoded into f32 in kernel order (`4 · LANES` floats each,
    /// FP4 chunks count twice).
    unsafe fn decode(format: RowFormat, chunks: usize, out: *mut f32);
    /// GEMM micro-tile: weight rows per call (broadcast) with one or two vectors of
    /// activation columns (`LANES` or `2 · LANES` columns, as many rows as the registers
    /// hold accumulators for).
    const GEMM_NW: [usize; 2];
    /// `out[n][0..xw] = Σ_k panel[k][n] · xt[k][0..xw]` for a panel of `nw` weight rows
    /// and one strip of the transposed activations (`xw` columns a row), prefetching the
    /// bytes `next` names into L2 along the way (the stored weights decoded next); then
    /// plus each tile at `adds` (laid out as `out`), in order, before the store.
    /// `kc = (steps, stride)`: panel rows `0, stride, 2·stride, …`, `steps` of them, against
    /// the strip's first `steps` rows.
    unsafe fn gemm(
        panel: *const f32,
        nw: usize,
        strip: (*const f32, usize),
        kc: (usize, usize),
        out: *mut f32,
        next: Prefetch,
        adds: &[*const f32],
    );
}

/// The scales of the weight rows an FP4 call reads: row `r`'s at `base + r · stride`.
#[derive(Clone, Copy)]
pub(super) struct Fp4Scales {
    pub base: *const u8,
    /// Scale bytes per row.
    pub stride: usize,
    /// `log2(group)`; groups are powers of two of at least 32.
    pub group_shift: u32,
}

impl Fp4Scales {
    /// The scales of a `k`-wide FP4 matrix with groups of `group`, from its row `r0` on.
    pub fn from_row(scales: &[u8], k: usize, group: usize, r0: usize) -> Self {
        let groups = k.div_ceil(group);
        Fp4Scales {
            base: scales.as_ptr().wrapping_add(r0 * groups),
            stride: groups,
            group_shift: group.trailing_zeros(),
        }
    }

    /// The scale of element `j` of row `r`.
    ///
    /// # Safety
    /// Row `r` and its element `j` lie inside the matrix the scales belong to.
    #[inline(always)]
    pub unsafe fn of(&self, r: usize, j: usize) -> u8 {
        // SAFETY: by the contract.
        unsafe { *self.base.add(r * self.stride + (j >> self.group_shift)) }
    }
}

/// Per-row arguments beside the weight pointers, re-based when a call starts further down.
pub(super) trait Extra: Copy {
    /// The same arguments for the rows from `r0` on.
    fn at_row(&self, r0: usize) -> Self;
}

impl Extra for () {
    fn at_row(&self, _: usize) -> Self {}
}

impl Extra for Fp4Scales {
    fn at_row(&self, r0: usize) -> Self {
        Fp4Scales {
            base: self.base.wrapping_add(r0 * self.stride),
            ..*self
        }
    }
}

/// A row to decode: its bytes (and scales).
#[derive(Clone, Copy)]
pub(super) enum RowFormat {
    Fp8(*const u8),
    /// FP8 multiplied by its blocks' scales times `2^64` as it is decoded (the GEMM path,
    /// whose activations carry no scale): the row block's scales and the block width.
    Fp8Scaled(*const u8, *const f32, usize),
    Bf16(*const u16),
    Fp4(*const u8, Fp4Scales),
}

/// Bytes ahead of the current load that each weight stream prefetches. The hardware
/// prefetcher re-trains at every row start (rows are a few KB); software prefetch does not.
/// Into L2, not L1: on Zen 4 the L1's few miss buffers held a prefetching stream back (an
/// FP8 matrix-vector product went from 19 to 34 GB/s with `T2` instead of `T0`), and the
/// L1's own prefetcher takes the lines from L2. The roofline's prefetching probe reads
/// this far ahead too.
pub(crate) const PREFETCH: usize = 8192;

/// Stored weight bytes a GEMM micro-kernel prefetches into L2 while it computes, spread
/// over its inner loop: the rows decoded after it, so their DRAM reads overlap the FMAs.
#[derive(Clone, Copy)]
pub(super) struct Prefetch {
    pub at: *const u8,
    pub bytes: usize,
}

impl Prefetch {
    pub const NONE: Prefetch = Prefetch {
        at: std::ptr::null(),
        bytes: 0,
    };

    /// Issues the prefetches of step `i` of `steps` (each step a share of the lines).
    #[inline(always)]
    pub fn step(&self, i: usize, steps: usize) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T2};
        let lines = self.bytes.div_ceil(64);
        let (l0, l1) = (i * lines / steps, (i + 1) * lines / steps);
        for l in l0..l1 {
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe { _mm_prefetch(self.at.wrapping_add(64 * l).cast::<i8>(), _MM_HINT_T2) };
        }
    }
}

/// Prefetches into L2 the cache lines `PREFETCH` bytes past the `bytes` bytes at `p`.
#[inline(always)]
fn prefetch<T>(p: *const T, bytes: usize) {
    prefetch_lines(p.cast::<u8>().wrapping_add(PREFETCH), bytes);
}

/// Prefetches into L2 the cache lines of the `bytes` bytes at `p`.
#[inline(always)]
fn prefetch_lines(p: *const u8, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T2};
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch(p.wrapping_add(line).cast::<i8>(), _MM_HINT_T2) };
    }
}

/// The most activation rows a fused call takes (any family's [`Kernels::M_GROUP`]).
const M_MAX: usize = 8;
/// Weight rows whose results the tail and store steps take at once.
const ROWS: usize = 2;
/// Bytes of activations one block of the inner dimension holds for the fused kernels: the
/// L1 data cache less 16 KiB for the weight lines passing through it, so the activations
/// stay there while a group of weight rows passes over them. 16 KiB on a 32 KiB L1 (Zen 4,
/// where it was tuned); 32 KiB on a 48 KiB one (recent Intel, Zen 5), where one block then
/// holds a whole 8 192-wide row: with 16 KiB there, an FP8 4 096 × 8 192 product on one
/// core read 62 % of the roof (each row read in two halves far apart in time) and 80–94 %
/// with 32 KiB. Blocks only group the same sums in time, never reorder them: the bits are
/// the same at any size.
fn x_block() -> usize {
    static BLOCK: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BLOCK.get_or_init(|| {
        let l1 = crate::cpu::l1d_bytes().unwrap_or(32 << 10);
        l1.saturating_sub(16 << 10).clamp(16 << 10, 64 << 10)
    })
}
/// Weight rows a fused row loop carries through the blocks of the inner dimension at once
/// (their partial sums wait on the stack between blocks).
const SUB_ROWS: usize = 16;

/// A kernel result: `[weight row][activation row]`.
type Out = [[f32; M_MAX]; ROWS];

#[inline(always)]
fn take<T: Copy, const N: usize>(a: &[T]) -> [T; N] {
    std::array::from_fn(|i| a[i])
}

/// Runs the row loop `$K::$rows` over the `n` weight rows from `w` (`ldw` elements apart)
/// and `mg` (≤ [`M_MAX`]) activation rows, into `out` (`[n][M_MAX]`).
macro_rules! fused {
    ($K:ident :: $rows:ident, $w:expr, $ldw:expr, $n:expr, $mg:expr, $x:expr, $chunks:expr, $extra:expr, $out:expr) => {{
        let (w, ldw, n, mg, x, chunks, extra): (
            _,
            usize,
            usize,
            usize,
            [*const f32; M_MAX],
            usize,
            _,
        ) = ($w, $ldw, $n, $mg, $x, $chunks, $extra);
        let out = ($out, M_MAX);
        match mg {
            1 => $K::$rows::<1>(w, ldw, n, take(&x), chunks, extra, out),
            2 => $K::$rows::<2>(w, ldw, n, take(&x), chunks, extra, out),
            3 => $K::$rows::<3>(w, ldw, n, take(&x), chunks, extra, out),
            4 => $K::$rows::<4>(w, ldw, n, take(&x), chunks, extra, out),
            5 => $K::$rows::<5>(w, ldw, n, take(&x), chunks, extra, out),
            6 => $K::$rows::<6>(w, ldw, n, take(&x), chunks, extra, out),
            7 => $K::$rows::<7>(w, ldw, n, take(&x), chunks, extra, out),
            _ => $K::$rows::<8>(w, ldw, n, take(&x), chunks, extra, out),
        }
    }};
}

/// Weight rows per call of a fused row loop (a stack buffer holds their results).
const FUSED_ROWS: usize = 64;

/// The results of one fused row loop: `[row][activation row]`.
type FusedOut = [[f32; M_MAX]; FUSED_ROWS];

/// A format's fused row loop: rows, activation rows, their pointers, the results.
type FusedRows<'a> = &'a dyn Fn(Range<usize>, usize, [*const f32; M_MAX], &mut FusedOut);

/// Activation rows per cache block: the block stays in L2 while the tile's weight rows pass
/// over it (at least one group, at most 64 rows).
fn m_block(k: usize) -> usize {
    ((256 << 10) / (4 * k.max(1)) / 12 * 12).clamp(12, 72)
}

/// An element `(row, j)` of a weight, decoded.
type Element<'a> = &'a dyn Fn(usize, usize) -> f32;

/// How a tile reads its rows.
pub(super) struct Rows<'a> {
    /// Fused dots of rows `r` (at most [`FUSED_ROWS`]) with `mg` activation rows, into
    /// `out[row - r.start][m]`.
    fused: FusedRows<'a>,
    /// Row `r` decoded into `out` (`chunks · 4 · LANES` floats, kernel order).
    decode: &'a dyn Fn(usize, *mut f32),
    /// F32 weights' own rows (no decode).
    in_place: Option<&'a dyn Fn(usize) -> *const f32>,
    /// Whole chunks per row (the kernels' part; the rest is the scalar tail).
    chunks: usize,
    /// What the kernels' sums are multiplied by (FP8: `2^56`).
    post: f32,
    /// The stored bytes of row 0 and the bytes of one row (what a row's decode reads).
    stored: (*const u8, usize),
    /// Element `(row, j)` of the weight, decoded (the tail's scalar path).
    weight: &'a dyn Fn(usize, usize) -> f32,
    /// What the tail's products are multiplied by (undoing the activation layout's factor).
    tail_mult: f32,
    /// For the GEMM path, where activations carry no per-block scale: the exact element
    /// and its multiplier, when they differ from `weight` and `tail_mult` (FP8).
    exact: Option<(Element<'a>, f32)>,
}

impl Rows<'_> {
    /// Elements per row the kernels cover.
    fn main_elems<K: Kernels>(&self) -> usize {
        self.chunks * 4 * K::LANES
    }

    /// The rescale and the scalar tail, applied to a dot result.
    fn finish<K: Kernels>(
        &self,
        out: &mut Out,
        r: Range<usize>,
        mg: usize,
        xs: [*const f32; M_MAX],
        k: usize,
    ) {
        if self.post != 1.0 {
            for row in out.iter_mut() {
                row.iter_mut().for_each(|v| *v *= self.post);
            }
        }
        let cols = self.main_elems::<K>()..k;
        tails(out, r, mg, xs, cols, self.tail_mult, self.weight);
    }
}

/// The loops of one tile for activation rows `i0..i1` whose pointers `x(i)` gives: groups
/// of at most [`Kernels::M_GROUP`] activation rows (as even as can be), each over every
/// weight row.
///
/// # Safety
/// As [`tile`].
unsafe fn run_rows<K: Kernels>(
    plan: &Plan,
    rows: Range<usize>,
    (i0, i1): (usize, usize),
    x: &dyn Fn(usize) -> *const f32,
    how: &Rows,
) {
    let k = plan.w().cols;
    let group = (i1 - i0).div_ceil((i1 - i0).div_ceil(K::M_GROUP));
    let mut res: FusedOut = [[0.0; M_MAX]; FUSED_ROWS];
    for g0 in (i0..i1).step_by(group) {
        let mg = (i1 - g0).min(group);
        let xs: [*const f32; M_MAX] = std::array::from_fn(|t| x(g0 + t.min(mg - 1)));
        for s0 in rows.clone().step_by(FUSED_ROWS) {
            let sub = s0..(s0 + FUSED_ROWS).min(rows.end);
            (how.fused)(sub.clone(), mg, xs, &mut res);
            for r0 in sub.clone().step_by(ROWS) {
                let r = r0..(r0 + ROWS).min(sub.end);
                let mut out: Out = [[0.0; M_MAX]; ROWS];
                for (t, row) in r.clone().enumerate() {
                    out[t] = res[row - s0];
                }
                how.finish::<K>(&mut out, r.clone(), mg, xs, k);
                // SAFETY: this tile owns the outputs of `r`.
                unsafe { plan.store(g0, mg, r, &out) };
            }
        }
    }
}

/// Runs one tile (`rows` of the plan's matrix) on kernel family `K`.
///
/// # Safety
/// The CPU supports `K`, the plan's pointers are valid for its shapes, its activations are
/// laid out for `K::LANES`, its matrix is on the fast path, and no other running tile of
/// this plan overlaps `rows` and `part` (the GEMM path's share of the activations).
pub(super) unsafe fn tile<K: Kernels>(plan: &Plan, rows: Range<usize>, part: usize) {
    let k = plan.w().cols;
    let t = Tile {
        plan,
        rows,
        part,
        k,
        main: k / (4 * K::LANES),
        // The plan chose the GEMM path where it made the GEMM layout (from
        // `crate::linear::gemm_from` rows; never for a product that could run on bf16 dot
        // products, whether its activations proved fit for them or not).
        gemm: !plan.xt().0.is_null(),
    };
    // SAFETY: as the function's.
    unsafe {
        match &plan.w().data {
            Data::F32(b) => t.f32::<K>(b),
            Data::Bf16(b) => t.bf16::<K>(b),
            Data::Fp4 {
                packed,
                scales,
                group,
            } => t.fp4::<K>(packed, scales, *group),
            Data::Fp8 {
                codes,
                scales,
                scale_cols,
                br,
                bc,
            } => t.fp8::<K>(codes, scales, (*scale_cols, *br, *bc)),
            // `runs_on` sends these to the scalar family.
            Data::Ggml { .. } => unreachable!("no x86 kernels for ggml blocks yet"),
        }
    }
}

/// One tile's work: its rows of the plan's matrix, its share of the GEMM path's
/// activations, and the shapes every format's loop reads (`main`: whole kernel chunks of a
/// row). Each format builds its [`Rows`] and runs them.
///
/// SAFETY (every unsafe block of the methods): as [`tile`]'s contract; rows, chunks and
/// activation rows are in bounds by the plan's shapes, and outputs of `rows` belong to this
/// tile alone.
struct Tile<'a> {
    plan: &'a Plan,
    rows: Range<usize>,
    part: usize,
    k: usize,
    main: usize,
    gemm: bool,
}

impl Tile<'_> {
    /// The activations in blocks of [`m_block`] rows.
    fn blocks(&self, f: &mut dyn FnMut(usize, usize)) {
        let (mb, m) = (m_block(self.k), self.plan.m);
        for i0 in (0..m).step_by(mb) {
            f(i0, (i0 + mb).min(m));
        }
    }

    /// Runs `how` on the GEMM path, or over the activations block by block.
    unsafe fn run<K: Kernels>(&self, how: &Rows) {
        let (plan, rows) = (self.plan, &self.rows);
        if self.gemm {
            return unsafe { gemm::gemm_rows::<K>(plan, rows.clone(), self.part, how) };
        }
        let x_plain = |i: usize| plan.x_row(i).as_ptr();
        self.blocks(&mut |i0, i1| unsafe {
            run_rows::<K>(plan, rows.clone(), (i0, i1), &x_plain, how)
        });
    }

    unsafe fn f32<K: Kernels>(&self, b: &WeightBytes) {
        let (k, main) = (self.k, self.main);
        let wf = b.as_f32();
        let row = |r: usize| wf[r * k..].as_ptr();
        let how = Rows {
            fused: &|r, mg, xs, out| unsafe {
                fused!(
                    K::f32_rows,
                    row(r.start),
                    k,
                    r.len(),
                    mg,
                    xs,
                    main,
                    &(),
                    out.as_mut_ptr().cast()
                )
            },
            decode: &|_, _| {},
            in_place: Some(&row),
            stored: (wf.as_ptr().cast(), 4 * k),
            chunks: main,
            post: 1.0,
            weight: &|row, j| wf[row * k + j],
            tail_mult: 1.0,
            exact: None,
        };
        unsafe { self.run::<K>(&how) }
    }

    unsafe fn bf16<K: Kernels>(&self, b: &WeightBytes) {
        let (k, main, plan) = (self.k, self.main, self.plan);
        let wb = b.as_u16();
        let row = |r: usize| wb[r * k..].as_ptr();
        let how = Rows {
            fused: &|r, mg, xs, out| unsafe {
                if plan.dots {
                    let (w, o) = (row(r.start), out.as_mut_ptr().cast());
                    return fused!(K::bf16_dots_rows, w, k, r.len(), mg, xs, main, &(), o);
                }
                fused!(
                    K::bf16_rows,
                    row(r.start),
                    k,
                    r.len(),
                    mg,
                    xs,
                    main,
                    &(),
                    out.as_mut_ptr().cast()
                )
            },
            decode: &|r, out| unsafe { K::decode(RowFormat::Bf16(row(r)), main, out) },
            in_place: None,
            stored: (wb.as_ptr().cast(), 2 * k),
            chunks: main,
            post: 1.0,
            weight: &|row, j| bf16_to_f32(wb[row * k + j]),
            tail_mult: 1.0,
            exact: None,
        };
        unsafe { self.run::<K>(&how) }
    }

    unsafe fn fp4<K: Kernels>(&self, packed: &WeightBytes, scales: &[u8], group: usize) {
        let (k, plan, chunk) = (self.k, self.plan, 4 * K::LANES);
        let (wb, groups) = (packed.as_bytes(), k.div_ceil(group));
        let main64 = k / (2 * chunk);
        let row = |r: usize| wb[r * k / 2..].as_ptr();
        let scales_of = |r0: usize| Fp4Scales::from_row(scales, k, group, r0);
        let how = Rows {
            fused: &|r, mg, xs, out| unsafe {
                let (w, n, s) = (row(r.start), r.len(), scales_of(r.start));
                let o = out.as_mut_ptr().cast();
                if plan.dots {
                    return fused!(K::fp4_dots_rows, w, k / 2, n, mg, xs, main64, &s, o);
                }
                fused!(K::fp4_rows, w, k / 2, n, mg, xs, main64, &s, o)
            },
            decode: &|r, out| unsafe {
                K::decode(RowFormat::Fp4(row(r), scales_of(r)), main64, out)
            },
            in_place: None,
            stored: (wb.as_ptr(), k / 2),
            chunks: 2 * main64,
            post: 1.0,
            weight: &|row, j| {
                let byte = wb[(row * k + j) / 2];
                let code = if j % 2 == 0 { byte & 0xF } else { byte >> 4 };
                e2m1_to_f32(code) * e8m0_to_f32(scales[row * groups + j / group])
            },
            // Tail activations carry the layout's factor.
            tail_mult: 1.0 / super::fp4_x_mult(K::ISA),
            exact: None,
        };
        unsafe { self.run::<K>(&how) }
    }

    /// FP8 rows: the fused kernels take activations scaled per weight block (made here for
    /// each block of rows), the GEMM path weight rows decoded with their scales.
    unsafe fn fp8<K: Kernels>(
        &self,
        codes: &WeightBytes,
        scales: &[f32],
        (scale_cols, br, bc): (usize, usize, usize),
    ) {
        let (k, main, plan, rows) = (self.k, self.main, self.plan, &self.rows);
        let wb = codes.as_bytes();
        let row = |r: usize| wb[r * k..].as_ptr();
        let how = Rows {
            fused: &|r, mg, xs, out| unsafe {
                fused!(
                    K::fp8_rows,
                    row(r.start),
                    k,
                    r.len(),
                    mg,
                    xs,
                    main,
                    &(),
                    out.as_mut_ptr().cast()
                )
            },
            decode: &|r, out| unsafe { K::decode(RowFormat::Fp8(row(r)), main, out) },
            in_place: None,
            stored: (wb.as_ptr(), k),
            chunks: main,
            // The sums come back times 2^56 (the 2^120 of the decode is split so neither
            // side leaves f32's range); the tail sums times 2^64.
            post: 2f32.powi(56),
            weight: &|row, j| e4m3_to_f32(wb[row * k + j]),
            tail_mult: 2f32.powi(-64),
            exact: Some((
                &|row, j| e4m3_to_f32(wb[row * k + j]) * scales[(row / br) * scale_cols + j / bc],
                1.0,
            )),
        };
        if self.gemm {
            // The GEMM's activations carry no block scale: the decoded rows get it
            // (times 2^64, so the sums still come back times 2^56).
            let scaled = Rows {
                decode: &|r, out| unsafe {
                    let srow = scales[(r / br) * scale_cols..].as_ptr();
                    K::decode(RowFormat::Fp8Scaled(row(r), srow, bc), main, out)
                },
                ..how
            };
            return unsafe { gemm::gemm_rows::<K>(plan, rows.clone(), self.part, &scaled) };
        }
        // On bf16 dot products the weights are exact (not times 2^-120) and the pairs are
        // packed without the activations' 2^64, so the sums come back as they are; the tail
        // keeps the 2^64 its multiplier undoes.
        let dots = Rows {
            fused: &|r, mg, xs, out| unsafe {
                let (w, o) = (row(r.start), out.as_mut_ptr().cast());
                fused!(K::fp8_dots_rows, w, k, r.len(), mg, xs, main, &(), o)
            },
            post: 1.0,
            ..how
        };
        let ldx = plan.ldx();
        super::with_scratch2(m_block(k) * ldx, |xs_buf| {
            let mut rb_start = rows.start;
            while rb_start < rows.end {
                let rb = rb_start / br;
                let rb_end = ((rb + 1) * br).min(rows.end);
                let srow = &scales[rb * scale_cols..(rb + 1) * scale_cols];
                self.blocks(&mut |i0, i1| {
                    // This block's activations times its scales and 2^64.
                    for (i, xs) in (i0..i1).zip(xs_buf.chunks_exact_mut(ldx)) {
                        scale_fp8_activations::<K>(plan.x_row(i), srow, bc, k, xs);
                    }
                    let rows = rb_start..rb_end;
                    if plan.dots && self.fp8_dots::<K>(rows.clone(), (i0, i1), xs_buf, &dots) {
                        return;
                    }
                    let base = xs_buf.as_ptr();
                    let x = |i: usize| base.wrapping_add((i - i0) * ldx);
                    unsafe { run_rows::<K>(plan, rows, (i0, i1), &x, &how) };
                });
                rb_start = rb_end;
            }
        });
    }

    /// Runs rows `rows` of an FP8 tile on bf16 dot products for activation rows `i0..i1`
    /// (scaled, in `xs_buf`), if every packed activation fits them (see
    /// [`super::prepare::pack_laid_out_pairs`]); false, nothing run, if not.
    unsafe fn fp8_dots<K: Kernels>(
        &self,
        rows: Range<usize>,
        (i0, i1): (usize, usize),
        xs_buf: &[f32],
        how: &Rows,
    ) -> bool {
        let (k, ldx) = (self.k, self.plan.ldx());
        super::with_scratch3(m_block(k) * ldx, |packed| {
            let fits = xs_buf
                .chunks_exact(ldx)
                .zip(packed.chunks_exact_mut(ldx))
                .take(i1 - i0)
                .all(|(xs, out)| {
                    let f = 2f32.powi(-64);
                    super::prepare::pack_laid_out_pairs(&xs[..k], &mut out[..k], K::LANES, f)
                });
            if fits {
                #[cfg(test)]
                FP8_DOTS_RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let base = packed.as_ptr();
                let x = |i: usize| base.wrapping_add((i - i0) * ldx);
                // SAFETY: the tile's contract covers `rows`; activation row `i` is packed
                // whole (`k` floats, `ldx` apart) at `x(i)`, as `xs_buf` held it.
                unsafe { run_rows::<K>(self.plan, rows, (i0, i1), &x, how) };
            }
            fits
        })
    }
}

/// FP8 row blocks run on bf16 dot products, for the tests to see that they did (a packing
/// that refuses falls back to the f32 kernels, with the same results).
#[cfg(test)]
pub(crate) static FP8_DOTS_RUNS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// One permuted activation row `xp` times the FP8 block scales `srow` of its elements (and
/// 2^64) into `xs`. Blocks as wide as whole chunks keep permuted positions in their block,
/// so whole ranges are scaled. Narrower ones (V4.1's 32 on AVX-512's 64-element chunks):
/// lane `j` of vector `q` holds element `4j + q` of its chunk, so with blocks of a multiple
/// of 4 that divide the chunk each run of `bc / 4` lanes of a vector lies in one block
/// (other widths go element by element); the tail stays in place.
fn scale_fp8_activations<K: Kernels>(
    xp: &[f32],
    srow: &[f32],
    bc: usize,
    k: usize,
    xs: &mut [f32],
) {
    let chunk = 4 * K::LANES;
    let f = 2f32.powi(64);
    let scale = |xs: &mut [f32], xp: &[f32], sc: f32| {
        for (o, &v) in xs.iter_mut().zip(xp) {
            *o = v * sc;
        }
    };
    if bc.is_multiple_of(chunk) {
        for (kb, &sc) in srow.iter().enumerate() {
            let r = kb * bc..((kb + 1) * bc).min(k);
            scale(&mut xs[r.clone()], &xp[r], sc * f);
        }
        return;
    }
    let main = k / chunk * chunk;
    if chunk.is_multiple_of(bc) {
        let run = bc / 4;
        for c0 in (0..main).step_by(chunk) {
            for q in 0..4 {
                for (r, j0) in (0..K::LANES).step_by(run).enumerate() {
                    let p = c0 + q * K::LANES + j0..c0 + q * K::LANES + j0 + run;
                    scale(&mut xs[p.clone()], &xp[p], srow[c0 / bc + r] * f);
                }
            }
        }
    } else {
        for p in 0..main {
            let at = p % chunk;
            let e = p - at + 4 * (at % K::LANES) + at / K::LANES;
            xs[p] = xp[p] * srow[e / bc] * f;
        }
    }
    for p in main..k {
        xs[p] = xp[p] * srow[p / bc] * f;
    }
}

/// Adds the elements past the last whole chunk (`from..k`) in scalar code: `weight(row, j)`
/// decoded once per row, times each activation row (which carries the layout's factor,
/// undone by `mult`).
#[inline(always)]
fn tails(
    out: &mut Out,
    r: Range<usize>,
    mg: usize,
    xs: [*const f32; M_MAX],
    cols: Range<usize>,
    mult: f32,
    weight: impl Fn(usize, usize) -> f32,
) {
    if cols.is_empty() {
        return;
    }
    let from = cols.start;
    // A chunk is at most 128 elements (FP4 on AVX-512), so the tail fits on the stack.
    let mut w = [0.0f32; 128];
    let n = cols.len().min(128);
    for (ri, row) in r.enumerate() {
        for (j, v) in w[..n].iter_mut().enumerate() {
            *v = weight(row, from + j);
        }
        for (mi, &xp) in xs.iter().enumerate().take(mg) {
            // SAFETY: every activation row holds k floats.
            let x = unsafe { std::slice::from_raw_parts(xp.add(from), n) };
            out[ri][mi] += crate::vector::dot_portable(&w[..n], x) * mult;
        }
    }
}
