//! Where a matrix's stored bytes lie in the shard files: enough to build the matrix later
//! from bytes read then (streamed experts), and the one place a stored matrix is assembled
//! from its codes and scale bytes (loads read them from the mapping).

use std::path::Path;

use deepinfer_kernels::buffer::WeightBytes;
use deepinfer_kernels::ggml::Block;
use deepinfer_kernels::matrix::QMatrix;
use safetensors::Dtype;

use super::matrix::{check_fp4_shape, invalid, stacked_cut};
use super::{
    blocks_for, decode, describe, shape_err, Checkpoint, CheckpointError, Located, Shard,
    TensorInfo,
};

/// A byte range of one shard file (`file` indexes [`Checkpoint::shard_paths`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileRange {
    pub file: usize,
    pub offset: u64,
    pub len: usize,
}

impl FileRange {
    pub fn end(&self) -> u64 {
        self.offset + self.len as u64
    }
}

/// How a matrix's codes and scale bytes are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    F32,
    Bf16,
    /// E4M3 codes and a `[ceil(rows/br), scale_cols]` grid of block scales of `scale_dtype`.
    Fp8 {
        scale_dtype: Dtype,
        scale_cols: usize,
        br: usize,
        bc: usize,
    },
    /// Packed E2M1 codes and one E8M0 byte per `group` inputs of each row.
    Fp4 {
        group: usize,
    },
    /// Rows of ggml blocks, scales inside (GGUF files).
    Ggml(Block),
}

/// A matrix usable exactly as stored, and where its bytes are.
#[derive(Clone, Debug)]
pub struct MatrixSource {
    /// For messages: the official name (and the stored one when they differ).
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub format: SourceFormat,
    pub codes: FileRange,
    pub scales: Option<FileRange>,
}

impl MatrixSource {
    /// Bytes read to build the matrix.
    pub fn stored_bytes(&self) -> usize {
        self.codes.len + self.scales.map_or(0, |s| s.len)
    }

    /// The matrix over `codes` (its stored codes, already in place) and its scale bytes.
    pub fn build(&self, codes: WeightBytes, scales: &[u8]) -> Result<QMatrix, CheckpointError> {
        let (rows, cols) = (self.rows, self.cols);
        match self.format {
            SourceFormat::F32 => QMatrix::f32_in(rows, cols, codes),
            SourceFormat::Bf16 => QMatrix::bf16_in(rows, cols, codes),
            SourceFormat::Fp8 {
                scale_dtype,
                scale_cols,
                br,
                bc,
            } => {
                let grid = decode::scales(scale_dtype, scales);
                QMatrix::fp8_in(rows, cols, codes, grid, scale_cols, br, bc)
            }
            SourceFormat::Fp4 { group } => {
                QMatrix::fp4_in(rows, cols, codes, scales.to_vec(), group)
            }
            SourceFormat::Ggml(block) => QMatrix::ggml_in(rows, cols, block, codes),
        }
        .map_err(|e| invalid(&self.name, e))
    }
}

impl Checkpoint {
    /// The shard files, in the order [`FileRange::file`] counts them.
    pub fn shard_paths(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }

    pub(super) fn file_range(&self, shard: &Shard, info: &TensorInfo) -> FileRange {
        let file = self
            .shards
            .iter()
            .position(|s| std::ptr::eq(s, shard))
            .expect("a located tensor's shard belongs to its checkpoint");
        FileRange {
            file,
            offset: info.start as u64,
            len: info.end - info.start,
        }
    }

    /// The bytes of `range`, from the mapping.
    pub(super) fn range_bytes(&self, range: FileRange) -> Result<&[u8], CheckpointError> {
        self.shards[range.file].range(range.offset as usize, range.end() as usize)
    }

    /// Where the 2-D weight `official_name` of logical `shape` lies, checked as
    /// [`Checkpoint::matrix`] checks it, when its stored form is what the kernels use
    /// (F32, BF16, FP8 with its block scale, FP4 with per-row E8M0 group scales — every
    /// shipped weight); `None` when loading it converts (F16, other FP4 scales, HF's
    /// stacked non-float experts).
    pub fn matrix_source(
        &self,
        official_name: &str,
        shape: &[usize],
    ) -> Result<Option<MatrixSource>, CheckpointError> {
        self.source_at(official_name, &self.locate(official_name)?, shape)
    }

    /// [`Self::matrix_source`] of a name already located.
    pub(super) fn source_at(
        &self,
        official_name: &str,
        located: &Located,
        shape: &[usize],
    ) -> Result<Option<MatrixSource>, CheckpointError> {
        match located {
            Located::Whole {
                stored,
                shard,
                info,
            } => self.whole_source(official_name, stored, shard, info, shape),
            Located::Expert {
                stored,
                shard,
                info,
                expert,
                part,
            } => {
                if info.block.is_none() && !matches!(info.dtype, Dtype::F32 | Dtype::BF16) {
                    return Ok(None);
                }
                // Checked (and cut) as a load does; the range is the cut's.
                let name = describe(official_name, &format!("{stored}[{expert}]"));
                let (_, row0, first) =
                    stacked_cut(&name, info, *expert, *part, shape, official_name, stored)?;
                let (rows, cols) = (shape[0], shape[1]);
                let mut codes = self.file_range(shard, info);
                let format = match info.block {
                    // Block rows: `first` counts whole rows (a stacked GGUF tensor is one
                    // matrix per expert, so `row0` is 0).
                    Some(b) => {
                        let row = b.row_bytes(cols);
                        codes.offset += (first / cols.max(1) * row) as u64;
                        codes.len = rows * row;
                        debug_assert_eq!(row0, 0);
                        SourceFormat::Ggml(b)
                    }
                    None => {
                        let width = info.dtype.bitsize() / 8;
                        codes.offset += (first * width) as u64;
                        codes.len = rows * cols * width;
                        float_format(info.dtype)
                    }
                };
                Ok(Some(MatrixSource {
                    name,
                    rows,
                    cols,
                    format,
                    codes,
                    scales: None,
                }))
            }
        }
    }

    fn whole_source(
        &self,
        official: &str,
        stored: &str,
        shard: &Shard,
        info: &TensorInfo,
        shape: &[usize],
    ) -> Result<Option<MatrixSource>, CheckpointError> {
        let name = describe(official, stored);
        let codes = self.file_range(shard, info);
        let source = |format, scales| MatrixSource {
            name: name.clone(),
            rows: shape[0],
            cols: shape[1],
            format,
            codes,
            scales,
        };
        if let Some(b) = info.block {
            if info.shape != shape || shape.len() != 2 {
                return Err(shape_err(
                    name,
                    shape,
                    &info.shape,
                    "; a weight matrix is 2-D [out, in]",
                ));
            }
            return Ok(Some(source(SourceFormat::Ggml(b), None)));
        }
        match info.dtype {
            Dtype::F32 | Dtype::BF16 => {
                if info.shape != shape {
                    return Err(shape_err(name, shape, &info.shape, ""));
                }
                if shape.len() != 2 {
                    return Err(shape_err(
                        name,
                        shape,
                        &info.shape,
                        "; a weight matrix is 2-D [out, in]",
                    ));
                }
                Ok(Some(source(float_format(info.dtype), None)))
            }
            Dtype::F8_E4M3 => {
                if info.shape != shape || shape.len() != 2 {
                    return Err(shape_err(
                        name,
                        shape,
                        &info.shape,
                        "; FP8 weights are 2-D [out, in]",
                    ));
                }
                let scale = self.scale_for(official, &name)?;
                let (br, bc) = blocks_for(&name, shape, &scale.shape, &scale.name)?;
                let format = SourceFormat::Fp8 {
                    scale_dtype: scale.dtype,
                    scale_cols: scale.shape[1],
                    br,
                    bc,
                };
                Ok(Some(source(format, Some(scale.range))))
            }
            Dtype::I8 | Dtype::U8 => {
                check_fp4_shape(&name, shape, &info.shape)?;
                let scale = self.scale_for(official, &name)?;
                let (br, bc) = blocks_for(&name, shape, &scale.shape, &scale.name)?;
                if scale.dtype != Dtype::F8_E8M0 || br != 1 {
                    return Ok(None);
                }
                Ok(Some(source(
                    SourceFormat::Fp4 { group: bc },
                    Some(scale.range),
                )))
            }
            _ => Ok(None),
        }
    }
}

fn float_format(dtype: Dtype) -> SourceFormat {
    match dtype {
        Dtype::F32 => SourceFormat::F32,
        _ => SourceFormat::Bf16,
    }
}
