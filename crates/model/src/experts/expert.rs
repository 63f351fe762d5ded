//! One SwiGLU expert's weights (routed or shared), loaded by name.

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::linear::Linear;

/// A SwiGLU expert: `w2 · (silu(min(w1·x, L)) ⊙ clamp(w3·x, ±L))`.
#[derive(Debug)]
pub struct ExpertWeights {
    pub w1: Linear,
    pub w2: Linear,
    pub w3: Linear,
}

impl ExpertWeights {
    pub(crate) fn load(
        ck: &Checkpoint,
        p: &str,
        d: usize,
        inter: usize,
    ) -> Result<ExpertWeights, CheckpointError> {
        Ok(ExpertWeights {
            w1: Linear::load(ck, &format!("{p}.w1"), inter, d)?,
            w2: Linear::load(ck, &format!("{p}.w2"), d, inter)?,
            w3: Linear::load(ck, &format!("{p}.w3"), inter, d)?,
        })
    }
}
