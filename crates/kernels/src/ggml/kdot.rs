//! Integer dot products of a row of K-quant blocks (Q4_K or Q6_K weights) with Q8_K
//! activations, as llama.cpp's CPU backend computes them (`ggml_vec_dot_q4_K_q8_K`,
//! `ggml_vec_dot_q6_K_q8_K`): per super-block, each sub-block's codes multiplied in
//! integers and weighted by the sub-block's scale, the offsets taken off through the
//! activations' 16-sums, all exact in `i32`; then `d_w · d_x` (and `dmin_w · d_x`) once per
//! super-block in f32.
//!
//! Every family computes the same integers and the same float steps in the same order, so
//! their results are equal bit for bit; a row's result depends on that row alone.

use super::half;
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
fn q4_k_mins(m: &[i32; 8], bsums: &[i32]) -> i32 {
    (0..8)
        .map(|j| m[j] * (bsums[2 * j] + bsums[2 * j + 1]))
        .sum()
}

/// Q6_K's offset (every code less 32) through the 16-sums: `32 · Σ_j sc_j · bsum_j`.
fn q6_k_offset(sc: &[u8], bsums: &[i32]) -> i32 {
    32 * (0..16).map(|j| sc[j] as i8 as i32 * bsums[j]).sum::<i32>()
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

/// The dots of K-quant weight row `w` (whole super-blocks) with each row of `xs`, a
/// family's integer sums given by `sumi(super-block, Q4_K's scales, activation codes)`
/// (`Σ_j sc_j Σ_l q_w q_x`, Q6_K's codes plus 32): the scales, the offsets and every float
/// step are here, once for every family, so that equal sums give equal bits.
#[inline(always)]
fn kdots(
    block: Block,
    w: &[u8],
    xs: &[&Q8KRow],
    out: &mut [f32],
    sumi: impl Fn(&[u8], &[i32; 8], &[i8]) -> i32,
) {
    let mut acc = [0.0f32; super::dot::M_MAX];
    for (b, wb) in w.chunks_exact(block.bytes()).enumerate() {
        let (sc, m) = match block {
            Block::Q4K => q4_k_scales(&wb[4..16]),
            Block::Q6K => ([0; 8], [0; 8]),
            other => unreachable!("{} has no K-quant integer dots", other.name()),
        };
        for (x, acc) in xs.iter().zip(acc.iter_mut()) {
            let xq = &x.q[b * QK_K..(b + 1) * QK_K];
            let bsums = &x.bsums[16 * b..16 * b + 16];
            let s = sumi(wb, &sc, xq);
            *acc += if block == Block::Q4K {
                scaled(half(wb, 0), half(wb, 2), x.d[b], s, q4_k_mins(&m, bsums))
            } else {
                let s = s - q6_k_offset(&wb[192..208], bsums);
                scaled(half(wb, 208), 0.0, x.d[b], s, 0)
            };
        }
    }
    out[..xs.len()].copy_from_slice(&acc[..xs.len()]);
}

/// [`kdots`] on the portable integer sums: the values every family gives.
pub fn kdots_scalar(block: Block, w: &[u8], xs: &[&Q8KRow], out: &mut [f32]) {
    kdots(block, w, xs, out, |wb, sc, xq| match block {
        Block::Q4K => q4_k_sumi(wb, sc, xq),
        _ => q6_k_sumi(wb, xq),
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
            _ => q6_k_sumi_avx2(wb, xq),
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
            let s0 = sc[8 * n + 2 * g] as i8 as i16;
            let s1 = sc[8 * n + 2 * g + 1] as i8 as i16;
            let s = _mm256_setr_epi16(
                s0, s0, s0, s0, s0, s0, s0, s0, s1, s1, s1, s1, s1, s1, s1, s1,
            );
            v = _mm256_add_epi32(v, _mm256_madd_epi16(p, s));
        }
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
