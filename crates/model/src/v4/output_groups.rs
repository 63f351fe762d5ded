//! The attention's grouped output projection `wo_a`: block-diagonal over the output groups,
//! whole on one process or a rank's groups under tensor parallelism.

use super::workspace::Workspace;
use crate::config::ModelConfig;
use crate::profile;
use deepinfer_kernels::linear::Matmul;
use deepinfer_kernels::matrix::QMatrix;
use smallvec::SmallVec;
use std::ops::Range;

/// The block-diagonal `wo_a` over the output groups `groups` (group `g`'s heads of
/// `o: [t, H·hd]` → `o_lora` values, every group in one pass): `[t, groups · o_lora]`.
/// `wo_a` holds those groups' rows from row `row0` on (all of them, or a rank's part).
pub(super) fn grouped_output(
    c: &ModelConfig,
    wo_a: &QMatrix,
    row0: usize,
    groups: Range<usize>,
    o: &[f32],
    t: usize,
    ws: &mut Workspace,
) -> Vec<f32> {
    let gin = c.num_attention_heads * c.head_dim / c.o_groups.max(1);
    let r = c.o_lora_rank;
    let ng = groups.len();
    // [ng, t, gin]: each group's inputs contiguous.
    let mut xg = ws.take(ng * t * gin);
    for (i, row) in o.chunks_exact(c.o_groups * gin).enumerate() {
        for (k, g) in groups.clone().enumerate() {
            xg[(k * t + i) * gin..(k * t + i + 1) * gin]
                .copy_from_slice(&row[g * gin..(g + 1) * gin]);
        }
    }
    // `wo_a` is FP8 on disk but a dense product in DeepSeek's V4 code (dequantised to bf16),
    // an MXFP8 projection of each group's input in V4.1's.
    c.numerics.wo_a_input(&mut xg, gin);
    let mut zg = ws.take(ng * t * r);
    {
        let mut jobs: SmallVec<[Matmul; 16]> = SmallVec::new();
        for ((k, x), y) in xg
            .chunks_exact(t * gin)
            .enumerate()
            .zip(zg.chunks_exact_mut(t * r))
        {
            jobs.push(Matmul {
                w: wo_a,
                rows: row0 + k * r..row0 + (k + 1) * r,
                x,
                m: t,
                y,
                inputs: c.numerics.inputs(),
            });
        }
        profile::matmuls(&mut jobs);
    }
    let mut z = ws.take(t * ng * r);
    for k in 0..ng {
        for i in 0..t {
            z[i * ng * r + k * r..i * ng * r + (k + 1) * r]
                .copy_from_slice(&zg[(k * t + i) * r..(k * t + i + 1) * r]);
        }
    }
    ws.give(xg);
    ws.give(zg);
    z
}
