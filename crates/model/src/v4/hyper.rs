//! Manifold-constrained hyper-connections (mHC, spec §3.3): the residual is `hc` streams per
//! token; each sublayer collapses them with learned weights and writes back through a
//! Sinkhorn-normalised mixing matrix.

use crate::config::ModelConfig;
use crate::weights::{HyperWeights, Linear};
use deepinfer_kernels::norm::rms_factor;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `(x · rsqrt(mean(x²)+eps)) · fnᵀ` for every token's flattened streams `[T, hc·D]`.
fn normed_mix(x: &[f32], t: usize, f: &Linear, eps: f32) -> Vec<f32> {
    let width = f.in_dim();
    let mut normed = x.to_vec();
    for row in normed.chunks_exact_mut(width) {
        let r = rms_factor(row, eps);
        row.iter_mut().for_each(|v| *v *= r);
    }
    f.forward(&normed, t)
}

/// Per-token mixing weights of one sublayer.
pub struct HyperMix {
    pub hc: usize,
    /// `[T, hc]`.
    pub post: Vec<f32>,
    /// `[T, hc, hc]`: `comb[j][k]` carries source stream `j` into destination `k`.
    pub comb: Vec<f32>,
    /// The collapsed sublayer input `Σ_c pre[c]·X[c]`, `[T, D]`.
    pub collapsed: Vec<f32>,
}

/// Computes `pre`, `post` and the Sinkhorn-projected `comb` from the streams `x: [T, hc, D]`
/// and collapses the streams with `pre`.
pub fn hc_mix(x: &[f32], t: usize, w: &HyperWeights, c: &ModelConfig) -> HyperMix {
    let (d, hc, iters, hc_eps) = (c.hidden_size, c.hc_mult, c.hc_sinkhorn_iters, c.hc_eps);
    let mix = normed_mix(x, t, &w.fn_, c.rms_norm_eps);
    let m = (2 + hc) * hc;
    let mut post = vec![0.0f32; t * hc];
    let mut comb = vec![0.0f32; t * hc * hc];
    let mut collapsed = vec![0.0f32; t * d];
    for i in 0..t {
        let mi = &mix[i * m..(i + 1) * m];
        let pre: Vec<f32> = (0..hc)
            .map(|j| sigmoid(mi[j] * w.scale[0] + w.base[j]) + hc_eps)
            .collect();
        for j in 0..hc {
            post[i * hc + j] = 2.0 * sigmoid(mi[hc + j] * w.scale[1] + w.base[hc + j]);
        }
        let c = &mut comb[i * hc * hc..(i + 1) * hc * hc];
        for j in 0..hc {
            let row = &mut c[j * hc..(j + 1) * hc];
            for k in 0..hc {
                row[k] = mi[2 * hc + j * hc + k] * w.scale[2] + w.base[2 * hc + j * hc + k];
            }
            let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let mut s = 0.0;
            for v in row.iter_mut() {
                *v = (*v - mx).exp();
                s += *v;
            }
            for v in row.iter_mut() {
                *v = *v / s + hc_eps;
            }
        }
        normalise_columns(c, hc, hc_eps);
        for _ in 1..iters {
            normalise_rows(c, hc, hc_eps);
            normalise_columns(c, hc, hc_eps);
        }
        let out = &mut collapsed[i * d..(i + 1) * d];
        for (s, p) in pre.iter().enumerate() {
            let xs = &x[(i * hc + s) * d..(i * hc + s + 1) * d];
            for (o, v) in out.iter_mut().zip(xs) {
                *o += p * v;
            }
        }
    }
    HyperMix {
        hc,
        post,
        comb,
        collapsed,
    }
}

fn normalise_rows(c: &mut [f32], hc: usize, eps: f32) {
    for row in c.chunks_exact_mut(hc) {
        let s: f32 = row.iter().sum::<f32>() + eps;
        row.iter_mut().for_each(|v| *v /= s);
    }
}

fn normalise_columns(c: &mut [f32], hc: usize, eps: f32) {
    for k in 0..hc {
        let s: f32 = (0..hc).map(|j| c[j * hc + k]).sum::<f32>() + eps;
        for j in 0..hc {
            c[j * hc + k] /= s;
        }
    }
}

/// Writes the sublayer output back: `X'[k] = post[k]·f + Σ_j comb[j][k]·X[j]`.
pub fn hc_post(x: &mut [f32], f: &[f32], mix: &HyperMix, t: usize, d: usize) {
    let hc = mix.hc;
    let mut next = vec![0.0f32; hc * d];
    for i in 0..t {
        let xs = &x[i * hc * d..(i + 1) * hc * d];
        let c = &mix.comb[i * hc * hc..(i + 1) * hc * hc];
        let fi = &f[i * d..(i + 1) * d];
        for k in 0..hc {
            let out = &mut next[k * d..(k + 1) * d];
            let p = mix.post[i * hc + k];
            for (o, v) in out.iter_mut().zip(fi) {
                *o = p * v;
            }
            for j in 0..hc {
                let cj = c[j * hc + k];
                for (o, v) in out.iter_mut().zip(&xs[j * d..(j + 1) * d]) {
                    *o += cj * v;
                }
            }
        }
        x[i * hc * d..(i + 1) * hc * d].copy_from_slice(&next);
    }
}

/// Final collapse of the streams (spec §3.10): sigmoid weights, no Sinkhorn.
pub fn hc_head(
    x: &[f32],
    t: usize,
    f: &Linear,
    base: &[f32],
    scale: f32,
    c: &ModelConfig,
) -> Vec<f32> {
    let (d, hc, hc_eps) = (c.hidden_size, c.hc_mult, c.hc_eps);
    let mix = normed_mix(x, t, f, c.rms_norm_eps);
    let mut out = vec![0.0f32; t * d];
    for i in 0..t {
        for s in 0..hc {
            let p = sigmoid(mix[i * hc + s] * scale + base[s]) + hc_eps;
            let xs = &x[(i * hc + s) * d..(i * hc + s + 1) * d];
            for (o, v) in out[i * d..(i + 1) * d].iter_mut().zip(xs) {
                *o += p * v;
            }
        }
    }
    out
}
