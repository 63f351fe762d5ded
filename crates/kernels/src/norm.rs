//! RMS normalisation, computed in f32 as the HF reference does.

/// `1 / sqrt(mean(x²) + eps)`.
#[inline]
pub fn rms_factor(x: &[f32], eps: f32) -> f32 {
    let ss: f32 = crate::vector::dot(x, x);
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}

/// Weighted RMSNorm in place: `x ← w ⊙ (x · rsqrt(mean(x²) + eps))`.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    debug_assert_eq!(x.len(), w.len());
    let r = rms_factor(x, eps);
    for (v, g) in x.iter_mut().zip(w) {
        *v = g * (*v * r);
    }
}

/// RMSNorm without a gain, in place (V4's per-head query norm).
pub fn rms_norm_unweighted(x: &mut [f32], eps: f32) {
    let r = rms_factor(x, eps);
    for v in x.iter_mut() {
        *v *= r;
    }
}

/// Weighted RMSNorm of every `w.len()`-wide row of `x`.
pub fn rms_norm_rows(x: &mut [f32], w: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(w.len()) {
        rms_norm(row, w, eps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_rms_after_unweighted_norm() {
        let mut x = vec![3.0f32, -4.0, 0.0, 12.0];
        rms_norm_unweighted(&mut x, 0.0);
        let ms: f32 = x.iter().map(|v| v * v).sum::<f32>() / 4.0;
        assert!((ms - 1.0).abs() < 1e-6);
        let mut y = vec![1.0f32, 1.0];
        rms_norm(&mut y, &[2.0, -0.5], 0.0);
        assert_eq!(y, vec![2.0, -0.5]);
    }
}
