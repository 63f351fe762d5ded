//! The serving engine: owns sequences and cache memory and drives the model.

pub mod cache;
pub mod constraint;
pub mod dist;
pub mod encoder;
pub mod engine;
pub mod metrics;
pub mod request;
pub mod runner;
pub mod sampler;
pub mod sampling_params;
pub mod scheduler;
pub mod scripted;
pub mod sequence;
pub mod spec;
