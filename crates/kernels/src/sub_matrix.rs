//! A rank's part of a matrix split over processes: a copy of the rows and columns it
//! covers, taken as stored (codes and scales unchanged), so its products are the stored
//! matrix's.
//!
//! A block-scaled format can only be cut at its block boundaries. Where a part starts inside
//! a block, the copy starts at that block's boundary: it carries a few rows (or columns) of
//! the neighbouring part, which the caller skips (rows: a row range of the product) or
//! multiplies by zero inputs (columns). V4's shapes split at block boundaries for the usual
//! sizes; small test models do not.

use crate::buffer::WeightBytes;
use crate::matrix::{Data, QMatrix};
use std::ops::Range;

/// The copy covering `rows × cols` of a matrix.
#[derive(Debug)]
pub struct SubMatrix {
    pub w: QMatrix,
    /// The wanted rows, within `w`.
    pub rows: Range<usize>,
    /// Leading columns of `w` that belong to the part before: the wanted columns are
    /// `col_pad..col_pad + cols.len()`, and the input must be zero in the others.
    pub col_pad: usize,
}

/// The block boundary at or before `at`.
fn floor_to(at: usize, block: usize) -> usize {
    at - at % block.max(1)
}

impl QMatrix {
    /// The rows × cols boundaries a copy may start at: `(row block, column block)`.
    fn cut_blocks(&self) -> (usize, usize) {
        match &self.data {
            Data::F32(_) | Data::Bf16(_) => (1, 1),
            Data::Fp8 { br, bc, .. } => (*br, *bc),
            // Two codes per byte, one scale per group.
            Data::Fp4 { group, .. } => (1, group.next_multiple_of(2)),
            Data::Ggml { block, .. } => (1, block.elems()),
        }
    }

    /// The copy of this matrix that covers `rows × cols` (see the module's comment).
    ///
    /// # Panics
    /// When a range is out of bounds (a caller's bug: the ranges come from the shapes).
    pub fn sub_matrix(&self, rows: Range<usize>, cols: Range<usize>) -> SubMatrix {
        assert!(
            rows.start <= rows.end && rows.end <= self.rows,
            "sub_matrix rows"
        );
        assert!(
            cols.start <= cols.end && cols.end <= self.cols,
            "sub_matrix cols"
        );
        let (br, bc) = self.cut_blocks();
        let (r0, c0) = (floor_to(rows.start, br), floor_to(cols.start, bc));
        // FP4 packs two columns per byte: an odd end takes the next column too; a block
        // format's end is its block's.
        let c1 = match &self.data {
            Data::Fp4 { .. } => cols.end.next_multiple_of(2),
            Data::Ggml { block, .. } => cols.end.next_multiple_of(block.elems()),
            _ => cols.end,
        };
        let r1 = rows.end;
        let (n_rows, n_cols) = (r1 - r0, c1 - c0);
        let w = match &self.data {
            Data::F32(b) => {
                let bytes = copy_cells(b.as_bytes(), self.cols * 4, r0..r1, c0 * 4..c1 * 4);
                QMatrix::f32_in(n_rows, n_cols, bytes)
            }
            Data::Bf16(b) => {
                let bytes = copy_cells(b.as_bytes(), self.cols * 2, r0..r1, c0 * 2..c1 * 2);
                QMatrix::bf16_in(n_rows, n_cols, bytes)
            }
            Data::Fp8 {
                codes,
                scales,
                scale_cols,
                br,
                bc,
            } => {
                let codes = copy_cells(codes.as_bytes(), self.cols, r0..r1, c0..c1);
                let (sr, sc) = (r0 / br..r1.div_ceil(*br), c0 / bc..c1.div_ceil(*bc));
                let mut grid = Vec::with_capacity(sr.len() * sc.len());
                for r in sr {
                    grid.extend_from_slice(
                        &scales[r * scale_cols + sc.start..r * scale_cols + sc.end],
                    );
                }
                QMatrix::fp8_in(n_rows, n_cols, codes, grid, sc.len(), *br, *bc)
            }
            Data::Fp4 {
                packed,
                scales,
                group,
            } => {
                let packed = copy_cells(packed.as_bytes(), self.cols / 2, r0..r1, c0 / 2..c1 / 2);
                let groups = self.cols.div_ceil(*group);
                let sc = c0 / group..c1.div_ceil(*group);
                let mut grid = Vec::with_capacity(n_rows * sc.len());
                for r in r0..r1 {
                    grid.extend_from_slice(&scales[r * groups + sc.start..r * groups + sc.end]);
                }
                QMatrix::fp4_in(n_rows, n_cols, packed, grid, *group)
            }
            Data::Ggml { block, bytes } => {
                let at = |c: usize| block.row_bytes(c);
                let row = at(self.cols);
                let bytes = copy_cells(bytes.as_bytes(), row, r0..r1, at(c0)..at(c1));
                QMatrix::ggml_in(n_rows, n_cols, *block, bytes)
            }
        };
        SubMatrix {
            w: w.expect("a sub-grid of a valid matrix is valid"),
            rows: rows.start - r0..rows.end - r0,
            col_pad: cols.start - c0,
        }
    }
}

/// Bytes `cols` of rows `rows` of a row-major buffer with `stride` bytes per row.
fn copy_cells(src: &[u8], stride: usize, rows: Range<usize>, cols: Range<usize>) -> WeightBytes {
    let mut out = Vec::with_capacity(rows.len() * cols.len());
    for r in rows {
        out.extend_from_slice(&src[r * stride + cols.start..r * stride + cols.end]);
    }
    WeightBytes::copy_from(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every format, with blocks that do not divide the shape, cut at and inside blocks.
    fn matrices() -> Vec<QMatrix> {
        let (rows, cols) = (10, 12);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7) % 13) as f32 - 6.0)
            .collect();
        let codes: Vec<u8> = (0..rows * cols)
            .map(|i| ((i * 37) % 251) as u8 & 0x7E)
            .collect();
        let fp8_scales: Vec<f32> = (0..3 * 3).map(|i| 2f32.powi(i - 4)).collect();
        let packed: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 29 % 256) as u8).collect();
        let fp4_scales: Vec<u8> = (0..rows * 3).map(|i| 120 + (i % 9) as u8).collect();
        let bf16: Vec<u8> = values
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        vec![
            QMatrix::from_f32(rows, cols, &values).unwrap(),
            QMatrix::bf16_from_bytes(rows, cols, &bf16).unwrap(),
            QMatrix::fp8(rows, cols, &codes, fp8_scales, 3, 4, 5).unwrap(),
            QMatrix::fp4(rows, cols, &packed, &fp4_scales, 4).unwrap(),
        ]
    }

    #[test]
    fn a_sub_matrix_holds_the_same_values() {
        for m in matrices() {
            let whole = m.dequantize();
            for (rows, cols) in [
                (0..10, 0..12),
                (3..7, 5..11),
                (4..10, 0..4),
                (0..1, 6..12),
                (9..10, 7..9),
            ] {
                let sub = m.sub_matrix(rows.clone(), cols.clone());
                assert!(sub.rows.start < sub.w.rows || rows.is_empty());
                let got = sub.w.dequantize();
                for (i, r) in rows.clone().enumerate() {
                    for (j, c) in cols.clone().enumerate() {
                        let at = (sub.rows.start + i) * sub.w.cols + sub.col_pad + j;
                        assert_eq!(
                            got[at],
                            whole[r * m.cols + c],
                            "{:?} rows {rows:?} cols {cols:?}",
                            m.format()
                        );
                    }
                }
                assert_eq!(sub.w.format(), m.format());
                assert_eq!(sub.w.rows, sub.rows.end);
                assert!(sub.w.cols >= sub.col_pad + cols.len());
            }
        }
    }
}
