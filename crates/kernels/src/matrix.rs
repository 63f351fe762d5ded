//! A weight matrix `[rows, cols]` (row-major, `rows` = outputs) held in its stored format.
//!
//! The kernels in [`crate::linear`] compute on these bytes directly; nothing is dequantised
//! into a second copy. Block scales are kept as the checkpoint gives them (FP8: one f32 per
//! `br × bc` block, decoded exactly from E8M0/F32/BF16 — at most a few KB per matrix; FP4:
//! the E8M0 bytes themselves, one per `group` inputs, since at 1 × 32 they are a sixteenth of
//! the weight bytes and f32 copies would add another eighth).

use crate::buffer::WeightBytes;
use crate::formats::{bf16_to_f32, e2m1_to_f32, e4m3_to_f32, e8m0_to_f32};
use crate::ggml::Block;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MatrixError {
    #[error("{what} holds {found} bytes, a [{rows}, {cols}] matrix needs {expected}")]
    Length {
        what: &'static str,
        rows: usize,
        cols: usize,
        found: usize,
        expected: usize,
    },
    #[error("a block scale grid of {scale_rows}×{scale_cols} does not tile a [{rows}, {cols}] matrix in {br}×{bc} blocks")]
    ScaleGrid {
        rows: usize,
        cols: usize,
        scale_rows: usize,
        scale_cols: usize,
        br: usize,
        bc: usize,
    },
}

/// The stored number format of a matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    F32,
    Bf16,
    /// FP8 E4M3FN with one scale per `br × bc` block.
    Fp8,
    /// FP4 E2M1, two codes per byte (low nibble first), one E8M0 scale per `group` inputs.
    Fp4,
    /// One of llama.cpp's block formats, as a GGUF file stores it.
    Ggml(Block),
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::F32 => "f32",
            Format::Bf16 => "bf16",
            Format::Fp8 => "fp8",
            Format::Fp4 => "fp4",
            Format::Ggml(b) => b.name(),
        }
    }
}

#[derive(Debug)]
pub(crate) enum Data {
    F32(WeightBytes),
    Bf16(WeightBytes),
    Fp8 {
        codes: WeightBytes,
        /// `[ceil(rows / br), scale_cols]`.
        scales: Vec<f32>,
        scale_cols: usize,
        br: usize,
        bc: usize,
    },
    Fp4 {
        packed: WeightBytes,
        /// E8M0 bytes, `[rows, ceil(cols / group)]`.
        scales: Vec<u8>,
        group: usize,
    },
    /// Rows of ggml blocks, scales inside ([`Block`]).
    Ggml {
        block: Block,
        bytes: WeightBytes,
    },
}

/// A `[rows, cols]` weight in its stored format.
#[derive(Debug)]
pub struct QMatrix {
    pub rows: usize,
    pub cols: usize,
    pub(crate) data: Data,
    /// Whether every scale keeps the fast kernels' rescaled products inside f32's normal
    /// range (always true for real checkpoints); if not, the scalar path is used.
    pub(crate) fast_ok: bool,
    /// Whether every weight times its scale is exact in bf16 (a short significand times a
    /// power of two): BF16, FP4, and FP8 whose block scales are powers of two (as V4's
    /// E8M0 scales are). What lets the AMX tiles multiply the weights in bf16; decided
    /// once here rather than by scanning the scales at every product.
    pub(crate) exact_bf16: bool,
    /// Whether the fused kernels on bf16 dot products give this matrix the f32 kernels'
    /// exact results (see `linear::x86::avx512`): FP4 whose every scale, or BF16 whose every
    /// weight, keeps each product and partial sum a normal number. Decided once here, as
    /// `exact_bf16` is.
    pub(crate) dots_ok: bool,
}

fn check_len(
    what: &'static str,
    rows: usize,
    cols: usize,
    found: usize,
    expected: usize,
) -> Result<(), MatrixError> {
    if found == expected {
        Ok(())
    } else {
        Err(MatrixError::Length {
            what,
            rows,
            cols,
            found,
            expected,
        })
    }
}

/// Block scales within `[2^-60, 2^40]` keep `x · s · 2^64` and the partial sums of the FP8
/// kernel finite and normal for any activation a model produces.
fn fp8_scale_fast(s: f32) -> bool {
    let a = s.abs();
    a.is_finite() && (2f32.powi(-60)..=2f32.powi(40)).contains(&a)
}

/// E8M0 bytes in `[32, 158]` (scales `2^-95 … 2^31`) keep the FP4 kernel's `s · 2^96` finite
/// and its products normal.
fn fp4_scale_fast(b: u8) -> bool {
    (32..=158).contains(&b)
}

/// Whether the bf16 dot-product kernels are exact with E8M0 scale `b`: a weight is an E2M1
/// value (its last bit `2^-1`) times `2^(b-127)`, so with activations of magnitude at least
/// `2^-64` (bf16: last bit `2^-71`, which the kernels check) every product and partial sum
/// is a multiple of `2^(b-199)`, normal from `b = 96` (the instruction flushes subnormals,
/// the FMA does not); up to 158 as the fast range. Checkpoints' scales lie near `2^-6`.
fn fp4_scale_dots(b: u8) -> bool {
    (96..=158).contains(&b)
}

/// Whether the bf16 dot-product kernels are exact on these BF16 weights: each is zero or of
/// magnitude in `[2^-48, 2^40)`. A weight's last bit is then at least `2^-55`, an
/// activation's (at least `2^-64`, which the kernels check) `2^-71`, so every product and
/// partial sum is a multiple of `2^-126`, normal (the instruction flushes subnormals, the FMA
/// does not); and below `2^40 · 2^64` a product leaves room for any sum to stay finite.
/// Trained weights lie far inside.
fn bf16_dots(values: &[u16]) -> bool {
    let fits = |v: u16| v & 0x7FFF == 0 || (79..=166).contains(&((v >> 7) & 0xFF));
    // Chunk by chunk without an early exit inside, so the test vectorises.
    values
        .chunks(4096)
        .all(|c| c.iter().fold(true, |ok, &v| ok & fits(v)))
}

impl QMatrix {
    /// An f32 matrix from its values.
    pub fn from_f32(rows: usize, cols: usize, values: &[f32]) -> Result<Self, MatrixError> {
        check_len("f32 data", rows, cols, values.len() * 4, rows * cols * 4)?;
        Ok(Self {
            rows,
            cols,
            data: Data::F32(WeightBytes::copy_from(bytemuck::cast_slice(values))),
            fast_ok: true,
            exact_bf16: false,
            dots_ok: false,
        })
    }

    /// An f32 matrix from little-endian bytes.
    pub fn f32_from_bytes(rows: usize, cols: usize, bytes: &[u8]) -> Result<Self, MatrixError> {
        Self::f32_in(rows, cols, WeightBytes::copy_from(bytes))
    }

    /// An f32 matrix over little-endian bytes already in place (4-byte aligned).
    pub fn f32_in(rows: usize, cols: usize, bytes: WeightBytes) -> Result<Self, MatrixError> {
        check_len("f32 data", rows, cols, bytes.len(), rows * cols * 4)?;
        Ok(Self {
            rows,
            cols,
            data: Data::F32(bytes),
            fast_ok: true,
            exact_bf16: false,
            dots_ok: false,
        })
    }

    /// A BF16 matrix from little-endian bytes.
    pub fn bf16_from_bytes(rows: usize, cols: usize, bytes: &[u8]) -> Result<Self, MatrixError> {
        Self::bf16_in(rows, cols, WeightBytes::copy_from(bytes))
    }

    /// A BF16 matrix over little-endian bytes already in place (2-byte aligned).
    pub fn bf16_in(rows: usize, cols: usize, bytes: WeightBytes) -> Result<Self, MatrixError> {
        check_len("bf16 data", rows, cols, bytes.len(), rows * cols * 2)?;
        let dots_ok = bf16_dots(bytes.as_u16());
        Ok(Self {
            rows,
            cols,
            data: Data::Bf16(bytes),
            fast_ok: true,
            exact_bf16: true,
            dots_ok,
        })
    }

    /// An FP8 E4M3 matrix: one code byte per element and a `[scale_rows, scale_cols]` grid of
    /// decoded block scales, blocks `br × bc` (edge blocks may be partial).
    pub fn fp8(
        rows: usize,
        cols: usize,
        codes: &[u8],
        scales: Vec<f32>,
        scale_cols: usize,
        br: usize,
        bc: usize,
    ) -> Result<Self, MatrixError> {
        let codes = WeightBytes::copy_from(codes);
        Self::fp8_in(rows, cols, codes, scales, scale_cols, br, bc)
    }

    /// [`Self::fp8`] over codes already in place.
    pub fn fp8_in(
        rows: usize,
        cols: usize,
        codes: WeightBytes,
        scales: Vec<f32>,
        scale_cols: usize,
        br: usize,
        bc: usize,
    ) -> Result<Self, MatrixError> {
        check_len("fp8 codes", rows, cols, codes.len(), rows * cols)?;
        let scale_rows = scales.len().checked_div(scale_cols).unwrap_or(0);
        let tiles = br > 0
            && bc > 0
            && scale_rows * scale_cols == scales.len()
            && scale_rows == rows.div_ceil(br)
            && scale_cols == cols.div_ceil(bc);
        if !tiles && rows * cols > 0 {
            return Err(MatrixError::ScaleGrid {
                rows,
                cols,
                scale_rows,
                scale_cols,
                br,
                bc,
            });
        }
        let fast_ok = scales.iter().all(|&s| fp8_scale_fast(s));
        let exact_bf16 = scales.iter().all(|s| s.to_bits() & 0x807F_FFFF == 0);
        Ok(Self {
            rows,
            cols,
            data: Data::Fp8 {
                codes,
                scales,
                scale_cols,
                br: br.max(1),
                bc: bc.max(1),
            },
            fast_ok,
            exact_bf16,
            // The weights are E4M3 codes (the scales go to the activations, checked as they
            // are packed): every product a multiple of 2^-9 · 2^-71, normal.
            dots_ok: exact_bf16 && fast_ok,
        })
    }

    /// An FP4 E2M1 matrix: `[rows, cols / 2]` packed bytes and `[rows, ceil(cols / group)]`
    /// E8M0 scale bytes.
    pub fn fp4(
        rows: usize,
        cols: usize,
        packed: &[u8],
        scales: &[u8],
        group: usize,
    ) -> Result<Self, MatrixError> {
        Self::fp4_in(
            rows,
            cols,
            WeightBytes::copy_from(packed),
            scales.to_vec(),
            group,
        )
    }

    /// [`Self::fp4`] over packed codes already in place.
    pub fn fp4_in(
        rows: usize,
        cols: usize,
        packed: WeightBytes,
        scales: Vec<u8>,
        group: usize,
    ) -> Result<Self, MatrixError> {
        let groups = cols.div_ceil(group.max(1));
        if !cols.is_multiple_of(2) {
            return Err(MatrixError::Length {
                what: "fp4 data (odd column count)",
                rows,
                cols,
                found: packed.len(),
                expected: rows * cols.div_ceil(2),
            });
        }
        check_len("fp4 codes", rows, cols, packed.len(), rows * cols / 2)?;
        if group == 0 || scales.len() != rows * groups {
            return Err(MatrixError::ScaleGrid {
                rows,
                cols,
                scale_rows: scales.len().checked_div(groups).unwrap_or(0),
                scale_cols: groups,
                br: 1,
                bc: group,
            });
        }
        let fast_ok = scales.iter().all(|&b| fp4_scale_fast(b));
        let dots_ok = scales.iter().all(|&b| fp4_scale_dots(b));
        Ok(Self {
            rows,
            cols,
            data: Data::Fp4 {
                packed,
                scales,
                group,
            },
            fast_ok,
            exact_bf16: true,
            dots_ok,
        })
    }

    /// A matrix of ggml blocks over its bytes (`rows` rows of `cols / block.elems()` blocks
    /// each, as a GGUF file stores them). The kernels take its rows through the scalar path
    /// until a family has kernels for the format.
    pub fn ggml_in(
        rows: usize,
        cols: usize,
        block: Block,
        bytes: WeightBytes,
    ) -> Result<Self, MatrixError> {
        if !cols.is_multiple_of(block.elems()) {
            return Err(MatrixError::Length {
                what: "a block format's rows (columns not a whole number of blocks)",
                rows,
                cols,
                found: bytes.len(),
                expected: rows * cols.div_ceil(block.elems()) * block.bytes(),
            });
        }
        check_len(
            block.name(),
            rows,
            cols,
            bytes.len(),
            rows * block.row_bytes(cols),
        )?;
        Ok(Self {
            rows,
            cols,
            data: Data::Ggml { block, bytes },
            fast_ok: false,
            exact_bf16: false,
            dots_ok: false,
        })
    }

    /// The node whose memory holds this matrix whole, if one does (see
    /// [`WeightBytes::home`]): its products run there first.
    pub fn home(&self) -> Option<usize> {
        match &self.data {
            Data::F32(b) | Data::Bf16(b) => b.home(),
            Data::Fp8 { codes, .. } => codes.home(),
            Data::Fp4 { packed, .. } => packed.home(),
            Data::Ggml { bytes, .. } => bytes.home(),
        }
    }

    pub fn format(&self) -> Format {
        match self.data {
            Data::F32(_) => Format::F32,
            Data::Bf16(_) => Format::Bf16,
            Data::Fp8 { .. } => Format::Fp8,
            Data::Fp4 { .. } => Format::Fp4,
            Data::Ggml { block, .. } => Format::Ggml(block),
        }
    }

    /// Bytes a full pass over the matrix reads: weights plus scales, as stored.
    pub fn stored_bytes(&self) -> usize {
        match &self.data {
            Data::F32(b) | Data::Bf16(b) | Data::Ggml { bytes: b, .. } => b.len(),
            Data::Fp8 { codes, scales, .. } => codes.len() + scales.len(),
            Data::Fp4 { packed, scales, .. } => packed.len() + scales.len(),
        }
    }

    /// Row `r` dequantised exactly into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let c = self.cols;
        assert!(
            r < self.rows && out.len() == c,
            "dequantize_row: bad row or length"
        );
        match &self.data {
            Data::F32(b) => out.copy_from_slice(&b.as_f32()[r * c..(r + 1) * c]),
            Data::Bf16(b) => {
                for (o, &v) in out.iter_mut().zip(&b.as_u16()[r * c..(r + 1) * c]) {
                    *o = bf16_to_f32(v);
                }
            }
            Data::Fp8 {
                codes,
                scales,
                scale_cols,
                br,
                bc,
            } => {
                let s = &scales[(r / br) * scale_cols..(r / br + 1) * scale_cols];
                let row = &codes.as_bytes()[r * c..(r + 1) * c];
                for (j, (o, &q)) in out.iter_mut().zip(row).enumerate() {
                    *o = e4m3_to_f32(q) * s[j / bc];
                }
            }
            Data::Fp4 {
                packed,
                scales,
                group,
            } => {
                let groups = c.div_ceil(*group);
                let s = &scales[r * groups..(r + 1) * groups];
                let row = &packed.as_bytes()[r * c / 2..(r + 1) * c / 2];
                for (k, &b) in row.iter().enumerate() {
                    let j = 2 * k;
                    out[j] = e2m1_to_f32(b & 0xF) * e8m0_to_f32(s[j / group]);
                    out[j + 1] = e2m1_to_f32(b >> 4) * e8m0_to_f32(s[(j + 1) / group]);
                }
            }
            Data::Ggml { block, bytes } => {
                let n = block.row_bytes(c);
                block.decode_row(&bytes.as_bytes()[r * n..(r + 1) * n], out);
            }
        }
    }

    /// The whole matrix in f32 (tests and tools; the engine never calls this).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.cols];
        if self.cols > 0 {
            for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
                self.dequantize_row(r, row);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_dots_take_only_weights_that_keep_products_normal() {
        let bytes = |v: &[f32]| -> Vec<u8> {
            v.iter()
                .flat_map(|&x| crate::formats::f32_to_bf16(x).to_le_bytes())
                .collect()
        };
        let ok = |v: &[f32]| {
            QMatrix::bf16_from_bytes(1, v.len(), &bytes(v))
                .unwrap()
                .dots_ok
        };
        assert!(ok(&[0.0, -0.0, 1.5, -3e-3, 2f32.powi(-48), 2f32.powi(39)]));
        for bad in [
            2f32.powi(-49),
            1e-40,
            2f32.powi(40),
            f32::INFINITY,
            f32::NAN,
        ] {
            assert!(!ok(&[1.0, bad]), "{bad}");
        }
    }

    #[test]
    fn rejects_bad_lengths_and_grids() {
        assert!(QMatrix::from_f32(2, 3, &[0.0; 5]).is_err());
        assert!(QMatrix::bf16_from_bytes(2, 3, &[0; 11]).is_err());
        assert!(QMatrix::fp8(4, 4, &[0; 16], vec![1.0; 3], 1, 2, 4).is_err());
        assert!(QMatrix::fp8(4, 4, &[0; 16], vec![1.0; 2], 1, 2, 4).is_ok());
        assert!(QMatrix::fp4(2, 64, &[0; 64], &[127; 4], 32).is_ok());
        assert!(QMatrix::fp4(2, 64, &[0; 64], &[127; 3], 32).is_err());
    }

    #[test]
    fn dequantises_each_format_exactly() {
        let m = QMatrix::fp8(
            2,
            3,
            &[0x38, 0xB8, 0x40, 0x30, 0, 1],
            vec![2.0, 0.5],
            2,
            2,
            2,
        )
        .unwrap();
        assert_eq!(
            m.dequantize(),
            vec![2.0, -2.0, 1.0, 1.0, 0.0, 2f32.powi(-10)]
        );
        // 0x21: low nibble 1 (0.5) first, then 2 (1.0); 0xF9: 9 (-0.5), 15 (-6).
        let m = QMatrix::fp4(1, 4, &[0x21, 0xF9], &[129], 32).unwrap();
        assert_eq!(m.dequantize(), vec![2.0, 4.0, -2.0, -24.0]);
        assert_eq!(m.stored_bytes(), 3);
        let m = QMatrix::bf16_from_bytes(1, 2, &[0x80, 0x3F, 0x00, 0xC0]).unwrap();
        assert_eq!(m.dequantize(), vec![1.0, -2.0]);
    }
}
