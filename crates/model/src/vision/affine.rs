//! A projection with an optional bias, as the vision tower's linears are (the decoder's
//! have none).

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::linear::Linear;

pub struct Affine {
    w: Linear,
    bias: Option<Vec<f32>>,
}

impl Affine {
    /// `{name}.weight` as `[out, in]`, and `{name}.bias` when `bias`.
    pub fn load(
        ck: &Checkpoint,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Self, CheckpointError> {
        Ok(Self {
            w: Linear::load(ck, name, out, inp)?,
            bias: match bias {
                true => Some(ck.vector(&format!("{name}.bias"), out)?),
                false => None,
            },
        })
    }

    /// `x: [m, in]` → `x · Wᵀ + b`.
    pub fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut y = self.w.forward(x, m);
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
        }
        y
    }
}
