//! The portable path: dequantise one weight row exactly into f32, then a plain dot product
//! with each activation row. It is the reference the fused kernels are tested against and
//! what runs where they cannot (no AVX2, or scales outside their range).

use super::{with_scratch, Plan};
use crate::vector::dot_portable;
use std::ops::Range;

pub(super) fn tile(plan: &Plan, rows: Range<usize>) {
    let w = plan.w();
    with_scratch(w.cols, |buf| {
        for r in rows {
            w.dequantize_row(r, buf);
            for i in 0..plan.m {
                let v = dot_portable(buf, plan.x_row(i));
                let out = [[v, 0.0, 0.0, 0.0], [0.0; 4]];
                // SAFETY: this tile owns row r's outputs; i < m.
                unsafe { plan.store(i, 1, r..r + 1, &out) };
            }
        }
    })
}
