//! Tables read in place: an FP8 matrix whose rows are read from the file when asked for.
//! V4.1's Engram tables are ~100 GB per layer and a step reads a few dozen rows of them per
//! token, so they are never loaded. Rows are read with positioned reads rather than through
//! a mapping: a mapping's page faults map the neighbouring pages the page cache holds too
//! (fault-around), which made a freshly written 300 MB table fully resident after one
//! 256-token prefill here; a read costs only the bytes of the row, and what the page cache
//! keeps stays reclaimable and out of the process.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use safetensors::Dtype;

use super::{Checkpoint, CheckpointError, SourceFormat};
use deepinfer_kernels::formats::{e4m3_to_f32, e8m0_to_f32};

/// FP8 E4M3 rows `[rows, cols]` with one E8M0 scale per `group` columns of each row, left
/// in their file.
#[derive(Debug)]
pub struct TableRows {
    file: Arc<File>,
    path: PathBuf,
    codes: u64,
    scales: u64,
    pub rows: usize,
    pub cols: usize,
    group: usize,
}

impl TableRows {
    /// Row `r` (below `rows`) dequantised into `out` (`cols` floats); `bytes`: scratch.
    pub fn row_into(
        &self,
        r: usize,
        out: &mut [f32],
        bytes: &mut Vec<u8>,
    ) -> Result<(), CheckpointError> {
        let groups = self.cols.div_ceil(self.group);
        bytes.resize(self.cols + groups, 0);
        let (codes, scales) = bytes.split_at_mut(self.cols);
        let io = |source| CheckpointError::Io {
            path: self.path.clone(),
            source,
        };
        self.file
            .read_exact_at(codes, self.codes + (r * self.cols) as u64)
            .map_err(io)?;
        self.file
            .read_exact_at(scales, self.scales + (r * groups) as u64)
            .map_err(io)?;
        for ((o, c), s) in out
            .chunks_mut(self.group)
            .zip(codes.chunks(self.group))
            .zip(scales.iter())
        {
            let s = e8m0_to_f32(*s);
            for (o, &c) in o.iter_mut().zip(c) {
                *o = e4m3_to_f32(c) * s;
            }
        }
        Ok(())
    }

    /// Bytes the table occupies in its file (codes and scales).
    pub fn stored_bytes(&self) -> usize {
        self.rows * (self.cols + self.cols.div_ceil(self.group))
    }
}

impl Checkpoint {
    /// `name` (`[rows, cols]`, FP8 with E8M0 scales over `1 × g` blocks) as [`TableRows`],
    /// checked as [`Checkpoint::matrix`] checks a weight, but not read.
    pub fn table_rows(&self, name: &str, shape: [usize; 2]) -> Result<TableRows, CheckpointError> {
        let bad = |reason: &str| CheckpointError::InvalidValue {
            name: name.to_string(),
            reason: reason.to_string(),
        };
        let Some(src) = self.matrix_source(name, &shape)? else {
            return Err(bad(
                "a table read in place must be stored as FP8 with E8M0 scales",
            ));
        };
        let group =
            match src.format {
                SourceFormat::Fp8 {
                    scale_dtype: Dtype::F8_E8M0,
                    br: 1,
                    bc,
                    ..
                } => bc,
                _ => return Err(bad(
                    "a table read in place must be FP8 with one E8M0 scale per row block (1 × g)",
                )),
            };
        let scales = src.scales.ok_or_else(|| bad("FP8 table without scales"))?;
        if scales.file != src.codes.file {
            return Err(bad(
                "a table's scales must lie in the same file as its codes",
            ));
        }
        let path = self.shards[src.codes.file].path.clone();
        let file = File::open(&path).map_err(|source| CheckpointError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(TableRows {
            file: Arc::new(file),
            path,
            codes: src.codes.offset,
            scales: scales.offset,
            rows: shape[0],
            cols: shape[1],
            group,
        })
    }
}
