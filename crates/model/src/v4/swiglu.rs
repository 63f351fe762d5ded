//! The experts' SwiGLU activation between `w1`/`w3` and `w2`, shared by the resident,
//! streamed and width-split expert paths.

use crate::config::ModelConfig;
use crate::numerics::Numerics;
use deepinfer_kernels::vector::exp_in_place;
use rayon::prelude::*;

/// Rows per parallel task of the gathers, activations and sums around the products: a
/// prefill's thousands of picks split over the cores, a decode step's few stay on the
/// calling thread.
pub(super) const ROWS_PER_TASK: usize = 64;

/// What the MoE activation needs besides its rows: the SwiGLU clamp and how to round the
/// result, which is `w2`'s input.
#[derive(Clone, Copy)]
pub(super) struct Activation {
    pub(super) limit: f32,
    pub(super) numerics: Numerics,
    /// Whether each row is rounded here: not when it is a rank's part of the width, whose
    /// blocks the ranks round together (`tensor_parallel::round_split_input`).
    pub(super) round: bool,
}

impl Activation {
    pub(super) fn of(c: &ModelConfig) -> Self {
        Self {
            limit: c.swiglu_limit,
            numerics: c.numerics,
            round: true,
        }
    }
}

/// `h = silu(min(g, L)) ⊙ clamp(u, −L, L) · weight`, in place of `g`, one row per weight,
/// rounded as `numerics` rounds a projection's input;
/// `tmp` holds `width` floats per task of [`ROWS_PER_TASK`] rows.
pub(super) fn activate(
    g: &mut [f32],
    u: &[f32],
    weights: &[f32],
    width: usize,
    act: Activation,
    tmp: &mut [f32],
) {
    let Activation {
        limit,
        numerics,
        round,
    } = act;
    g.par_chunks_mut(ROWS_PER_TASK * width)
        .zip(u.par_chunks(ROWS_PER_TASK * width))
        .zip(weights.par_chunks(ROWS_PER_TASK))
        .zip(tmp.par_chunks_mut(width))
        .for_each(|(((g, u), weights), tmp)| {
            for ((gr, ur), &wt) in g
                .chunks_exact_mut(width)
                .zip(u.chunks_exact(width))
                .zip(weights)
            {
                for (t, v) in tmp.iter_mut().zip(gr.iter_mut()) {
                    *v = v.min(limit);
                    *t = -*v;
                }
                exp_in_place(tmp);
                // The activation is `w2`'s input, weighted first as DeepSeek's V4 code orders
                // it; V4.1's MoE weights `w2`'s output instead (`moe::sum_rows`).
                let wt = if numerics.weights_after_down() {
                    1.0
                } else {
                    wt
                };
                for ((v, &e), &up) in gr.iter_mut().zip(tmp.iter()).zip(ur) {
                    *v = *v / (1.0 + e) * up.clamp(-limit, limit) * wt;
                }
                if round {
                    numerics.projection_input(gr, width);
                }
            }
        });
}
