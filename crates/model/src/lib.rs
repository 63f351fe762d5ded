//! DeepSeek-V4: configuration, checkpoint loading and the forward pass.

pub mod batch;
pub mod cache;
pub mod checkpoint;
pub mod config;
pub mod engram;
pub mod experts;
pub mod linear;
pub mod numerics;
pub mod parallel;
pub mod profile;
pub mod record;
pub mod synth;
pub mod v4;
pub mod vision;

/// The kernels crate, re-exported so binaries need not depend on it directly.
pub use deepinfer_kernels as kernels;
