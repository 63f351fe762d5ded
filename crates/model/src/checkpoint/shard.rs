//! One memory-mapped safetensors file and its validated header.
//!
//! The header is checked here, before the `safetensors` crate sees it, because the crate's
//! errors name neither the file nor the byte counts ("metadata incomplete buffer"); a
//! half-downloaded shard deserves a message that says so.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use super::CheckpointError;
use deepinfer_kernels::ggml::Block;

/// Where a tensor's bytes live: absolute byte range within its shard's mapping.
#[derive(Clone, Debug)]
pub(super) struct TensorInfo {
    pub dtype: Dtype,
    /// A ggml block format (GGUF files): then the bytes are rows of blocks and `dtype` says
    /// nothing.
    pub block: Option<Block>,
    pub shape: Vec<usize>,
    pub start: usize,
    pub end: usize,
}

pub(super) struct Shard {
    pub path: PathBuf,
    pub mmap: Mmap,
}

impl Shard {
    /// The tensor's bytes; `info` comes from this shard's validated header, so the range is in
    /// bounds, but a bad pairing still yields an error rather than a panic.
    pub fn bytes(&self, info: &TensorInfo) -> Result<&[u8], CheckpointError> {
        self.range(info.start, info.end)
    }

    /// Bytes `start..end` of the file.
    pub fn range(&self, start: usize, end: usize) -> Result<&[u8], CheckpointError> {
        self.mmap
            .get(start..end)
            .ok_or_else(|| CheckpointError::Truncated {
                file: self.path.clone(),
                what: "tensor data".into(),
                needed: end as u64,
                actual: self.mmap.len() as u64,
            })
    }
}

#[derive(Deserialize)]
struct RawInfo {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: (usize, usize),
}

fn header_err(path: &Path, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::Header {
        file: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Every entry of the JSON header names a known dtype and a byte range as long as its shape
/// needs, and the ranges fit in the `file_len − header_end` bytes of data after the header.
fn check_entries(
    path: &Path,
    entries: &HashMap<String, serde_json::Value>,
    header_end: usize,
    file_len: u64,
) -> Result<(), CheckpointError> {
    let data_len = file_len - header_end as u64;
    let mut max_end = 0usize;
    let mut names: Vec<&String> = entries.keys().filter(|k| *k != "__metadata__").collect();
    names.sort();
    for name in names {
        let raw = RawInfo::deserialize(&entries[name]).map_err(|e| {
            header_err(path, format!("entry for tensor `{name}` is malformed: {e}"))
        })?;
        let dtype: Dtype = serde_json::from_value(serde_json::Value::String(raw.dtype.clone()))
            .map_err(|_| {
                header_err(
                    path,
                    format!("tensor `{name}` has unknown dtype {:?}", raw.dtype),
                )
            })?;
        let (s, e) = raw.data_offsets;
        let expected = byte_len(dtype, &raw.shape).ok_or_else(|| {
            header_err(
                path,
                format!(
                    "tensor `{name}`: shape {:?} of {} has no whole byte size",
                    raw.shape, raw.dtype
                ),
            )
        })?;
        if e < s || e - s != expected {
            return Err(CheckpointError::ByteLength {
                file: path.to_path_buf(),
                tensor: name.clone(),
                dtype: raw.dtype,
                shape: raw.shape,
                expected: expected as u64,
                found: e.wrapping_sub(s) as u64,
            });
        }
        max_end = max_end.max(e);
    }
    if max_end as u64 > data_len {
        return Err(CheckpointError::Truncated {
            file: path.to_path_buf(),
            what: "tensor data".into(),
            needed: header_end as u64 + max_end as u64,
            actual: file_len,
        });
    }
    Ok(())
}

/// Size in bytes of `shape` elements of `dtype`, `None` on overflow or a partial byte.
pub(super) fn byte_len(dtype: Dtype, shape: &[usize]) -> Option<usize> {
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    let bits = n.checked_mul(dtype.bitsize())?;
    (bits % 8 == 0).then_some(bits / 8)
}

pub(super) fn open(path: &Path) -> Result<(Shard, Vec<(String, TensorInfo)>), CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    if file_len < 8 {
        return Err(CheckpointError::Truncated {
            file: path.to_path_buf(),
            what: "8-byte header length prefix".into(),
            needed: 8,
            actual: file_len,
        });
    }
    // SAFETY: the mapping is only ever read. Mapping a file is unsound only if another process
    // truncates or rewrites it while mapped; checkpoints are treated as immutable inputs for
    // the lifetime of a `Checkpoint` (the same assumption the `safetensors` and HF loaders
    // make), and nothing in this crate writes to them.
    let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&mmap[..8]);
    let n = u64::from_le_bytes(prefix);
    let header_end =
        n.checked_add(8)
            .filter(|&e| e <= file_len)
            .ok_or_else(|| CheckpointError::Truncated {
                file: path.to_path_buf(),
                what: format!("{n}-byte JSON header"),
                needed: n.saturating_add(8),
                actual: file_len,
            })? as usize;
    let header = std::str::from_utf8(&mmap[8..header_end])
        .map_err(|e| header_err(path, format!("header is not UTF-8: {e}")))?;
    let entries: HashMap<String, serde_json::Value> = serde_json::from_str(header)
        .map_err(|e| header_err(path, format!("header is not a JSON object: {e}")))?;

    check_entries(path, &entries, header_end, file_len)?;

    // Our checks passed; the crate's own validation still catches gaps, overlaps and trailing
    // bytes, and its parse is the one we index from.
    let (_, metadata) =
        SafeTensors::read_metadata(&mmap[..]).map_err(|e| header_err(path, e.to_string()))?;
    let tensors = metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let t = TensorInfo {
                dtype: info.dtype,
                block: None,
                shape: info.shape.clone(),
                start: header_end + info.data_offsets.0,
                end: header_end + info.data_offsets.1,
            };
            (name, t)
        })
        .collect();
    Ok((
        Shard {
            path: path.to_path_buf(),
            mmap,
        },
        tensors,
    ))
}
