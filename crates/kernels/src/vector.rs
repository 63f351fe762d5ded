//! Vector primitives the model's non-matmul work is made of (attention scores and weighted
//! sums, norms, the residual streams' mixing), with the same run-time dispatch as the
//! matrix kernels: the build targets baseline x86-64, so without this the compiler would
//! only use 128-bit SSE2 and no FMA for them.

use crate::cpu::isa;

/// `Σ a[i] · b[i]` (eight partial sums; the AVX2 path four vectors of eight).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if isa().has_avx2() {
        // SAFETY: AVX2 and FMA are present (that is what `Isa::Avx2` means); lengths match.
        return unsafe { avx2::dot(a, b) };
    }
    dot_portable(a, b)
}

/// Dot product with eight independent partial sums, so the compiler can vectorise it and
/// the rounding error grows like a tree rather than a chain. Plain multiply-add, not
/// `mul_add`: without a compile-time FMA target that becomes a libm call per element.
#[inline]
pub fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
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

/// `y[i] += alpha · x[i]`.
#[inline]
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len(), "axpy: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if isa().has_avx2() {
        // SAFETY: as in `dot`.
        return unsafe { avx2::axpy(y, alpha, x) };
    }
    for (o, v) in y.iter_mut().zip(x) {
        *o += alpha * v;
    }
}

/// `y[i] *= alpha`.
#[inline]
pub fn scale(y: &mut [f32], alpha: f32) {
    #[cfg(target_arch = "x86_64")]
    if isa().has_avx2() {
        // SAFETY: as in `dot`.
        return unsafe { avx2::scale(y, alpha) };
    }
    for o in y.iter_mut() {
        *o *= alpha;
    }
}

/// `x[i] ← exp(x[i])`, to within a couple of ulp (Cephes' polynomial); inputs below
/// about -87.3 give about 1e-38 rather than 0, which no softmax or sigmoid can tell apart.
pub fn exp_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa().has_avx2() {
        // SAFETY: as in `dot`.
        return unsafe { avx2::exp_in_place(x) };
    }
    for v in x.iter_mut() {
        *v = v.exp();
    }
}

/// The largest element (`-inf` for an empty slice).
pub fn max(x: &[f32]) -> f32 {
    x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// `Σ x[i]`.
pub fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// The sum of the eight lanes (the AVX2 kernels' horizontal reduction).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }

    /// # Safety
    /// `a.len() == b.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (q, v) in acc.iter_mut().enumerate() {
                // SAFETY: i + 32 <= n for both slices.
                let (x, y) = unsafe {
                    (
                        _mm256_loadu_ps(pa.add(i + 8 * q)),
                        _mm256_loadu_ps(pb.add(i + 8 * q)),
                    )
                };
                *v = _mm256_fmadd_ps(x, y, *v);
            }
            i += 32;
        }
        while i + 8 <= n {
            // SAFETY: i + 8 <= n.
            let (x, y) = unsafe { (_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i))) };
            acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut s = hsum(v);
        for j in i..n {
            s += a[j] * b[j];
        }
        s
    }

    /// # Safety
    /// `y.len() == x.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
        let n = y.len();
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let a = _mm256_set1_ps(alpha);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n for both slices.
            unsafe {
                let v = _mm256_fmadd_ps(a, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
                _mm256_storeu_ps(py.add(i), v);
            }
            i += 8;
        }
        for j in i..n {
            y[j] += alpha * x[j];
        }
    }

    /// Cephes `expf`: `2^n · p(r)` with `r = x − n·ln 2` split in two constants.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn exp8(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(-87.33)),
            _mm256_set1_ps(88.37),
        );
        let n = _mm256_floor_ps(_mm256_fmadd_ps(
            x,
            _mm256_set1_ps(std::f32::consts::LOG2_E),
            _mm256_set1_ps(0.5),
        ));
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let p = _mm256_fmadd_ps(
            p,
            _mm256_mul_ps(r, r),
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        );
        let pow2 = _mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
            23,
        );
        _mm256_mul_ps(p, _mm256_castsi256_ps(pow2))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn exp_in_place(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: c has 8 elements.
            unsafe { _mm256_storeu_ps(c.as_mut_ptr(), exp8(_mm256_loadu_ps(c.as_ptr()))) };
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let mut buf = [0.0f32; 8];
            buf[..rest.len()].copy_from_slice(rest);
            // SAFETY: buf has 8 elements.
            unsafe { _mm256_storeu_ps(buf.as_mut_ptr(), exp8(_mm256_loadu_ps(buf.as_ptr()))) };
            rest.copy_from_slice(&buf[..rest.len()]);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn scale(y: &mut [f32], alpha: f32) {
        let a = _mm256_set1_ps(alpha);
        let mut chunks = y.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: c has 8 elements.
            unsafe {
                let v = _mm256_mul_ps(a, _mm256_loadu_ps(c.as_ptr()));
                _mm256_storeu_ps(c.as_mut_ptr(), v);
            }
        }
        for v in chunks.into_remainder() {
            *v *= alpha;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cpu::{families, with_isa};

    #[test]
    fn exp_is_accurate_over_the_softmax_range() {
        for family in families() {
            with_isa(family, exp_is_accurate);
        }
    }

    fn exp_is_accurate() {
        let mut x: Vec<f32> = (0..20001).map(|i| -87.0 + i as f32 * 0.0087).collect();
        x.extend([0.0, -0.0, 1e-8, -1e-8, 88.0]);
        let want: Vec<f64> = x.iter().map(|&v| (v as f64).exp()).collect();
        exp_in_place(&mut x);
        for (g, w) in x.iter().zip(&want) {
            assert!(((*g as f64) - w).abs() <= 3e-7 * w, "{g} vs {w}");
        }
        let mut tiny = [-200.0f32, -1e30, f32::NEG_INFINITY];
        exp_in_place(&mut tiny);
        assert!(tiny.iter().all(|&v| (0.0..1e-37).contains(&v)));
    }

    #[test]
    fn match_plain_loops_at_every_length() {
        for family in families() {
            with_isa(family, || {
                assert_eq!(isa(), family, "the test runs the family it names");
                match_plain_loops()
            });
        }
    }

    fn match_plain_loops() {
        for n in [0usize, 1, 7, 8, 9, 31, 32, 33, 100, 512] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 37 % 19) as f32 - 9.0) / 7.0).collect();
            let b: Vec<f32> = (0..n)
                .map(|i| ((i * 11 % 23) as f32 - 11.0) / 5.0)
                .collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!(
                (dot(&a, &b) as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                "n={n}"
            );
            let mut y = b.clone();
            axpy(&mut y, 0.5, &a);
            for i in 0..n {
                assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
            }
            scale(&mut y, 2.0);
            for i in 0..n {
                assert!((y[i] - 2.0 * (b[i] + 0.5 * a[i])).abs() < 1e-5);
            }
        }
    }
}
