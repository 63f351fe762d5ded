//! Products of F16 weight rows with f32 activation rows (in gguf numerics already rounded
//! to f16, as `ggml_vec_dot_f16` reads them): each half widened exactly, then fused
//! multiply-adds into eight lanes, lane `l` taking inputs `l, l + 8, …`, and the lanes
//! summed in one fixed tree. The scalar and AVX2 paths follow that order step for step, so
//! they give the same bits; a row's result depends on that row alone.

use super::dot::M_MAX;
use crate::formats::f16_to_f32;

/// The eight lanes' sum: `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`, as the AVX2
/// reduction below adds them.
#[inline(always)]
fn tree(a: [f32; 8]) -> f32 {
    let s = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (s[0] + s[2]) + (s[1] + s[3])
}

/// The dots of weight row `w` (`k` halves, `k` a multiple of 8) with each row of `xs`.
pub fn dots_scalar(w: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    for (x, o) in xs.iter().zip(out.iter_mut()) {
        let mut acc = [0.0f32; 8];
        for (wc, xc) in w.chunks_exact(16).zip(x.chunks_exact(8)) {
            for l in 0..8 {
                let v = f16_to_f32(u16::from_le_bytes([wc[2 * l], wc[2 * l + 1]]));
                acc[l] = v.mul_add(xc[l], acc[l]);
            }
        }
        *o = tree(acc);
    }
}

/// [`dots_scalar`] on AVX2: eight halves widened by `vcvtph2ps` once for up to [`M_MAX`]
/// activation rows.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` holds `8n` halves and every row of `xs` `8n` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dots_avx2(w: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    use std::arch::x86_64::*;
    debug_assert!(xs.len() <= M_MAX && xs.iter().all(|x| 2 * x.len() == w.len()));
    let mut acc = [_mm256_setzero_ps(); M_MAX];
    for (c, wc) in w.chunks_exact(16).enumerate() {
        // SAFETY: 16 bytes inside `w`; 8 floats inside each row (the caller's lengths).
        let v = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(wc.as_ptr().cast()) });
        for (a, x) in acc.iter_mut().zip(xs) {
            let xv = unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * c)) };
            *a = _mm256_fmadd_ps(v, xv, *a);
        }
    }
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        let t = _mm_add_ps(_mm256_castps256_ps128(*a), _mm256_extractf128_ps(*a, 1));
        let t = _mm_add_ps(t, _mm_movehl_ps(t, t));
        *o = _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
    }
}
