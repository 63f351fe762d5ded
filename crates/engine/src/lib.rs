//! The serving engine: owns sequences and cache memory and drives the model.

pub mod cache;
pub mod runner;
