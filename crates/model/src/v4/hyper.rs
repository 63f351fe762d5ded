//! Manifold-constrained hyper-connections (mHC, docs/MODEL.md §3.3): the residual is `hc` streams per
//! token; each sublayer collapses them with learned weights and writes back through a
//! Sinkhorn-normalised mixing matrix.

use super::workspace::Workspace;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use crate::linear::Linear;
use crate::profile::{scope, Op};
use deepinfer_kernels::norm::rms_factor;
use deepinfer_kernels::vector::{axpy, scale};
use rayon::prelude::*;

/// Streams per token the fixed-size scratch below allows (shipped models use 4).
const MAX_HC: usize = 16;

/// Tokens per parallel task of the per-token loops: a prefill's tokens split over the
/// cores, a decode step's few stay on the calling thread (a fork-join costs more).
const TOKENS_PER_TASK: usize = 32;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `(x · rsqrt(mean(x²)+eps)) · fnᵀ` for every token's flattened streams `[T, hc·D]`.
fn normed_mix(x: &[f32], t: usize, f: &Linear, c: &ModelConfig, ws: &mut Workspace) -> Vec<f32> {
    let eps = c.rms_norm_eps;
    let width = f.in_dim();
    let mut normed = ws.take(t * width);
    {
        let _p = scope(Op::Hyper);
        normed
            .par_chunks_mut(width)
            .zip(x.par_chunks(width))
            .with_min_len(TOKENS_PER_TASK)
            .for_each(|(row, src)| {
                row.copy_from_slice(src);
                scale(row, rms_factor(row, eps));
            });
    }
    let mut mix = ws.take(t * f.out_dim());
    f.forward_unrounded(&normed, t, &mut mix, c.numerics);
    ws.give(normed);
    mix
}

/// Per-token mixing weights of one sublayer (buffers from the workspace: hand them back
/// with [`HyperMix::recycle`]).
pub struct HyperMix {
    pub hc: usize,
    /// `[T, hc]`: this sublayer's collapse weights (V4.1 hands them to the next sublayer).
    pub pre: Vec<f32>,
    /// `[T, hc]`.
    pub post: Vec<f32>,
    /// `[T, hc, hc]`: `comb[j][k]` carries source stream `j` into destination `k`.
    pub comb: Vec<f32>,
    /// The collapsed sublayer input `Σ_c pre[c]·X[c]`, `[T, D]`.
    pub collapsed: Vec<f32>,
}

impl HyperMix {
    pub fn recycle(self, ws: &mut Workspace) {
        ws.give(self.pre);
        ws.give(self.post);
        ws.give(self.comb);
        ws.give(self.collapsed);
    }
}

/// How a layer's sublayers collapse their input streams, chosen once at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixing {
    /// V4: each sublayer with its own `pre` (docs/MODEL.md §3.3).
    Own,
    /// V4.1's shifted mHC (§8.1): each sublayer with the previous sublayer's `pre`.
    Shifted,
}

impl Mixing {
    pub fn of(c: &ModelConfig) -> Self {
        match c.v41 {
            Some(_) => Mixing::Shifted,
            None => Mixing::Own,
        }
    }

    /// The collapse of a sublayer whose predecessor left `pre` (`None`: the model's entry).
    pub fn collapse(self, pre: Option<&[f32]>) -> Collapse<'_> {
        match (self, pre) {
            (Mixing::Own, _) => Collapse::Own,
            (Mixing::Shifted, None) => Collapse::First,
            (Mixing::Shifted, Some(pre)) => Collapse::Carried(pre),
        }
    }
}

/// Which weights collapse a sublayer's input streams.
#[derive(Clone, Copy)]
pub enum Collapse<'a> {
    /// V4: the sublayer's own `pre`.
    Own,
    /// V4.1's shifted mHC (docs/MODEL.md §8.1): the previous sublayer's `pre`, `[T, hc]`…
    Carried(&'a [f32]),
    /// …or, at the model's entry, stream 0 (all streams are the embedding there).
    First,
}

/// Computes `pre`, `post` and the Sinkhorn-projected `comb` from the streams `x: [T, hc, D]`
/// and collapses the streams as `collapse` says.
pub fn hc_mix(
    x: &[f32],
    t: usize,
    w: &HyperWeights,
    c: &ModelConfig,
    collapse: Collapse,
    ws: &mut Workspace,
) -> HyperMix {
    let (d, hc, iters, hc_eps) = (c.hidden_size, c.hc_mult, c.hc_sinkhorn_iters, c.hc_eps);
    assert!(hc <= MAX_HC, "hc_mult {hc} is above {MAX_HC}");
    let mix = normed_mix(x, t, &w.fn_, c, ws);
    let _p = scope(Op::Hyper);
    let m = (2 + hc) * hc;
    let mut pre_all = ws.take(t * hc);
    let mut post = ws.take(t * hc);
    let mut comb = ws.take(t * hc * hc);
    let mut collapsed = ws.take(t * d);
    pre_all
        .par_chunks_mut(hc)
        .zip(post.par_chunks_mut(hc))
        .zip(comb.par_chunks_mut(hc * hc))
        .zip(collapsed.par_chunks_mut(d))
        .enumerate()
        .with_min_len(TOKENS_PER_TASK)
        .for_each(|(i, (((pre, post), c), out))| {
            let mi = &mix[i * m..(i + 1) * m];
            for j in 0..hc {
                pre[j] = sigmoid(mi[j] * w.scale[0] + w.base[j]) + hc_eps;
                post[j] = 2.0 * sigmoid(mi[hc + j] * w.scale[1] + w.base[hc + j]);
            }
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
            let streams = &x[i * hc * d..(i + 1) * hc * d];
            match collapse {
                Collapse::Own => collapse_streams(out, pre, streams),
                Collapse::Carried(p) => collapse_streams(out, &p[i * hc..(i + 1) * hc], streams),
                Collapse::First => out.copy_from_slice(&streams[..d]),
            }
        });
    ws.give(mix);
    HyperMix {
        hc,
        pre: pre_all,
        post,
        comb,
        collapsed,
    }
}

/// `out = Σ_s pre[s]·X[s]` (`out` zeroed).
fn collapse_streams(out: &mut [f32], pre: &[f32], streams: &[f32]) {
    let d = out.len();
    for (s, &p) in pre.iter().enumerate() {
        axpy(out, p, &streams[s * d..(s + 1) * d]);
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
pub fn hc_post(x: &mut [f32], f: &[f32], mix: &HyperMix, t: usize, d: usize, ws: &mut Workspace) {
    let _p = scope(Op::Hyper);
    let hc = mix.hc;
    // One token's new streams per task while its old ones are still read.
    let mut scratch = ws.take(t.div_ceil(TOKENS_PER_TASK) * hc * d);
    x[..t * hc * d]
        .par_chunks_mut(TOKENS_PER_TASK * hc * d)
        .zip(scratch.par_chunks_mut(hc * d))
        .enumerate()
        .for_each(|(task, (block, next))| {
            for (b, xs) in block.chunks_exact_mut(hc * d).enumerate() {
                let i = task * TOKENS_PER_TASK + b;
                let (c, fi) = (
                    &mix.comb[i * hc * hc..(i + 1) * hc * hc],
                    &f[i * d..(i + 1) * d],
                );
                for k in 0..hc {
                    let out = &mut next[k * d..(k + 1) * d];
                    let p = mix.post[i * hc + k];
                    for (o, v) in out.iter_mut().zip(fi) {
                        *o = p * v;
                    }
                    for j in 0..hc {
                        axpy(out, c[j * hc + k], &xs[j * d..(j + 1) * d]);
                    }
                }
                xs.copy_from_slice(next);
            }
        });
    ws.give(scratch);
}

/// Final collapse of the streams (docs/MODEL.md §3.10): sigmoid weights, no Sinkhorn. `[T, D]`.
pub fn hc_head(
    x: &[f32],
    t: usize,
    f: &Linear,
    base: &[f32],
    scale_: f32,
    c: &ModelConfig,
    ws: &mut Workspace,
) -> Vec<f32> {
    let (d, hc, hc_eps) = (c.hidden_size, c.hc_mult, c.hc_eps);
    let mix = normed_mix(x, t, f, c, ws);
    let _p = scope(Op::Hyper);
    let mut out = ws.take(t * d);
    out.par_chunks_mut(d)
        .enumerate()
        .with_min_len(TOKENS_PER_TASK)
        .for_each(|(i, out)| {
            for s in 0..hc {
                let p = sigmoid(mix[i * hc + s] * scale_ + base[s]) + hc_eps;
                axpy(out, p, &x[(i * hc + s) * d..(i * hc + s + 1) * d]);
            }
        });
    ws.give(mix);
    out
}

/// mHC parameters of one use site: `fn [(2+hc)·hc, hc·D]`, `base`, `scale [3]`.
#[derive(Debug)]
pub struct HyperWeights {
    pub fn_: Linear,
    pub base: Vec<f32>,
    pub scale: Vec<f32>,
}

impl HyperWeights {
    pub(crate) fn load(
        ck: &Checkpoint,
        p: &str,
        c: &ModelConfig,
    ) -> Result<HyperWeights, CheckpointError> {
        let hc = c.hc_mult;
        let mix = (2 + hc) * hc;
        Ok(HyperWeights {
            fn_: Linear {
                w: ck.matrix(&format!("{p}_fn"), &[mix, hc * c.hidden_size])?,
            },
            base: ck.vector(&format!("{p}_base"), mix)?,
            scale: ck.vector(&format!("{p}_scale"), 3)?,
        })
    }
}

/// The hyper head's weights: `fn [hc, hc·D]`, `base [hc]`, `scale [1]`.
#[derive(Debug)]
pub struct HcHead {
    pub fn_: Linear,
    pub base: Vec<f32>,
    pub scale: f32,
}

impl HcHead {
    pub(crate) fn load(ck: &Checkpoint, p: &str, c: &ModelConfig) -> Result<Self, CheckpointError> {
        let (hc, d) = (c.hc_mult, c.hidden_size);
        Ok(Self {
            fn_: Linear {
                w: ck.matrix(&format!("{p}fn"), &[hc, hc * d])?,
            },
            base: ck.vector(&format!("{p}base"), hc)?,
            scale: ck.vector(&format!("{p}scale"), 1)?[0],
        })
    }
}
