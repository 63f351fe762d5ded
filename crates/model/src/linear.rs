//! A projection as the model holds it: the stored matrix, multiplied through the profiler.

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::numerics::Numerics;
use deepinfer_kernels::linear::Matmul;
use deepinfer_kernels::matrix::QMatrix;

/// A projection `y = x · Wᵀ` with `W: [out, in]`.
#[derive(Debug)]
pub struct Linear {
    pub w: QMatrix,
}

impl Linear {
    pub fn load(
        ck: &Checkpoint,
        name: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Self, CheckpointError> {
        Ok(Self {
            w: ck.matrix(&format!("{name}.weight"), &[out_dim, in_dim])?,
        })
    }

    pub fn out_dim(&self) -> usize {
        self.w.rows
    }

    pub fn in_dim(&self) -> usize {
        self.w.cols
    }

    /// `x: [m, in]` → `[m, out]`.
    pub fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut y = vec![0.0f32; m * self.out_dim()];
        self.forward_into(x, m, &mut y);
        y
    }

    /// `x: [m, in]` → `y: [m, out]`.
    pub fn forward_into(&self, x: &[f32], m: usize, y: &mut [f32]) {
        crate::profile::matmul(&self.w, x, m, y);
    }

    /// [`Self::forward_into`] for activations no numerics rounds (mHC's mixes): taken as
    /// they are, but for a GGUF file's quantised matrix in llama.cpp's numerics, which
    /// rounds every product's input ([`Numerics::unrounded_inputs`]).
    pub fn forward_unrounded(&self, x: &[f32], m: usize, y: &mut [f32], numerics: Numerics) {
        let inputs = numerics.unrounded_inputs();
        crate::profile::matmuls(&mut [Matmul::new(&self.w, x, m, y).with_inputs(inputs)]);
    }

    /// [`Self::forward_into`] for a dense product's input ([`Numerics::dense_input`]):
    /// exact in bf16 where the numerics rounds it, which the kernels may exploit (or, for
    /// a GGUF file's quantised matrix, rounded by the product as llama.cpp does).
    pub fn forward_dense(&self, x: &[f32], m: usize, y: &mut [f32], numerics: Numerics) {
        let inputs = numerics.inputs();
        crate::profile::matmuls(&mut [Matmul::new(&self.w, x, m, y).with_inputs(inputs)]);
    }
}
