//! AVX2 + FMA kernels: dots of `R` weight rows (decoded from their stored format in
//! registers) with `M` activation rows, `A` independent accumulators per pair.
//!
//! Decoding avoids shuffles and lookups entirely (on Zen 2 the shift/shuffle pipe is what
//! binds); each format's trick leaves the lanes in a strided element order that
//! [`super::prepare`] gives the activations too:
//!
//! * **FP8 E4M3**: arithmetic 16-bit shifts place each byte's sign, exponent and mantissa in
//!   the matching f32 fields, so the lane reads `value · 2^-120` (exact, subnormals too).
//!   Activations arrive multiplied by their block scale and `2^64`; the sum is rescaled by
//!   `2^56`.
//! * **FP4 E2M1**: a `vpshufb` table turns each nibble into the E4M3 code of the same value,
//!   then the FP8 decode applies (lanes read `value · 2^-120`, never subnormal); each vector
//!   is multiplied by its group's E8M0 scale times `2^90` (from a 256-entry table) and the
//!   activations arrive times `2^30`.
//! * **BF16**: the top half of an f32, so a shift and a mask give the even and odd elements.

use super::Plan;
use crate::formats::{bf16_to_f32, e2m1_to_f32, e4m3_to_f32};
use crate::matrix::Data;
use std::arch::x86_64::*;
use std::ops::Range;

/// Activation rows per kernel call; larger batches loop over groups of this many, with the
/// weight rows still in L1.
pub(super) const M_GROUP: usize = 4;

/// Bytes ahead of the current load that each weight stream prefetches: the hardware
/// prefetcher re-trains at every row start (rows are a few KB), software prefetch does not.
const PREFETCH: usize = 3072;

/// `2^90 · 2^(b-127)` for every E8M0 byte `b` in the fast range (others never looked up):
/// with the decode's `2^-120` and the activations' `2^30` the product is the true one.
static FP4_SCALE: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut b = 32;
    while b <= 158 {
        t[b] = f32::from_bits(((b + 90) as u32) << 23);
        b += 1;
    }
    t
};

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn reduce<const R: usize, const M: usize, const A: usize>(
    acc: [[[__m256; A]; M]; R],
) -> [[f32; M]; R] {
    let mut out = [[0.0f32; M]; R];
    for (o_row, a_row) in out.iter_mut().zip(&acc) {
        for (o, a) in o_row.iter_mut().zip(a_row) {
            *o = hsum(a[1..].iter().fold(a[0], |s, &v| _mm256_add_ps(s, v)));
        }
    }
    out
}

/// # Safety
/// Each `w[r]` points at `32 · chunks` readable bytes, each `x[m]` at `32 · chunks` floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn fp8_dots<const R: usize, const M: usize, const A: usize>(
    w: [*const u8; R],
    x: [*const f32; M],
    chunks: usize,
    _: &(),
) -> [[f32; M]; R] {
    let mask = _mm256_set1_epi32(0x87F0_0000u32 as i32);
    let mut acc = [[[_mm256_setzero_ps(); A]; M]; R];
    for c in 0..chunks {
        for r in 0..R {
            // SAFETY: chunk c lies inside the row (caller's contract); a prefetch of any
            // address is harmless.
            let v = unsafe {
                _mm_prefetch(w[r].wrapping_add(32 * c + PREFETCH).cast(), _MM_HINT_T0);
                _mm256_loadu_si256(w[r].add(32 * c).cast())
            };
            let f = e4m3_vectors(v, mask);
            for m in 0..M {
                for (q, fq) in f.iter().enumerate() {
                    // SAFETY: as above, for the activation row.
                    let xv = unsafe { _mm256_loadu_ps(x[m].add(32 * c + 8 * q)) };
                    let a = &mut acc[r][m][q % A];
                    *a = _mm256_fmadd_ps(*fq, xv, *a);
                }
            }
        }
    }
    reduce(acc)
}

/// # Safety
/// Each `w[r]` points at `32 · chunks` readable `u16`s, each `x[m]` at `32 · chunks` floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn bf16_dots<const R: usize, const M: usize, const A: usize>(
    w: [*const u16; R],
    x: [*const f32; M],
    chunks: usize,
    _: &(),
) -> [[f32; M]; R] {
    let hi = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    let mut acc = [[[_mm256_setzero_ps(); A]; M]; R];
    for c in 0..chunks {
        for r in 0..R {
            // SAFETY: both halves of chunk c lie inside the row.
            let (v0, v1) = unsafe {
                _mm_prefetch(w[r].wrapping_add(32 * c + PREFETCH / 2).cast(), _MM_HINT_T0);
                (
                    _mm256_loadu_si256(w[r].add(32 * c).cast()),
                    _mm256_loadu_si256(w[r].add(32 * c + 16).cast()),
                )
            };
            let f = [
                _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)),
                _mm256_castsi256_ps(_mm256_and_si256(v0, hi)),
                _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)),
                _mm256_castsi256_ps(_mm256_and_si256(v1, hi)),
            ];
            for m in 0..M {
                for (q, fq) in f.iter().enumerate() {
                    // SAFETY: as above, for the activation row.
                    let xv = unsafe { _mm256_loadu_ps(x[m].add(32 * c + 8 * q)) };
                    let a = &mut acc[r][m][q % A];
                    *a = _mm256_fmadd_ps(*fq, xv, *a);
                }
            }
        }
    }
    reduce(acc)
}

/// # Safety
/// Each `w[r]` points at `32 · chunks` readable floats, each `x[m]` likewise.
#[target_feature(enable = "avx2,fma")]
unsafe fn f32_dots<const R: usize, const M: usize, const A: usize>(
    w: [*const f32; R],
    x: [*const f32; M],
    chunks: usize,
    _: &(),
) -> [[f32; M]; R] {
    let mut acc = [[[_mm256_setzero_ps(); A]; M]; R];
    for c in 0..chunks {
        for r in 0..R {
            // SAFETY: chunk c lies inside the row.
            _mm_prefetch(w[r].wrapping_add(32 * c + PREFETCH / 4).cast(), _MM_HINT_T0);
            let f: [__m256; 4] =
                std::array::from_fn(|q| unsafe { _mm256_loadu_ps(w[r].add(32 * c + 8 * q)) });
            for m in 0..M {
                for (q, fq) in f.iter().enumerate() {
                    // SAFETY: as above, for the activation row.
                    let xv = unsafe { _mm256_loadu_ps(x[m].add(32 * c + 8 * q)) };
                    let a = &mut acc[r][m][q % A];
                    *a = _mm256_fmadd_ps(*fq, xv, *a);
                }
            }
        }
    }
    reduce(acc)
}

/// The scale rows of the (up to two) weight rows an FP4 kernel call reads.
struct Fp4Scales {
    rows: [*const u8; 2],
    /// `log2(group)`; groups are powers of two of at least 32.
    group_shift: u32,
}

/// E4M3 codes of the sixteen E2M1 values (every one is a normal E4M3 number), twice: one
/// table per 128-bit lane for `vpshufb`.
const E2M1_AS_E4M3: [u8; 32] = {
    const MAG: [u8; 8] = [0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C];
    let mut t = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = MAG[i % 8] | if i % 16 >= 8 { 0x80 } else { 0 };
        i += 1;
    }
    t
};

/// The four f32 vectors of a 32-byte FP8 E4M3 load (vector `q` lane `j` = byte `4j + q`),
/// each lane `value · 2^-120`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn e4m3_vectors(v: __m256i, mask: __m256i) -> [__m256; 4] {
    let t = _mm256_srai_epi16(v, 4);
    let t2 = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4);
    [
        _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(t2, 16), mask)),
        _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(t, 16), mask)),
        _mm256_castsi256_ps(_mm256_and_si256(t2, mask)),
        _mm256_castsi256_ps(_mm256_and_si256(t, mask)),
    ]
}

/// # Safety
/// Each `w[r]` points at `32 · chunks` readable bytes (64 codes a chunk), each
/// `scales.rows[r]` at the row's E8M0 scales (every byte in the fast range), each `x[m]` at
/// `64 · chunks` floats.
///
/// The nibbles go through a table to E4M3 codes, then take the FP8 path: FP4's subnormal
/// `±0.5` would otherwise be an f32 subnormal, which costs a microcode assist per operand.
#[target_feature(enable = "avx2,fma")]
unsafe fn fp4_dots<const R: usize, const M: usize, const A: usize>(
    w: [*const u8; R],
    x: [*const f32; M],
    chunks: usize,
    scales: &Fp4Scales,
) -> [[f32; M]; R] {
    let (s, group_shift) = (scales.rows, scales.group_shift);
    let mask = _mm256_set1_epi32(0x87F0_0000u32 as i32);
    let nibble = _mm256_set1_epi8(0x0F);
    // SAFETY: the table is 32 bytes.
    let lut = unsafe { _mm256_loadu_si256(E2M1_AS_E4M3.as_ptr().cast()) };
    let mut acc = [[[_mm256_setzero_ps(); A]; M]; R];
    for c in 0..chunks {
        let (g0, g1) = ((64 * c) >> group_shift, (64 * c + 32) >> group_shift);
        for r in 0..R {
            // SAFETY: chunk c and its two groups' scales lie inside the row.
            let (v, lo, hi) = unsafe {
                _mm_prefetch(w[r].wrapping_add(32 * c + PREFETCH).cast(), _MM_HINT_T0);
                (
                    _mm256_loadu_si256(w[r].add(32 * c).cast()),
                    FP4_SCALE[*s[r].add(g0) as usize],
                    FP4_SCALE[*s[r].add(g1) as usize],
                )
            };
            let sv =
                _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(lo)), _mm_set1_ps(hi), 1);
            // Even elements (low nibbles) and odd ones (high nibbles) as E4M3 bytes.
            let even = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, nibble));
            let odd = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble));
            // This chunk's products, then scaled into the accumulators once per pair.
            let mut part = [[_mm256_setzero_ps(); A]; M];
            for (parity, codes) in [(0, even), (1, odd)] {
                // Byte 4j + q of `codes` is element 2(4j + q) + parity = 8j + (2q + parity).
                for (q, f) in e4m3_vectors(codes, mask).into_iter().enumerate() {
                    let slot = 2 * q + parity;
                    for (m, p) in part.iter_mut().enumerate() {
                        // SAFETY: as above, for the activation row.
                        let xv = unsafe { _mm256_loadu_ps(x[m].add(64 * c + 8 * slot)) };
                        p[slot % A] = _mm256_fmadd_ps(f, xv, p[slot % A]);
                    }
                }
            }
            for (a, p) in acc[r].iter_mut().zip(&part) {
                for (av, pv) in a.iter_mut().zip(p) {
                    *av = _mm256_fmadd_ps(*pv, sv, *av);
                }
            }
        }
    }
    reduce(acc)
}

/// Copies a kernel's `[R][M]` result into the fixed-size buffer the drivers use.
#[inline(always)]
fn put<const R: usize, const M: usize>(v: [[f32; M]; R]) -> [[f32; M_GROUP]; 2] {
    let mut out = [[0.0f32; M_GROUP]; 2];
    for r in 0..R {
        out[r][..M].copy_from_slice(&v[r]);
    }
    out
}

#[inline(always)]
fn take<T: Copy, const N: usize>(a: &[T]) -> [T; N] {
    std::array::from_fn(|i| a[i])
}

/// Calls `$kernel::<R, M, 2>` for `$r` (1 or 2) weight rows and `$mg` (1 ..= 4) activation
/// rows. Every pair gets the same two accumulators whatever the shape, so a row's result
/// does not depend on which other rows share the batch (batch invariance: a request's
/// tokens do not change with the load); three or four activation rows take one weight row
/// at a time to keep the accumulators in registers.
macro_rules! call {
    ($kernel:ident, $r:expr, $mg:expr, $w:expr, $x:expr, $chunks:expr, $extra:expr) => {
        match ($r, $mg) {
            (1, 1) => put($kernel::<1, 1, 2>(take(&$w), take(&$x), $chunks, $extra)),
            (1, 2) => put($kernel::<1, 2, 2>(take(&$w), take(&$x), $chunks, $extra)),
            (2, 1) => put($kernel::<2, 1, 2>(take(&$w), take(&$x), $chunks, $extra)),
            (2, 2) => put($kernel::<2, 2, 2>(take(&$w), take(&$x), $chunks, $extra)),
            (r, 3) => pair(r, |w| {
                put($kernel::<1, 3, 2>(
                    [$w[w]],
                    take(&$x),
                    $chunks,
                    &RowExtra::row($extra, w),
                ))
            }),
            (r, 4) => pair(r, |w| {
                put($kernel::<1, 4, 2>(
                    [$w[w]],
                    take(&$x),
                    $chunks,
                    &RowExtra::row($extra, w),
                ))
            }),
            _ => unreachable!("kernel shape {}x{}", $r, $mg),
        }
    };
}

/// Per-row kernel arguments, re-based when rows are taken one at a time.
trait RowExtra {
    fn row(&self, w: usize) -> Self;
}

impl RowExtra for () {
    fn row(&self, _: usize) -> Self {}
}

impl RowExtra for Fp4Scales {
    fn row(&self, w: usize) -> Self {
        Fp4Scales {
            rows: [self.rows[w]; 2],
            group_shift: self.group_shift,
        }
    }
}

/// Runs a one-row kernel for each of `r` rows and stacks the results.
#[inline(always)]
fn pair(r: usize, mut one: impl FnMut(usize) -> [[f32; M_GROUP]; 2]) -> [[f32; M_GROUP]; 2] {
    let mut out = one(0);
    if r == 2 {
        out[1] = one(1)[0];
    }
    out
}

/// Activation rows per cache block: the block stays in L2 while the tile's weight rows pass
/// over it (at least one kernel group, at most 64 rows).
fn m_block(k: usize) -> usize {
    ((256 << 10) / (4 * k.max(1)) / M_GROUP * M_GROUP).clamp(M_GROUP, 64)
}

/// Runs one tile (`rows` of the plan's matrix) on the AVX2 path.
///
/// # Safety
/// AVX2 and FMA are available, the plan's pointers are valid for its shapes, its matrix is
/// on the fast path, and no other running tile of this plan overlaps `rows`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile(plan: &Plan, rows: Range<usize>) {
    let w = plan.w();
    let k = w.cols;
    // SAFETY (all blocks below): rows, chunks and activation rows are in bounds by the
    // plan's shapes; outputs of `rows` belong to this tile alone.
    match &w.data {
        Data::F32(b) => {
            let wf = b.as_f32();
            let main = k / 32;
            dense_tile(plan, rows, |r, mg, xs| {
                let wp = [wf[r.start * k..].as_ptr(), wf[(r.end - 1) * k..].as_ptr()];
                let mut out = unsafe { call!(f32_dots, r.len(), mg, wp, xs, main, &()) };
                tails(&mut out, r, mg, xs, main * 32, k, 1.0, |row, j| {
                    wf[row * k + j]
                });
                out
            });
        }
        Data::Bf16(b) => {
            let wb = b.as_u16();
            let main = k / 32;
            dense_tile(plan, rows, |r, mg, xs| {
                let wp = [wb[r.start * k..].as_ptr(), wb[(r.end - 1) * k..].as_ptr()];
                let mut out = unsafe { call!(bf16_dots, r.len(), mg, wp, xs, main, &()) };
                tails(&mut out, r, mg, xs, main * 32, k, 1.0, |row, j| {
                    bf16_to_f32(wb[row * k + j])
                });
                out
            });
        }
        Data::Fp4 {
            packed,
            scales,
            group,
        } => {
            let (wb, groups) = (packed.as_bytes(), k.div_ceil(*group));
            let main = k / 64;
            let group_shift = group.trailing_zeros();
            dense_tile(plan, rows, |r, mg, xs| {
                let wp = [
                    wb[r.start * k / 2..].as_ptr(),
                    wb[(r.end - 1) * k / 2..].as_ptr(),
                ];
                let extra = Fp4Scales {
                    rows: [
                        scales[r.start * groups..].as_ptr(),
                        scales[(r.end - 1) * groups..].as_ptr(),
                    ],
                    group_shift,
                };
                let mut out = unsafe { call!(fp4_dots, r.len(), mg, wp, xs, main, &extra) };
                // Tail activations carry the 2^30 of the layout; undo it with the scale.
                tails(
                    &mut out,
                    r,
                    mg,
                    xs,
                    main * 64,
                    k,
                    2f32.powi(-30),
                    |row, j| {
                        let byte = wb[(row * k + j) / 2];
                        let code = if j % 2 == 0 { byte & 0xF } else { byte >> 4 };
                        e2m1_to_f32(code)
                            * crate::formats::e8m0_to_f32(scales[row * groups + j / group])
                    },
                );
                out
            });
        }
        Data::Fp8 {
            codes,
            scales,
            scale_cols,
            br,
            bc,
        } => {
            let wb = codes.as_bytes();
            let main = k / 32;
            let mb = m_block(k);
            super::with_scratch(mb * k, |xs_buf| {
                let mut rb_start = rows.start;
                while rb_start < rows.end {
                    let rb = rb_start / br;
                    let rb_end = ((rb + 1) * br).min(rows.end);
                    let srow = &scales[rb * scale_cols..(rb + 1) * scale_cols];
                    for i0 in (0..plan.m).step_by(mb) {
                        let i1 = (i0 + mb).min(plan.m);
                        // This block's activations times its scales and 2^64 (the sum comes
                        // back times 2^56: the 2^120 of the decode split so neither side
                        // leaves f32's range).
                        // Whole 32-chunks never straddle a block (the fast path needs
                        // bc % 32 == 0), so permuted positions keep their block.
                        for (i, xs) in (i0..i1).zip(xs_buf.chunks_exact_mut(k)) {
                            let xp = plan.x_row(i);
                            for (kb, &sc) in srow.iter().enumerate() {
                                let (j0, j1) = (kb * bc, ((kb + 1) * bc).min(k));
                                let sc = sc * 2f32.powi(64);
                                for (o, &v) in xs[j0..j1].iter_mut().zip(&xp[j0..j1]) {
                                    *o = v * sc;
                                }
                            }
                        }
                        let ptrs = |i: usize| xs_buf[(i - i0) * k..].as_ptr();
                        for r0 in (rb_start..rb_end).step_by(2) {
                            let r = r0..(r0 + 2).min(rb_end);
                            let wp = [wb[r.start * k..].as_ptr(), wb[(r.end - 1) * k..].as_ptr()];
                            for g0 in (i0..i1).step_by(M_GROUP) {
                                let mg = (i1 - g0).min(M_GROUP);
                                let xs: [*const f32; M_GROUP] =
                                    std::array::from_fn(|t| ptrs(g0 + t.min(mg - 1)));
                                let mut out =
                                    unsafe { call!(fp8_dots, r.len(), mg, wp, xs, main, &()) };
                                for row in out.iter_mut() {
                                    row.iter_mut().for_each(|v| *v *= 2f32.powi(56));
                                }
                                tails(
                                    &mut out,
                                    r.clone(),
                                    mg,
                                    xs,
                                    main * 32,
                                    k,
                                    2f32.powi(-64),
                                    |row, j| e4m3_to_f32(wb[row * k + j]),
                                );
                                unsafe { plan.store(g0, mg, r.clone(), &out) };
                            }
                        }
                    }
                    rb_start = rb_end;
                }
            });
        }
    }
}

/// The loop of the formats whose activations need no per-block work: row pairs over
/// activation groups, activation blocks outermost so they stay in L2.
#[inline(always)]
fn dense_tile(
    plan: &Plan,
    rows: Range<usize>,
    mut kernel: impl FnMut(Range<usize>, usize, [*const f32; M_GROUP]) -> [[f32; M_GROUP]; 2],
) {
    let mb = m_block(plan.w().cols);
    for i0 in (0..plan.m).step_by(mb) {
        let i1 = (i0 + mb).min(plan.m);
        for r0 in rows.clone().step_by(2) {
            let r = r0..(r0 + 2).min(rows.end);
            for g0 in (i0..i1).step_by(M_GROUP) {
                let mg = (i1 - g0).min(M_GROUP);
                let xs: [*const f32; M_GROUP] =
                    std::array::from_fn(|t| plan.x_row(g0 + t.min(mg - 1)).as_ptr());
                let out = kernel(r.clone(), mg, xs);
                // SAFETY: this tile owns the outputs of `r`.
                unsafe { plan.store(g0, mg, r.clone(), &out) };
            }
        }
    }
}

/// Adds the elements past the last whole chunk (`from..k`) in scalar code: `weight(row, j)`
/// decoded, times the activation (which carries the layout's factor, undone by `mult`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn tails(
    out: &mut [[f32; M_GROUP]; 2],
    r: Range<usize>,
    mg: usize,
    xs: [*const f32; M_GROUP],
    from: usize,
    k: usize,
    mult: f32,
    weight: impl Fn(usize, usize) -> f32,
) {
    if from == k {
        return;
    }
    for (ri, row) in r.enumerate() {
        for (mi, &xp) in xs.iter().enumerate().take(mg) {
            let mut t = 0.0f32;
            for j in from..k {
                // SAFETY: every activation row holds k floats.
                t += weight(row, j) * unsafe { *xp.add(j) };
            }
            out[ri][mi] += t * mult;
        }
    }
}
