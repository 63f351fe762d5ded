//! Dense f32 linear layers: `y = x · Wᵀ` with `W` stored `[out, in]` row-major, as in
//! safetensors. This is the reference path the quantised kernels will be checked against.

use rayon::prelude::*;

/// Rows of `W` handed to one rayon task: large enough to amortise scheduling, small enough
/// that two cores share the work of a decode-sized matvec.
const ROW_BLOCK: usize = 64;

/// Multiply-adds under which a matmul runs on the calling thread.
const SERIAL_WORK: usize = 1 << 17;

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

/// `y[m, n] = Σ_k x[m, k] · w[n, k]` for `x: [m, k]`, `w: [n, k]`; returns `[m, n]`.
pub fn matmul_t(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "matmul_t: x is not [m, k]");
    assert_eq!(w.len(), n * k, "matmul_t: w is not [n, k]");
    let mut y = vec![0.0f32; m * n];
    if m == 0 || n == 0 {
        return y;
    }
    // Below this much work a rayon fork costs more than it saves.
    if m * n * k < SERIAL_WORK {
        for (xr, yr) in x.chunks_exact(k).zip(y.chunks_exact_mut(n)) {
            for (r, out) in yr.iter_mut().enumerate() {
                *out = dot(xr, &w[r * k..(r + 1) * k]);
            }
        }
        return y;
    }
    // Work is split over output columns (weight rows) so that every weight row is read once
    // per call and stays hot in cache across all m activation rows.
    let blocks = n.div_ceil(ROW_BLOCK);
    let parts: Vec<Vec<f32>> = (0..blocks)
        .into_par_iter()
        .map(|b| {
            let r0 = b * ROW_BLOCK;
            let r1 = (r0 + ROW_BLOCK).min(n);
            let mut out = vec![0.0f32; m * (r1 - r0)];
            for (i, xr) in x.chunks_exact(k).enumerate() {
                for r in r0..r1 {
                    out[i * (r1 - r0) + (r - r0)] = dot(xr, &w[r * k..(r + 1) * k]);
                }
            }
            out
        })
        .collect();
    for (b, part) in parts.iter().enumerate() {
        let r0 = b * ROW_BLOCK;
        let width = part.len() / m;
        for i in 0..m {
            y[i * n + r0..i * n + r0 + width].copy_from_slice(&part[i * width..(i + 1) * width]);
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f64> {
        let mut y = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                y[i * n + j] = (0..k)
                    .map(|t| x[i * k + t] as f64 * w[j * k + t] as f64)
                    .sum();
            }
        }
        y
    }

    #[test]
    fn matches_f64_reference_on_ragged_shapes() {
        for &(m, k, n) in &[(1, 1, 1), (3, 7, 5), (5, 33, 130), (2, 192, 65), (0, 4, 3)] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 31.0)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 29.0)
                .collect();
            let y = matmul_t(&x, m, k, &w, n);
            let r = naive(&x, m, k, &w, n);
            for (a, b) in y.iter().zip(&r) {
                assert!(
                    (*a as f64 - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{a} vs {b}"
                );
            }
        }
    }
}
