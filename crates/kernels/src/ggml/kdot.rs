//! Integer dot products of a row of 256-blocks (Q2_K, Q4_K, Q6_K or IQ2_XXS weights) with
//! Q8_K activations, as llama.cpp's CPU backend computes them (`ggml_vec_dot_q2_K_q8_K`,
//! `_q4_K_q8_K`, `_q6_K_q8_K`, `_iq2_xxs_q8_K`): per super-block, each sub-block's codes
//! (IQ2_XXS: grid points with their signs) multiplied in integers and weighted by the
//! sub-block's scale, the offsets taken off through the activations' 16-sums, all exact in
//! `i32`; then `d_w · d_x` (and `dmin_w · d_x`) once per super-block in f32.
//!
//! Every family computes the same integers and the same float steps in the same order, so
//! their results are equal bit for bit; a row's result depends on that row alone.

use super::grids::{grids, signs};
use super::half;
use super::iquants::iq2_xxs_group;
use super::kquants::{self, QK_K};
use super::q8k::Q8KRow;
use super::Block;

/// Q4_K's eight six-bit sub-block scales and offsets ([`kquants::scale_min`]).
fn q4_k_scales(s: &[u8]) -> ([i32; 8], [i32; 8]) {
    let mut sc = [0i32; 8];
    let mut m = [0i32; 8];
    for j in 0..8 {
        let (a, b) = kquants::scale_min(j, s);
        (sc[j], m[j]) = (a as i32, b as i32);
    }
    (sc, m)
}

/// One super-block's contribution, from its integer sums.
#[inline(always)]
fn scaled(d: f32, dmin: f32, xd: f32, sumi: i32, summ: i32) -> f32 {
    (d * xd) * sumi as f32 - (dmin * xd) * summ as f32
}

/// The offsets' integer part of a Q4_K super-block: `Σ_j m_j · (bsum_2j + bsum_2j+1)`.
fn q4_k_mins(m: &[i32; 8], bsums: &[i16]) -> i32 {
    (0..8)
        .map(|j| m[j] * (bsums[2 * j] as i32 + bsums[2 * j + 1] as i32))
        .sum()
}

/// Q6_K's offset (every code less 32) through the 16-sums: `32 · Σ_j sc_j · bsum_j`.
fn q6_k_offset(sc: &[u8], bsums: &[i16]) -> i32 {
    32 * (0..16)
        .map(|j| sc[j] as i8 as i32 * bsums[j] as i32)
        .sum::<i32>()
}

/// Q2_K's offsets through the 16-sums: `Σ_j m_j · bsum_j`, `m_j` the high nibble of scale
/// byte `j`.
fn q2_k_mins(sc: &[u8], bsums: &[i16]) -> i32 {
    (0..16).map(|j| (sc[j] >> 4) as i32 * bsums[j] as i32).sum()
}

/// Super-block of a Q2_K row: `Σ_j sc_j Σ_l q_w q_x` over its 16 sub-blocks of 16 (the
/// scales' low nibbles). Per 128 values, the four 2-bit planes of 32 code bytes.
fn q2_k_sumi(wb: &[u8], xq: &[i8]) -> i32 {
    let (sc, qs) = (&wb[..16], &wb[16..80]);
    let mut sumi = 0;
    for half_no in 0..2 {
        for plane in 0..4 {
            for part in 0..2 {
                let at = 32 * half_no + 16 * part;
                let x = &xq[128 * half_no + 32 * plane + 16 * part..];
                let s: i32 = (0..16)
                    .map(|l| ((qs[at + l] >> (2 * plane)) & 3) as i32 * x[l] as i32)
                    .sum();
                sumi += (sc[8 * half_no + 2 * plane + part] & 0xF) as i32 * s;
            }
        }
    }
    sumi
}

/// Super-block of an IQ2_XXS row: `Σ_ib (2 s_ib + 1) Σ_l ±point_l · q_x` over its 8 groups
/// of 32 (the `db` of the decode is `d · (2s + 1) / 8`; the `/ 8` is applied in f32).
fn iq2_xxs_sumi(wb: &[u8], xq: &[i8]) -> i32 {
    let grid = &grids().iq2xxs;
    let mut sumi = 0;
    for ib in 0..8 {
        let (idx, sg) = iq2_xxs_group(wb, ib);
        let mut s = 0i32;
        for l in 0..4 {
            let point = grid.point(((idx >> (8 * l)) & 0xFF) as usize);
            let sign = signs(sg >> (7 * l));
            for (j, &p) in point.iter().enumerate() {
                let v = p as i32 * xq[32 * ib + 8 * l + j] as i32;
                s += if sign & (1 << j) != 0 { -v } else { v };
            }
        }
        sumi += (2 * (sg >> 28) as i32 + 1) * s;
    }
    sumi
}

/// Super-block `b` of a Q4_K row against one activation row: `Σ_j sc_j Σ_l q_w q_x`.
fn q4_k_sumi(wb: &[u8], sc: &[i32; 8], xq: &[i8]) -> i32 {
    let qs = &wb[16..144];
    let mut sumi = 0;
    for i in 0..4 {
        let (lo, hi) = (&xq[64 * i..64 * i + 32], &xq[64 * i + 32..64 * i + 64]);
        let q = &qs[32 * i..32 * i + 32];
        let s_lo: i32 = q
            .iter()
            .zip(lo)
            .map(|(&c, &x)| (c & 0xF) as i32 * x as i32)
            .sum();
        let s_hi: i32 = q
            .iter()
            .zip(hi)
            .map(|(&c, &x)| (c >> 4) as i32 * x as i32)
            .sum();
        sumi += sc[2 * i] * s_lo + sc[2 * i + 1] * s_hi;
    }
    sumi
}

/// Super-block `b` of a Q6_K row: `Σ_j sc_j Σ_l (q_w + 32) q_x` (the 32 taken off apart).
fn q6_k_sumi(wb: &[u8], xq: &[i8]) -> i32 {
    let (ql, qh, sc) = (&wb[..128], &wb[128..192], &wb[192..208]);
    let mut sumi = 0;
    for n in 0..2 {
        for g in 0..4 {
            for half_no in 0..2 {
                let mut s = 0i32;
                for l in 16 * half_no..16 * half_no + 16 {
                    let byte = ql[64 * n + 32 * (g % 2) + l];
                    let nib = if g < 2 { byte & 0xF } else { byte >> 4 };
                    let q = nib | (((qh[32 * n + l] >> (2 * g)) & 3) << 4);
                    s += q as i32 * xq[128 * n + 32 * g + l] as i32;
                }
                sumi += sc[8 * n + 2 * g + half_no] as i8 as i32 * s;
            }
        }
    }
    sumi
}

/// The blocks [`kdots`] multiplies in integers.
pub const BLOCKS: [Block; 4] = [Block::Q2K, Block::Q4K, Block::Q6K, Block::Iq2Xxs];

/// The dots of weight row `w` (whole super-blocks of one of [`BLOCKS`]) with each row of
/// `xs`, a family's integer sums given by `sumi(super-block, Q4_K's scales, activation
/// codes)` (`Σ_j sc_j Σ_l q_w q_x`, Q6_K's codes plus 32): the scales, the offsets and every
/// float step are here, once for every family, so that equal sums give equal bits.
#[inline(always)]
fn kdots(
    block: Block,
    w: &[u8],
    xs: &[&Q8KRow],
    out: &mut [f32],
    sumi: impl Fn(&[u8], &[i32; 8], &[i8]) -> i32,
) {
    assert!(
        BLOCKS.contains(&block),
        "{} has no integer dots",
        block.name()
    );
    let mut acc = [0.0f32; super::dot::M_MAX];
    for (b, wb) in w.chunks_exact(block.bytes()).enumerate() {
        let (sc, m) = match block {
            Block::Q4K => q4_k_scales(&wb[4..16]),
            _ => ([0; 8], [0; 8]),
        };
        for (x, acc) in xs.iter().zip(acc.iter_mut()) {
            let xq = &x.q[b * QK_K..(b + 1) * QK_K];
            let bsums = &x.bsums[16 * b..16 * b + 16];
            let s = sumi(wb, &sc, xq);
            *acc += match block {
                Block::Q4K => scaled(half(wb, 0), half(wb, 2), x.d[b], s, q4_k_mins(&m, bsums)),
                Block::Q6K => {
                    let s = s - q6_k_offset(&wb[192..208], bsums);
                    scaled(half(wb, 208), 0.0, x.d[b], s, 0)
                }
                Block::Q2K => {
                    let mins = q2_k_mins(&wb[..16], bsums);
                    scaled(half(wb, 80), half(wb, 82), x.d[b], s, mins)
                }
                // ggml scales the row's sum by 1/8 once; a power of two, so alike per block.
                _ => 0.125 * scaled(half(wb, 0), 0.0, x.d[b], s, 0),
            };
        }
    }
    out[..xs.len()].copy_from_slice(&acc[..xs.len()]);
}

/// [`kdots`] on the portable integer sums: the values every family gives.
pub fn kdots_scalar(block: Block, w: &[u8], xs: &[&Q8KRow], out: &mut [f32]) {
    kdots(block, w, xs, out, |wb, sc, xq| match block {
        Block::Q4K => q4_k_sumi(wb, sc, xq),
        Block::Q6K => q6_k_sumi(wb, xq),
        Block::Q2K => q2_k_sumi(wb, xq),
        _ => iq2_xxs_sumi(wb, xq),
    });
}

/// [`kdots`] on AVX2 sums: the codes of 32 values at a time on `vpmaddubsw` (weight codes
/// unsigned, activation codes signed), weighted by their sub-blocks' scales on `vpmaddwd`;
/// the same integers, so the same results.
///
/// # Safety
/// The CPU has AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn kdots_avx2(block: Block, w: &[u8], xs: &[&Q8KRow], out: &mut [f32]) {
    // SAFETY: the caller promises AVX2; `kdots` hands whole super-blocks and 256 codes.
    kdots(block, w, xs, out, |wb, sc, xq| unsafe {
        match block {
            Block::Q4K => q4_k_sumi_avx2(wb, sc, xq),
            Block::Q6K => q6_k_sumi_avx2(wb, xq),
            Block::Q2K => q2_k_sumi_avx2(wb, xq),
            _ => iq2_xxs_sumi_avx2(wb, xq),
        }
    });
}

/// [`q4_k_sumi`] on AVX2.
///
/// # Safety
/// The CPU has AVX2; `wb` is a whole Q4_K super-block and `xq` 256 codes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn q4_k_sumi_avx2(wb: &[u8], sc: &[i32; 8], xq: &[i8]) -> i32 {
    use std::arch::x86_64::*;
    let low = _mm256_set1_epi8(0xF);
    let mut v = _mm256_setzero_si256();
    for i in 0..4 {
        // SAFETY (the loads): 32 bytes inside `wb` (144) and `xq` (256).
        let q = unsafe { _mm256_loadu_si256(wb[16 + 32 * i..].as_ptr().cast()) };
        let xl = unsafe { _mm256_loadu_si256(xq[64 * i..].as_ptr().cast()) };
        let xh = unsafe { _mm256_loadu_si256(xq[64 * i + 32..].as_ptr().cast()) };
        let lo = _mm256_maddubs_epi16(_mm256_and_si256(q, low), xl);
        let hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), low), xh);
        let s_lo = _mm256_set1_epi16(sc[2 * i] as i16);
        let s_hi = _mm256_set1_epi16(sc[2 * i + 1] as i16);
        v = _mm256_add_epi32(v, _mm256_madd_epi16(lo, s_lo));
        v = _mm256_add_epi32(v, _mm256_madd_epi16(hi, s_hi));
    }
    hsum(v)
}

/// [`q6_k_sumi`] on AVX2.
///
/// # Safety
/// The CPU has AVX2; `wb` is a whole Q6_K super-block and `xq` 256 codes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn q6_k_sumi_avx2(wb: &[u8], xq: &[i8]) -> i32 {
    use std::arch::x86_64::*;
    let (ql, qh, sc) = (&wb[..128], &wb[128..192], &wb[192..208]);
    let (low, three) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(3));
    let mut v = _mm256_setzero_si256();
    for n in 0..2 {
        // SAFETY (the loads): 32 bytes inside `ql` (128), `qh` (64) and `xq` (256).
        let h = unsafe { _mm256_loadu_si256(qh[32 * n..].as_ptr().cast()) };
        let l0 = unsafe { _mm256_loadu_si256(ql[64 * n..].as_ptr().cast()) };
        let l1 = unsafe { _mm256_loadu_si256(ql[64 * n + 32..].as_ptr().cast()) };
        for g in 0..4 {
            let byte = if g % 2 == 0 { l0 } else { l1 };
            let nib = if g < 2 {
                _mm256_and_si256(byte, low)
            } else {
                _mm256_and_si256(_mm256_srli_epi16(byte, 4), low)
            };
            let hb = _mm256_and_si256(shift_right(h, 2 * g), three);
            let q = _mm256_or_si256(nib, _mm256_slli_epi16(hb, 4));
            let xv = unsafe { _mm256_loadu_si256(xq[128 * n + 32 * g..].as_ptr().cast()) };
            let p = _mm256_maddubs_epi16(q, xv);
            let s = halves(
                sc[8 * n + 2 * g] as i8 as i16,
                sc[8 * n + 2 * g + 1] as i8 as i16,
            );
            v = _mm256_add_epi32(v, _mm256_madd_epi16(p, s));
        }
    }
    hsum(v)
}

/// 16 `i16` multipliers: `s0` for the low 8 lanes (the first 16 bytes' pairs), `s1` for
/// the high 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn halves(s0: i16, s1: i16) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    _mm256_setr_epi16(
        s0, s0, s0, s0, s0, s0, s0, s0, s1, s1, s1, s1, s1, s1, s1, s1,
    )
}

/// [`q2_k_sumi`] on AVX2: each 32 code bytes hold four planes; a plane's 32 codes are two
/// sub-blocks of 16, one per half of the `vpmaddubsw` result.
///
/// # Safety
/// The CPU has AVX2; `wb` is a whole Q2_K super-block and `xq` 256 codes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn q2_k_sumi_avx2(wb: &[u8], xq: &[i8]) -> i32 {
    use std::arch::x86_64::*;
    let (sc, three) = (&wb[..16], _mm256_set1_epi8(3));
    let mut v = _mm256_setzero_si256();
    for half_no in 0..2 {
        // SAFETY (the loads): 32 bytes inside `wb` (84) and `xq` (256).
        let q = unsafe { _mm256_loadu_si256(wb[16 + 32 * half_no..].as_ptr().cast()) };
        for plane in 0..4 {
            let codes = _mm256_and_si256(shift_right(q, 2 * plane), three);
            let at = 128 * half_no + 32 * plane;
            let xv = unsafe { _mm256_loadu_si256(xq[at..].as_ptr().cast()) };
            let p = _mm256_maddubs_epi16(codes, xv);
            let s = 8 * half_no + 2 * plane;
            let s = halves((sc[s] & 0xF) as i16, (sc[s + 1] & 0xF) as i16);
            v = _mm256_add_epi32(v, _mm256_madd_epi16(p, s));
        }
    }
    hsum(v)
}

/// [`iq2_xxs_sumi`] on AVX2: per 32 values, the four grid points (unsigned bytes) as one
/// vector, their signs moved onto the activation codes by `vpsignb` (Q8_K codes are never
/// −128, so negating one is exact), `vpmaddubsw`, then the group's scale on `vpmaddwd`.
///
/// # Safety
/// The CPU has AVX2; `wb` is a whole IQ2_XXS super-block and `xq` 256 codes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn iq2_xxs_sumi_avx2(wb: &[u8], xq: &[i8]) -> i32 {
    use super::grids::SIGN_BYTES;
    use std::arch::x86_64::*;
    let grid = &grids().iq2xxs;
    let mut v = _mm256_setzero_si256();
    for ib in 0..8 {
        let (idx, sg) = iq2_xxs_group(wb, ib);
        let point = |l: u32| grid.word(((idx >> (8 * l)) & 0xFF) as usize) as i64;
        let sign = |l: u32| SIGN_BYTES[((sg >> (7 * l)) & 127) as usize] as i64;
        let g = _mm256_set_epi64x(point(3), point(2), point(1), point(0));
        let s = _mm256_set_epi64x(sign(3), sign(2), sign(1), sign(0));
        // SAFETY: 32 codes inside `xq` (256).
        let xv = unsafe { _mm256_loadu_si256(xq[32 * ib..].as_ptr().cast()) };
        let p = _mm256_maddubs_epi16(g, _mm256_sign_epi8(xv, s));
        let ls = _mm256_set1_epi16(2 * (sg >> 28) as i16 + 1);
        v = _mm256_add_epi32(v, _mm256_madd_epi16(p, ls));
    }
    hsum(v)
}

/// `v >> s` in every byte (`s` < 8): a 16-bit shift, the bits that crossed masked by the
/// caller.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn shift_right(v: std::arch::x86_64::__m256i, s: usize) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    _mm256_srl_epi16(v, _mm_cvtsi32_si128(s as i32))
}

/// The eight `i32` lanes' sum.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn hsum(v: std::arch::x86_64::__m256i) -> i32 {
    use std::arch::x86_64::*;
    let t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0b01_00_11_10));
    _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0b10_11_00_01)))
}
