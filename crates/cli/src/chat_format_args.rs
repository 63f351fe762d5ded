//! Which chat format a checkpoint is served in (`serve` and `chat` alike): V4.1's for a
//! `deepseek_v41` config, else V4's with the effort tiers of the encoder the checkpoint ships,
//! or the ones `--reasoning-effort-profile` names.

use clap::{Args, ValueEnum};
use deepinfer_model::config::ModelConfig;
use deepinfer_server::chat::ChatFormat;
use deepinfer_server::tokenizer::Tokenizer;
use std::path::Path;

#[derive(Args, Debug, Clone, Default)]
pub struct ChatFormatArgs {
    /// DeepSeek-V4's effort tiers: `official` (vLLM 0.33's and the 0731 encoder's: `high`
    /// "Absolute maximum", `max` "Beyond maximum") or `preview` (the first V4 checkpoints'
    /// own encoder: `max` "Absolute maximum", nothing else). Default: the tiers of the
    /// checkpoint's `encoding/encoding_dsv4.py`, else `official`. Not for V4.1 (its efforts
    /// are numeric).
    #[arg(long, value_enum)]
    pub reasoning_effort_profile: Option<EffortProfile>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffortProfile {
    Official,
    Preview,
}

impl ChatFormatArgs {
    /// The format `dir`'s checkpoint is served in, said on stderr; a tokenizer that lacks one
    /// of the format's marker tokens is warned about (its prompts still render, the marker
    /// tokenized as pieces: off the format the model was trained on).
    pub fn resolve(
        &self,
        dir: &Path,
        config: &ModelConfig,
        tokenizer: &Tokenizer,
    ) -> anyhow::Result<ChatFormat> {
        let is_v41 = config.v41.is_some();
        let format = match (self.reasoning_effort_profile, is_v41) {
            (Some(_), true) => anyhow::bail!(
                "--reasoning-effort-profile: DeepSeek-V4.1 has no effort profiles (its efforts \
                 are numbers, 1-100); leave the flag out for this checkpoint"
            ),
            (Some(EffortProfile::Official), false) => ChatFormat::V4,
            (Some(EffortProfile::Preview), false) => ChatFormat::V4Preview,
            (None, _) => {
                let encoder = std::fs::read_to_string(dir.join("encoding/encoding_dsv4.py")).ok();
                ChatFormat::for_model(is_v41, encoder.as_deref())
            }
        };
        let missing: Vec<&str> = format
            .marker_tokens()
            .iter()
            .copied()
            .filter(|m| tokenizer.token_to_id(m).is_none())
            .collect();
        if !missing.is_empty() {
            tracing::warn!(
                format = format.name(),
                ?missing,
                "the tokenizer has no single token for these chat markers; prompts hold them as text"
            );
        }
        eprintln!("chat format: {}", format.name());
        Ok(format)
    }
}
