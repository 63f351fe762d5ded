//! Synthetic DeepSeek-V4 checkpoints: deterministic random weights in DeepSeek's official
//! layout and dtypes (docs/MODEL.md §4.1), with a shipped-style `config.json` and the real tokenizer.
//!
//! They exist so that loading, the quantised formats and performance can be exercised at
//! realistic shapes without downloading hundreds of GB: the values are drawn so activations
//! stay O(1) and logits are finite and non-degenerate, not to produce sensible text.
//! The same seed gives byte-identical files on any platform.

mod generate;
mod plan;
mod presets;
mod quant;
#[cfg(test)]
mod tests;
mod writer;

use std::path::{Path, PathBuf};

pub use generate::draw_values;
pub use plan::{tensor_plan, Init, PlannedTensor};
pub use presets::{preset, DenseFormat, SynthSpec, PRESETS};
pub use writer::{tokenizer_json, write_checkpoint_sharded, SHARD_BYTES};

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown preset `{name}`; known presets: {known}")]
    UnknownPreset { name: String, known: String },
    #[error("spec `{name}` cannot be written: {reason}")]
    InvalidSpec { name: String, reason: String },
    /// The cause is left to the error chain, so `{:#}` printing does not repeat it.
    #[error("cannot write {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Writes the checkpoint of `spec` into `out` (created if needed; files of the same name are
/// overwritten): `model-NNNNN-of-MMMMM.safetensors` shards of about [`SHARD_BYTES`] each with
/// `model.safetensors.index.json`, then `config.json`, `tokenizer.json` and
/// `tokenizer_config.json`. `progress(done, total)` is called in bytes of shard files as they
/// are written, so a caller can show a bar for multi-GB presets.
pub fn write_checkpoint(
    spec: &SynthSpec,
    out: &Path,
    seed: u64,
    progress: impl FnMut(u64, u64),
) -> Result<(), SynthError> {
    write_checkpoint_sharded(spec, out, seed, SHARD_BYTES, progress)
}
