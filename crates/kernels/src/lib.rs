//! Number formats and compute on plain slices.

pub mod attention;
pub mod awake;
pub mod buffer;
pub mod choice;
pub mod cpu;
pub mod formats;
pub mod ggml;
pub mod linear;
pub mod matrix;
pub mod norm;
pub mod numa;
pub mod quant;
pub mod roofline;
pub mod rope;
pub mod sub_matrix;
pub mod topk;
pub mod vector;
