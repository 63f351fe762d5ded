//! Errors of checkpoint loading. Each names the file or tensor involved and, where a
//! comparison failed, what was expected and what was found: a 300 GB checkpoint is not
//! something one wants to bisect by hand.

use std::path::PathBuf;

/// Fields named `tensor`/`weight`/`scale` hold display names (backquoted, with the stored name
/// when it differs from the official one); `Missing::tensor` is the bare official name.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no .safetensors file in directory {}", dir.display())]
    NoSafetensors { dir: PathBuf },
    #[error("corrupt checkpoint index {}: {reason}", path.display())]
    Index { path: PathBuf, reason: String },
    #[error(
        "shard `{shard}` listed in index {} (for tensor `{tensor}`) is missing: no file at {}",
        index.display(),
        path.display()
    )]
    MissingShard {
        index: PathBuf,
        shard: String,
        tensor: String,
        path: PathBuf,
    },
    #[error("{} is truncated: its {what} ends at byte {needed} but the file has only {actual} bytes", file.display())]
    Truncated {
        file: PathBuf,
        what: String,
        needed: u64,
        actual: u64,
    },
    #[error("{} is not a usable GGUF file: at byte {offset}, {reason}", file.display())]
    Gguf {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("{} holds several GGUF files that are not the shards of one split file ({files}): give --model the one to load", dir.display())]
    GgufChoice { dir: PathBuf, files: String },
    #[error("corrupt safetensors header in {}: {reason}", file.display())]
    Header { file: PathBuf, reason: String },
    #[error(
        "tensor `{tensor}` in {}: dtype {dtype} with shape {shape:?} needs {expected} bytes, but the header gives it {found}",
        file.display()
    )]
    ByteLength {
        file: PathBuf,
        tensor: String,
        dtype: String,
        shape: Vec<usize>,
        expected: u64,
        found: u64,
    },
    #[error("tensor `{tensor}` appears in both {} and {}", first.display(), second.display())]
    Duplicate {
        tensor: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("tensor `{tensor}` not found in the checkpoint (looked for {looked_for})")]
    Missing { tensor: String, looked_for: String },
    #[error("quantised weight {weight} has no block scale: looked for {scale}")]
    MissingScale { weight: String, scale: String },
    #[error("tensor {tensor}: expected shape {expected:?}, found {found:?}{detail}")]
    Shape {
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
        /// Extra context, starting with "; " when present.
        detail: String,
    },
    #[error("tensor {tensor}: unsupported dtype {found}, expected {expected}")]
    Dtype {
        tensor: String,
        found: String,
        expected: String,
    },
    #[error("scale {scale} with shape {scale_shape:?} does not tile weight {weight} of shape {weight_shape:?}")]
    ScaleShape {
        weight: String,
        weight_shape: Vec<usize>,
        scale: String,
        scale_shape: Vec<usize>,
    },
    #[error("the checkpoint holds layer {layer} (`{tensor}`), but the config declares {declared} layers (num_hidden_layers / n_layers): it describes another model")]
    ExtraLayers {
        layer: usize,
        tensor: String,
        declared: usize,
    },
    /// A tensor loaded fine but its contents make no sense for the model (e.g. an expert id
    /// out of range); raised by the weight loaders on top of this module.
    #[error("tensor `{name}` holds an invalid value: {reason}")]
    InvalidValue { name: String, reason: String },
}
