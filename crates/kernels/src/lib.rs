//! Number formats and compute on plain slices.

pub mod formats;
pub mod linear;
pub mod norm;
pub mod roofline;
pub mod rope;
pub mod topk;
