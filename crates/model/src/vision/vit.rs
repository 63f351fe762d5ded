//! The ViT (vLLM 0.33 `models/deepseek_v4/common/vision.py` lines 44-236, which both
//! V4-Flash-Vision-Exp and V4.1 use): a biased linear patch embedding, pre-norm blocks of
//! full bidirectional attention with 2-D rotary positions and a SwiGLU MLP, a final RMSNorm.
//! Weights load as the checkpoints name them (`vision.…`).

use deepinfer_kernels::linear::matmul;
use deepinfer_kernels::matrix::QMatrix;
use deepinfer_kernels::norm::rms_norm_rows;
use deepinfer_kernels::vector;
use rayon::prelude::*;

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::VisionConfig;

use super::affine::Affine;

/// vLLM's `DeepseekV4RMSNorm` default.
const EPS: f32 = 1e-6;

/// Queries per attention pass: bounds the score block at this many rows of every key.
const QUERY_BLOCK: usize = 1024;

struct Block {
    norm1: Vec<f32>,
    wqkv: Affine,
    wo: Affine,
    norm2: Vec<f32>,
    /// Gate and up halves, `[2 · inter, dim]`, no bias.
    w1: Affine,
    w2: Affine,
}

pub struct Vit {
    patch_embed: Affine,
    blocks: Vec<Block>,
    norm: Vec<f32>,
    dim: usize,
    heads: usize,
    inter: usize,
    /// Per rotary pair `j < head_dim / 4`: the frequency row and column positions turn by.
    inv_freq: Vec<f32>,
}

impl Vit {
    pub fn load(ck: &Checkpoint, c: &VisionConfig) -> Result<Self, CheckpointError> {
        let (d, i) = (c.dim, c.inter_dim);
        let block = |b: usize| -> Result<Block, CheckpointError> {
            let n = |s: &str| format!("vision.blocks.{b}.{s}");
            Ok(Block {
                norm1: ck.vector(&n("norm1.weight"), d)?,
                wqkv: Affine::load(ck, &n("attn.wqkv"), 3 * d, d, true)?,
                wo: Affine::load(ck, &n("attn.wo"), d, d, true)?,
                norm2: ck.vector(&n("norm2.weight"), d)?,
                w1: Affine::load(ck, &n("mlp.w1"), 2 * i, d, false)?,
                w2: Affine::load(ck, &n("mlp.w2"), d, i, false)?,
            })
        };
        let rope_dim = c.head_dim() / 2;
        let theta = c.rope_theta as f32;
        Ok(Self {
            patch_embed: Affine::load(ck, "vision.patch_embed.proj", d, c.patch_values(), true)?,
            blocks: (0..c.n_layers).map(block).collect::<Result<_, _>>()?,
            norm: ck.vector("vision.norm.weight", d)?,
            dim: d,
            heads: c.n_heads,
            inter: i,
            inv_freq: (0..rope_dim / 2)
                .map(|j| 1.0 / theta.powf((2 * j) as f32 / rope_dim as f32))
                .collect(),
        })
    }

    /// The patch embeddings of `patches` (`[n_h · n_w, 3 · p²]`).
    pub fn embed(&self, patches: &[f32], n: usize) -> Vec<f32> {
        self.patch_embed.forward(patches, n)
    }

    /// Runs block `b` over one image's `x` (`[n_h · n_w, dim]`, rows in reading order).
    pub fn block(&self, b: usize, x: &mut [f32], grid: (usize, usize)) {
        self.block_with(b, x, &self.rope_table(grid));
    }

    /// [`Self::block`] with the image's rotary table ([`Self::rope_table`]).
    pub(crate) fn block_with(&self, b: usize, x: &mut [f32], rope: &[(f32, f32)]) {
        self.attention_half(b, x, rope);
        self.mlp_half(b, x);
    }

    /// Block `b`'s attention and its residual add.
    pub(crate) fn attention_half(&self, b: usize, x: &mut [f32], rope: &[(f32, f32)]) {
        let (blk, n) = (&self.blocks[b], x.len() / self.dim);
        let mut h = x.to_vec();
        rms_norm_rows(&mut h, &blk.norm1, EPS);
        let mut qkv = blk.wqkv.forward(&h, n);
        self.rotate(&mut qkv, rope);
        let o = self.attention(&qkv, n);
        add(x, &blk.wo.forward(&o, n));
    }

    /// Block `b`'s MLP and its residual add.
    pub(crate) fn mlp_half(&self, b: usize, x: &mut [f32]) {
        let (blk, n) = (&self.blocks[b], x.len() / self.dim);
        let mut h = x.to_vec();
        rms_norm_rows(&mut h, &blk.norm2, EPS);
        let act = swiglu(&blk.w1.forward(&h, n), self.inter);
        add(x, &blk.w2.forward(&act, n));
    }

    /// The whole tower over one image's patches: `[n_h · n_w, dim]`.
    pub fn forward(&self, patches: &[f32], grid: (usize, usize)) -> Vec<f32> {
        let mut x = self.embed(patches, grid.0 * grid.1);
        let rope = self.rope_table(grid);
        for b in 0..self.blocks.len() {
            self.block_with(b, &mut x, &rope);
        }
        self.final_norm(&mut x);
        x
    }

    pub fn n_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The norm after the last block.
    pub(crate) fn final_norm(&self, x: &mut [f32]) {
        rms_norm_rows(x, &self.norm, EPS);
    }

    /// Each patch's `(cos, sin)` per rotary pair (`[n_h · n_w, head_dim / 2]`): the first
    /// quarter of a head's pairs turn by the patch's row, the rest by its column
    /// (`get_vision_cos_sin`).
    pub(crate) fn rope_table(&self, (n_h, n_w): (usize, usize)) -> Vec<(f32, f32)> {
        let quarter = self.inv_freq.len();
        let mut t = Vec::with_capacity(n_h * n_w * 2 * quarter);
        for (r, c) in (0..n_h).flat_map(|r| (0..n_w).map(move |c| (r as f32, c as f32))) {
            for j in 0..2 * quarter {
                let angle = [r, c][j / quarter] * self.inv_freq[j % quarter];
                let (sin, cos) = angle.sin_cos();
                t.push((cos, sin));
            }
        }
        t
    }

    /// 2-D rotary positions on every head of the queries and keys in `qkv` (`[n, 3 · dim]`):
    /// a head's first half pairs with its second (`apply_rotary`).
    fn rotate(&self, qkv: &mut [f32], rope: &[(f32, f32)]) {
        let hd = self.dim / self.heads;
        qkv.par_chunks_mut(3 * self.dim)
            .zip(rope.par_chunks(hd / 2))
            .for_each(|(row, turns)| {
                for head in row[..2 * self.dim].chunks_exact_mut(hd) {
                    let (x1, x2) = head.split_at_mut(hd / 2);
                    for (j, &(cos, sin)) in turns.iter().enumerate() {
                        let (a, b) = (x1[j], x2[j]);
                        x1[j] = a * cos - b * sin;
                        x2[j] = b * cos + a * sin;
                    }
                }
            });
    }

    /// Softmax attention of every patch to every patch, per head: `[n, dim]`.
    fn attention(&self, qkv: &[f32], n: usize) -> Vec<f32> {
        let (d, hd) = (self.dim, self.dim / self.heads);
        let scale = (hd as f32).powf(-0.5);
        let mut out = vec![0.0f32; n * d];
        let column = |part: usize, h: usize| -> Vec<f32> {
            let at = part * d + h * hd;
            qkv.chunks_exact(3 * d)
                .flat_map(|r| &r[at..at + hd])
                .copied()
                .collect()
        };
        for h in 0..self.heads {
            let (q, k, v) = (column(0, h), column(1, h), column(2, h));
            let keys = QMatrix::from_f32(n, hd, &k).expect("key block shape");
            let values_t = QMatrix::from_f32(hd, n, &transpose(&v, n, hd)).expect("value shape");
            for q0 in (0..n).step_by(QUERY_BLOCK) {
                let m = QUERY_BLOCK.min(n - q0);
                let mut s = vec![0.0f32; m * n];
                matmul(&keys, &q[q0 * hd..(q0 + m) * hd], m, &mut s);
                s.par_chunks_mut(n).for_each(|row| softmax(row, scale));
                let mut o = vec![0.0f32; m * hd];
                matmul(&values_t, &s, m, &mut o);
                for (r, row) in o.chunks_exact(hd).enumerate() {
                    out[(q0 + r) * d + h * hd..][..hd].copy_from_slice(row);
                }
            }
        }
        out
    }
}

/// `x[i] += y[i]`.
fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// `[rows, cols]` → `[cols, rows]`.
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

/// `softmax(scale · row)` in place.
fn softmax(row: &mut [f32], scale: f32) {
    let max = vector::max(row) * scale;
    row.iter_mut().for_each(|v| *v = *v * scale - max);
    vector::exp_in_place(row);
    let sum = vector::sum(row);
    vector::scale(row, 1.0 / sum);
}

/// `silu(g) · u` of each row's gate and up halves (`[n, 2 · inter]` → `[n, inter]`).
fn swiglu(gu: &[f32], inter: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; gu.len() / 2];
    out.par_chunks_mut(inter)
        .zip(gu.par_chunks(2 * inter))
        .for_each(|(o, r)| {
            let (g, u) = r.split_at(inter);
            o.iter_mut().zip(g).for_each(|(o, &g)| *o = -g);
            vector::exp_in_place(o);
            for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                *o = g / (1.0 + *o) * u;
            }
        });
    out
}
