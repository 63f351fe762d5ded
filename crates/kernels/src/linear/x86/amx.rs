//! AMX-BF16 tiles, for products whose activations are exact in bf16 ([`Inputs::Bf16Exact`]:
//! official numerics rounds every FP8/FP4 projection's input to FP8 with power-of-two
//! scales) and whose weights are FP8 with power-of-two block scales or FP4: every operand
//! is then exact in bf16, each bf16 × bf16 product exact in f32, and only the order of the
//! f32 sums differs from the f32 kernels. One `tdpbf16ps` does 16 × 16 × 32 multiply-adds;
//! on the Xeon of PERFORMANCE.md a core runs about ten times its f32 FMA peak that way, but
//! a tile load costs about 23 ns a KiB there ([`crate::roofline::amx_rates`]), so at one or two activation rows the weights'
//! decode, store and reload cost more than the f32 kernels' fused decode: the tiles are a
//! choice (`DEEPINFER_ISA=amx`, [`crate::cpu::amx`]), for prefill-heavy work.
//!
//! The weights are the tile's A operand, 16 rows a tile: each row decoded straight to bf16
//! ([`fp8_row_bf16`], [`fp4_row_bf16`]), so a row needs no transposition. The
//! activations are the B operand, laid out once per call ([`lay_out_block`]) in the same
//! element order as 16-column blocks of bf16 pairs. A C
//! tile accumulates one (16 weight rows, 16 activation rows) block over the whole inner
//! dimension, 32 elements a step; every element of C depends only on its A row and B
//! column, so a row's result is the same bits whatever batch it is in (as
//! [`crate::linear::set_batch_invariant`] promises) and this path serves every batch size,
//! decode included.
//!
//! [`Inputs::Bf16Exact`]: crate::linear::Inputs::Bf16Exact

use super::avx512::Avx512;
use super::simd::Simd;
use super::Fp4Scales;
use crate::linear::{prepare, with_scratch, with_scratch2, Plan};
use crate::matrix::{Data, Format, QMatrix};
use std::arch::asm;
use std::ops::Range;

/// Activation rows (B columns) and weight rows (A rows) of one tile.
const T: usize = 16;
/// Inner-dimension elements of one tile step (32 bf16 a row).
const K_STEP: usize = 32;
/// Weight rows decoded and multiplied together: two A tiles.
pub(crate) const ROW_STEP: usize = 2 * T;

/// Whether `w`'s weights are exact in bf16 once scaled and the AVX-512 decode covers each
/// row whole (no scalar tail): FP8 with power-of-two block scales in whole 64-element
/// chunks, or FP4.
pub(crate) fn runs(w: &QMatrix) -> bool {
    let chunk = prepare::chunk(w.format(), 16);
    if !w.fast_ok || w.cols == 0 || !w.cols.is_multiple_of(chunk) {
        return false;
    }
    match &w.data {
        Data::Fp8 { bc, .. } => w.exact_bf16 && bc.is_multiple_of(chunk),
        Data::Fp4 { group, .. } => *group >= K_STEP && group.is_power_of_two(),
        Data::F32(_) | Data::Bf16(_) | Data::Ggml { .. } => false,
    }
}

/// `u32`s of the laid-out activations of `m` rows of `k` (whole blocks of 16 rows).
pub(crate) fn pairs_len(m: usize, k: usize) -> usize {
    m.div_ceil(T) * T * k / 2
}

/// Block `b` of the activations as a B operand: `[k / 2][16]` pairs, pair `(p, n)` holding
/// elements `2p` (low half) and `2p + 1` of row `16b + n` in the weights' decoded order
/// (FP8: as stored; FP4: the AVX-512 family's), as bf16 (the top halves of the f32s, exact
/// in bf16 by the caller's promise); rows past `m` zero.
pub(crate) fn lay_out_block(
    format: Format,
    x: &[f32],
    (m, k): (usize, usize),
    b: usize,
    out: &mut [u32],
) {
    with_scratch(k, |row| {
        for n in 0..T {
            let i = b * T + n;
            if i >= m {
                row.fill(0.0);
            } else if format == Format::Fp8 {
                row.copy_from_slice(&x[i * k..(i + 1) * k]);
            } else {
                prepare::permute_row(format, 16, &x[i * k..(i + 1) * k], row, 1.0);
            }
            for (p, e) in row.chunks_exact(2).enumerate() {
                out[p * T + n] = (e[0].to_bits() >> 16) | (e[1].to_bits() & 0xFFFF_0000);
            }
        }
    })
}

/// The tile configuration (palette 1): tiles 0–7 all 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = T as u8;
        t += 1;
    }
    TileConfig(c)
};

/// One thread's share of the roofline's AMX probe ([`crate::roofline::amx_rates`]): `iters`
/// rounds of four `tdpbf16ps` on independent sums, then `iters` rounds of three tile loads
/// from L1 (as a 32-row step loads two A tiles and one B tile); returns the flops and the
/// bytes loaded, and the seconds each part took.
///
/// # Safety
/// AMX is available ([`crate::cpu::amx_detected`]).
pub(crate) unsafe fn probe(iters: usize) -> ((f64, f64), (f64, f64)) {
    let ones = [0x3F80_3F80u32; 3 * T * T];
    let at = |t: usize| ones[t * T * T..].as_ptr();
    let ld = 4 * T;
    // SAFETY (every asm block): CONFIG is valid; each load reads one 1 KiB tile of `ones`.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const TileConfig, options(nostack));
        zero_sums();
        asm!(
            "tileloadd tmm4, [{a} + {ld}*1]",
            "tileloadd tmm5, [{a} + {ld}*1]",
            "tileloadd tmm6, [{b} + {ld}*1]",
            "tileloadd tmm7, [{b} + {ld}*1]",
            a = in(reg) at(0),
            b = in(reg) at(1),
            ld = in(reg) ld,
            options(nostack),
        );
    }
    let t = std::time::Instant::now();
    for _ in 0..iters {
        // SAFETY: as above.
        unsafe {
            asm!(
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm5, tmm6",
                "tdpbf16ps tmm2, tmm4, tmm7",
                "tdpbf16ps tmm3, tmm5, tmm7",
                options(nostack)
            )
        };
    }
    let compute = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    for _ in 0..iters {
        // SAFETY: as above.
        unsafe {
            asm!(
                "tileloadd tmm4, [{a0} + {ld}*1]",
                "tileloadd tmm5, [{a1} + {ld}*1]",
                "tileloadd tmm6, [{b} + {ld}*1]",
                a0 = in(reg) at(0),
                a1 = in(reg) at(1),
                b = in(reg) at(2),
                ld = in(reg) ld,
                options(nostack),
            )
        };
    }
    let loads = t.elapsed().as_secs_f64();
    // SAFETY: releases this thread's tile state.
    unsafe { asm!("tilerelease", options(nostack)) };
    let flops = (iters * 4 * T * T * K_STEP * 2) as f64;
    let bytes = (iters * 3 * T * T * 4) as f64;
    ((flops, compute), (bytes, loads))
}

/// Zeroes the four C tiles.
///
/// # Safety
/// AMX is available ([`crate::cpu::amx`]) and configured with [`CONFIG`] on this thread.
unsafe fn zero_sums() {
    // SAFETY: by the contract.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack)
        )
    };
}

/// Adds to the C tiles the products of `steps` 32-element steps: weight rows `a0` and `a1`
/// (16 each, `lda` bytes apart) against one or two blocks of laid-out activations (`b1`
/// none for one), each already at the steps' first pair. Tile 0 sums `a0` × `b0`, 1
/// `a1` × `b0`, 2 `a0` × `b1`, 3 `a1` × `b1`; tiles 4–5 hold A, 6–7 B.
///
/// # Safety
/// As [`zero_sums`]; the operands hold `steps` whole steps (A: 16 rows of `32 · steps`
/// bf16 from each start; B: `16 · steps` rows of 16 pairs).
unsafe fn add_products(
    (a0, a1, lda): (*const u16, *const u16, usize),
    (b0, b1): (*const u32, Option<*const u32>),
    steps: usize,
) {
    let ldb = 4 * T;
    for s in 0..steps {
        let (a0, a1) = (a0.wrapping_add(s * K_STEP), a1.wrapping_add(s * K_STEP));
        let b0 = b0.wrapping_add(s * K_STEP / 2 * T);
        // SAFETY: each load reads 16 rows of 64 bytes inside the operands (the contract).
        unsafe {
            asm!(
                "tileloadd tmm4, [{a0} + {lda}*1]",
                "tileloadd tmm5, [{a1} + {lda}*1]",
                "tileloadd tmm6, [{b0} + {ldb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm5, tmm6",
                a0 = in(reg) a0,
                a1 = in(reg) a1,
                b0 = in(reg) b0,
                lda = in(reg) lda,
                ldb = in(reg) ldb,
                options(nostack),
            )
        };
        if let Some(b1) = b1 {
            // SAFETY: as above.
            unsafe {
                asm!(
                    "tileloadd tmm7, [{b1} + {ldb}*1]",
                    "tdpbf16ps tmm2, tmm4, tmm7",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    b1 = in(reg) b1.wrapping_add(s * K_STEP / 2 * T),
                    ldb = in(reg) ldb,
                    options(nostack),
                )
            };
        }
    }
}

/// The C tiles into `c` (tiles 2–3 only when `two`).
///
/// # Safety
/// As [`zero_sums`].
unsafe fn read_sums(c: &mut [[f32; T * T]; 4], two: bool) {
    // SAFETY: each store writes one 1 KiB tile of `c`.
    unsafe {
        asm!(
            "tilestored [{c0} + {ldc}*1], tmm0",
            "tilestored [{c1} + {ldc}*1], tmm1",
            c0 = in(reg) c[0].as_mut_ptr(),
            c1 = in(reg) c[1].as_mut_ptr(),
            ldc = in(reg) 4 * T,
            options(nostack),
        );
        if two {
            asm!(
                "tilestored [{c2} + {ldc}*1], tmm2",
                "tilestored [{c3} + {ldc}*1], tmm3",
                c2 = in(reg) c[2].as_mut_ptr(),
                c3 = in(reg) c[3].as_mut_ptr(),
                ldc = in(reg) 4 * T,
                options(nostack),
            );
        }
    }
}

/// Weight rows `first..first + ROW_STEP` (rows past `end` zero) decoded, scaled and cut to
/// bf16 into `a` (`ROW_STEP` rows of `k`).
///
/// # Safety
/// The CPU has AVX-512; the plan's matrix [`runs`] here.
unsafe fn decode_rows(plan: &Plan, (first, end): (usize, usize), a: &mut [u16]) {
    let w = plan.w();
    let k = w.cols;
    for (t, dst) in a.chunks_exact_mut(k).enumerate() {
        let r = first + t;
        if r >= end {
            dst.fill(0);
            continue;
        }
        // SAFETY (both arms): row r is whole chunks (`runs`), `dst` holds its k values.
        match &w.data {
            Data::Fp8 {
                codes,
                scales,
                scale_cols,
                br,
                bc,
            } => unsafe {
                let scales = scales[(r / br) * scale_cols..].as_ptr();
                fp8_row_bf16(
                    codes.as_bytes()[r * k..].as_ptr(),
                    (scales, *bc),
                    k,
                    dst.as_mut_ptr(),
                )
            },
            Data::Fp4 {
                packed,
                scales,
                group,
            } => unsafe {
                let s = Fp4Scales::from_row(scales, k, *group, r);
                fp4_row_bf16(
                    packed.as_bytes()[r * k / 2..].as_ptr(),
                    s,
                    k / prepare::chunk(Format::Fp4, 16),
                    dst.as_mut_ptr(),
                )
            },
            Data::F32(_) | Data::Bf16(_) | Data::Ggml { .. } => {
                unreachable!("AMX runs FP8 and FP4 only")
            }
        }
    }
}

/// bf16 bits of the E4M3 magnitudes below 8: zero, then the subnormals `m · 2^-9`, which
/// are normal numbers in bf16 (a 32-entry `vpermw` table).
const E4M3_LOW: [u16; 32] = {
    let mut t = [0u16; 32];
    let mut m = 1;
    while m < 8 {
        // m · 2^-9: exponent ⌊log2 m⌋ − 9, the bits of m below its top one as mantissa.
        let top = 31 - (m as u32).leading_zeros();
        let mant = ((m as u32) << (7 - top)) & 0x7F;
        t[m] = (((127 - 9 + top) << 7) | mant) as u16;
        m += 1;
    }
    t
};

/// The first `k` elements (whole 32s) of one FP8 row as bf16 in their own order, each times its
/// block's scale (a power of two: added to the exponent field of every nonzero value):
/// in 16-bit lanes, a normal E4M3 magnitude `0eeeemmm` is the bf16 `(mag << 4) + (120 << 7)`
/// and the eight below 8 come from [`E4M3_LOW`], so every value, subnormals included, is
/// exact; no f32 in between.
///
/// # Safety
/// The CPU has AVX-512 F + BW; `w` holds the elements, `scales` (every `bc` elements one,
/// powers of two keeping every value a normal bf16, as [`runs`] checks) covers them, `dst`
/// has room for `k` values.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn fp8_row_bf16(w: *const u8, (scales, bc): (*const f32, usize), k: usize, dst: *mut u16) {
    use std::arch::x86_64::*;
    // SAFETY: the table is 64 bytes.
    let low = unsafe { _mm512_loadu_si512(E4M3_LOW.as_ptr().cast()) };
    let (mag_bits, bias) = (_mm512_set1_epi16(0x7F), _mm512_set1_epi16(120 << 7));
    let sign_bit = _mm512_set1_epi16(0x8000u16 as i16);
    for j in (0..k).step_by(K_STEP) {
        // SAFETY (every access): in bounds by the contract.
        unsafe {
            if j % 64 == 0 {
                super::prefetch(w.add(j), 64);
            }
            let t = ((*scales.add(j / bc)).to_bits() >> 23) as i16 - 127;
            let b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(w.add(j).cast()));
            let mag = _mm512_and_si512(b, mag_bits);
            let normal = _mm512_add_epi16(_mm512_slli_epi16::<4>(mag), bias);
            let small = _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8));
            let v = _mm512_mask_permutexvar_epi16(normal, small, mag, low);
            let nonzero = _mm512_test_epi16_mask(mag, mag);
            let v = _mm512_mask_add_epi16(v, nonzero, v, _mm512_set1_epi16(t << 7));
            let sign = _mm512_and_si512(_mm512_slli_epi16::<8>(b), sign_bit);
            _mm512_storeu_si512(dst.add(j).cast(), _mm512_or_si512(v, sign));
        }
    }
}

/// One FP4 row's `chunks` whole chunks decoded by the AVX-512 family (its element order,
/// times the group scales) and cut to bf16 in registers: the top half of each f32, exact
/// since every such value is a short significand times a power of two.
///
/// # Safety
/// The CPU has AVX-512 F + BW; the row holds the chunks, `s` its scales, `dst` room for
/// their values.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn fp4_row_bf16(w: *const u8, s: Fp4Scales, chunks: usize, dst: *mut u16) {
    use std::arch::x86_64::*;
    for c in 0..chunks {
        // SAFETY (all three): chunk c lies inside the row and `dst` (the contract).
        unsafe { super::prefetch(w.add(64 * c), 64) };
        let vs = unsafe { Avx512::fp4(w, &s, 0, c) };
        for (q, v) in vs.into_iter().enumerate() {
            let top = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(_mm512_castps_si512(v)));
            unsafe { _mm256_storeu_si256(dst.add(128 * c + 16 * q).cast(), top) };
        }
    }
}

/// Runs one tile (`rows` of the plan's matrix) against every activation row: per 32 weight
/// rows, the rows decoded to bf16, then every pair of activation blocks summed over the
/// whole inner dimension in the same steps, so a row's sums never depend on the batch.
/// (Decoding the rows piece by piece, to keep them in L1 for small batches, measured
/// slower: a tile load costs the same from L1 or L2 here.)
///
/// # Safety
/// AMX is available ([`crate::cpu::amx`]), the plan's matrix [`runs`] here, its laid-out
/// activations are in place, and no other running tile of this plan overlaps `rows`.
pub(crate) unsafe fn tile(plan: &Plan, rows: Range<usize>) {
    let w = plan.w();
    let (k, blocks) = (w.cols, plan.m.div_ceil(T));
    let block = |b: usize| plan.pairs.wrapping_add(b * T * k / 2);
    let mut c = [[0.0f32; T * T]; 4];
    // SAFETY: CONFIG is a valid palette-1 configuration.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const TileConfig, options(nostack)) };
    with_scratch2(ROW_STEP * k / 2, |abuf| {
        let a: &mut [u16] = bytemuck::cast_slice_mut(abuf);
        for r0 in rows.clone().step_by(ROW_STEP) {
            // SAFETY (every call below): as the function's; A holds ROW_STEP rows of k, B
            // `blocks` blocks of k / 2 rows (the plan's).
            unsafe { decode_rows(plan, (r0, rows.end), a) };
            let a_rows = (a.as_ptr(), a[T * k..].as_ptr(), 2 * k);
            for b in (0..blocks).step_by(2) {
                let b1 = (b + 1 < blocks).then(|| block(b + 1));
                unsafe {
                    zero_sums();
                    add_products(a_rows, (block(b), b1), k / K_STEP);
                    read_sums(&mut c, b1.is_some());
                }
                store(plan, (r0, rows.end), b, b1.is_some(), &c);
            }
        }
    });
    // SAFETY: releases this thread's tile state.
    unsafe { asm!("tilerelease", options(nostack)) };
}

/// Writes the C tiles of weight rows `r0..` (below `end`) and activation blocks `b`
/// (and `b + 1` when `two`) into the plan's outputs.
fn store(plan: &Plan, (r0, end): (usize, usize), b: usize, two: bool, c: &[[f32; T * T]; 4]) {
    for (q, tile) in c.iter().enumerate().take(if two { 4 } else { 2 }) {
        let (row0, col0) = (r0 + (q % 2) * T, (b + q / 2) * T);
        let rows = T.min(end.saturating_sub(row0));
        let cols = T.min(plan.m.saturating_sub(col0));
        for n in 0..cols {
            // SAFETY: rows row0..row0 + rows of activation row col0 + n belong to this
            // tile's outputs (`y: [m, n]`).
            let y = unsafe {
                std::slice::from_raw_parts_mut(
                    plan.y.add((col0 + n) * plan.n + row0 - plan.row0),
                    rows,
                )
            };
            for (r, v) in y.iter_mut().enumerate() {
                *v = tile[r * T + n];
            }
        }
    }
}
