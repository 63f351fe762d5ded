//! The DeepSeek-V4 forward pass (docs/MODEL.md §3), in f32, matching HF transformers' numerics.

pub mod attention;
pub mod block;
pub mod carry;
pub mod compressor;
pub mod dspark;
pub mod embed;
pub mod engram;
mod expert_pass;
pub mod head;
pub mod hyper;
pub mod indexer;
pub mod model;
pub mod moe;
pub mod mtp;
mod output_groups;
pub mod pass;
pub mod rows;
mod swiglu;
mod tensor_parallel;
mod worker;
pub mod workspace;

pub use model::{Model, ModelError};
pub use worker::{Worker, WorkerError};
