//! GGUF files, as llama.cpp's converter and quantizer write them for its `deepseek4`
//! architecture: one memory-mapped file whose tensors the checkpoint indexes by their GGUF
//! names ([`names`]) and shapes in row-major order, the metadata kept for the config and the
//! tokenizer.

pub(crate) mod names;
mod read;
mod types;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use deepinfer_kernels::ggml::Block;
use memmap2::Mmap;
use safetensors::Dtype;

pub use read::{is_gguf, Value};
pub use types::GgmlType;

use super::shard::{Shard, TensorInfo};
use super::CheckpointError;

/// Whether `path` is a GGUF checkpoint: a GGUF file, or a directory of them without
/// safetensors (what [`super::Checkpoint::open`] then opens).
pub fn holds_gguf(path: &Path) -> bool {
    if !path.is_dir() {
        return is_gguf(path);
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return false;
    };
    let exts: Vec<_> = entries
        .filter_map(|e| e.ok()?.path().extension().map(|x| x.to_owned()))
        .collect();
    exts.iter().any(|x| x == "gguf") && !exts.iter().any(|x| x == "safetensors")
}

/// The metadata of a GGUF file (`general.*`, `deepseek4.*`, `tokenizer.ggml.*` …).
pub type Metadata = BTreeMap<String, Value>;

/// The types deepinfer computes on, for the message that refuses the others.
fn computed() -> String {
    let blocks = Block::ALL.map(|b| b.name().to_ascii_uppercase());
    format!("F32, BF16, I32, {}", blocks.join(", "))
}

/// An opened GGUF file: its mapping, every tensor (named as stored, shapes row-major) and
/// the metadata.
pub(super) type Opened = (Shard, Vec<(String, TensorInfo)>, Metadata);

/// Opens `path` (see [`Opened`]).
pub(super) fn open(path: &Path) -> Result<Opened, CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    // SAFETY: as for safetensors shards (`shard::open`): the mapping is only read, and a
    // checkpoint file is an immutable input while it is open.
    let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
    let header = read::parse(&mmap).map_err(|e| CheckpointError::Gguf {
        file: path.to_path_buf(),
        offset: e.offset,
        reason: e.reason,
    })?;
    let mut tensors = Vec::with_capacity(header.tensors.len());
    for t in header.tensors {
        let (dtype, block) = stored_type(t.ty).ok_or_else(|| CheckpointError::Dtype {
            tensor: format!("`{}` in {}", t.name, path.display()),
            found: format!("ggml type {}", t.ty.name()),
            expected: format!("one deepinfer computes on ({})", computed()),
        })?;
        let info = TensorInfo {
            dtype,
            block,
            shape: t.ne.iter().rev().map(|&d| d as usize).collect(),
            start: t.start,
            end: t.end,
        };
        tensors.push((t.name, info));
    }
    let shard = Shard {
        path: path.to_path_buf(),
        mmap,
    };
    Ok((shard, tensors, header.meta))
}

/// How the checkpoint's index records a ggml type: its safetensors dtype for the plain
/// ones, a block format (with the dtype `U8`, never read as such) for the quantised ones.
fn stored_type(t: GgmlType) -> Option<(Dtype, Option<deepinfer_kernels::ggml::Block>)> {
    if let Some(b) = t.block() {
        // F16 matrices are computed on as stored, as llama.cpp's F16 products are; F16
        // vectors are widened like any float's (the dtype says how).
        let d = if b == Block::F16 {
            Dtype::F16
        } else {
            Dtype::U8
        };
        return Some((d, Some(b)));
    }
    let d = match t {
        types::F32 => Dtype::F32,
        types::F16 => Dtype::F16,
        types::BF16 => Dtype::BF16,
        types::I32 => Dtype::I32,
        _ => return None,
    };
    Some((d, None))
}

#[cfg(test)]
mod tests;
