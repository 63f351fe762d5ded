//! Model hyper-parameters, read from either flavour of `config.json` a V4 checkpoint ships with:
//! HF's (`model_type: deepseek_v4`, possibly carrying the legacy keys HF folds in) or DeepSeek's
//! own `inference/config.json` (`ModelArgs` names). Both become one [`ModelConfig`] so the rest
//! of the engine never cares which one it was given.
//!
//! Defaults for absent keys are the ones the matching reference would use (HF's
//! `DeepseekV4Config` fields, or `ModelArgs` defaults), so a config loads here exactly as it
//! would load there — except where the reference would crash or silently misread, which is an
//! error here instead.

mod cache_plan;
mod declared;
mod dspark;
mod fields;
pub mod gguf;
mod hf;
mod official;
#[cfg(test)]
mod tests;
mod v41;
mod validate;
mod vision;

pub use cache_plan::{CachePlan, EntryPool, LayerState, CSA_ENTRIES, HCA_ENTRIES, INDEXER_KEYS};
pub use dspark::DsparkConfig;
pub use v41::{Candidates, EngramConfig, V41};
pub use vision::{VisionConfig, VisionFamily, V4_SENTINEL_BASE};

use std::fmt::Display;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::numerics::Numerics;
use fields::{json_kind, Fields};
use validate::{HF_KEYS, OFFICIAL_KEYS};

/// Attention kind of one layer; every kind also attends to the sliding window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnKind {
    /// Sliding window only (HF `sliding_attention`, official ratio 0).
    Sliding,
    /// Compressed sparse attention: overlapping compression plus the lightning indexer
    /// (HF `compressed_sparse_attention`, official ratio 4).
    Csa,
    /// Heavily compressed attention: attends to every compressed entry
    /// (HF `heavily_compressed_attention`, any other official ratio).
    Hca,
    /// V4.1's compressed attention (docs/MODEL.md §8.3-5): non-overlapping compression by 1 or 2, the
    /// entries and index picks of source layers shared by the layers after them.
    Shared,
}

/// How a layer's MoE picks its experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlpKind {
    /// Frozen `tid2eid[token]` table (HF `hash_moe`; the first `n_hash_layers` layers).
    Hash,
    /// Top-k on router score plus bias (HF `moe`).
    Scored,
}

/// Router activation applied to the gate logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoringFunc {
    SqrtSoftplus,
    Softmax,
    Sigmoid,
}

/// YaRN frequency interpolation (docs/MODEL.md §2). No attention/mscale factor exists here on purpose:
/// the V4 reference never multiplies cos/sin, and HF pins `attention_factor` to 1.0, so a
/// config's `attention_factor` is ignored (with a warning when it is not 1.0).
#[derive(Clone, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
}

/// One RoPE table: V4 has two, `main` for sliding-only layers and `compress` for CSA/HCA layers.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    pub theta: f64,
    pub yarn: Option<Yarn>,
}

/// Hyper-parameters of a DeepSeek-V4 model, flavour-independent.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub head_dim: usize,
    /// Trailing slice of each head (and of each indexer head) that gets RoPE.
    pub qk_rope_head_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub sliding_window: usize,
    /// One entry per main layer (MTP layers excluded).
    pub layer_types: Vec<AttnKind>,
    pub compress_rate_csa: usize,
    pub compress_rate_hca: usize,
    /// One entry per main layer (MTP layers excluded).
    pub mlp_layer_types: Vec<MlpKind>,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_shared_experts: usize,
    pub moe_intermediate_size: usize,
    pub scoring_func: ScoringFunc,
    /// Whether selected weights are renormalised to sum 1 before scaling. The official code
    /// derives this from the score function (all but softmax), HF reads `norm_topk_prob`.
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
    /// SwiGLU clamp (gate ≤ limit, up ∈ [−limit, limit]). `f32::INFINITY` means no clamp: the
    /// official code disables clamping with `swiglu_limit = 0`, which HF would instead apply
    /// literally, so the official "off" is translated rather than stored as 0.
    pub swiglu_limit: f32,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    /// Also the eps of the unweighted RMS inside mHC and the per-head q norm.
    pub rms_norm_eps: f32,
    pub rope_main: RopeParams,
    pub rope_compress: RopeParams,
    pub max_position_embeddings: usize,
    pub num_nextn_predict_layers: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Which rounding the forward pass computes: a run-time choice, not read from the file.
    pub numerics: Numerics,
    /// V4.1's architecture (docs/MODEL.md §8); `None` for V4.
    pub v41: Option<V41>,
    /// The DSpark drafter the config announces (docs/MODEL.md §7.2); the checkpoint may still lack it.
    pub dspark: Option<DsparkConfig>,
    /// The vision tower the config declares (docs/MODEL.md §8.9); the checkpoint may still lack it.
    pub vision: Option<VisionConfig>,
}

/// Why a config could not be used. Messages name the offending field as written in the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("config lacks required field `{field}`")]
    Missing { field: String },
    #[error("config field `{field}` = {value} is invalid: {reason}")]
    Invalid {
        field: String,
        value: String,
        reason: String,
    },
}

fn invalid(
    field: impl Into<String>,
    value: impl Display,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

impl ModelConfig {
    /// Whether an image's positions see its whole span during prefill (V4-Flash-Vision-Exp,
    /// docs/MODEL.md §8.9), so that a span must be prefilled in one chunk.
    pub fn image_spans_see_themselves(&self) -> bool {
        self.vision
            .as_ref()
            .is_some_and(|v| v.family == VisionFamily::V4)
    }

    /// The token ids that mark image positions, which route with `gate.bias_vl`: V4.1's
    /// image token, V4-Flash-Vision-Exp's five sentinels.
    pub fn image_ids(&self) -> Option<std::ops::Range<u32>> {
        match (&self.vision, &self.v41) {
            (Some(v), _) if v.family == VisionFamily::V4 => Some(v.sentinels()),
            (_, Some(v41)) => v41.image_token_id.map(|id| id..id + 1),
            _ => None,
        }
    }

    /// Parses and validates a `config.json` body of either flavour. The flavour is chosen by
    /// `hidden_size` (HF) versus `dim`/`n_layers` (official); unknown keys are ignored because
    /// real configs carry many that do not affect the forward pass.
    pub fn from_json_str(s: &str) -> Result<Self, ConfigError> {
        let v: Value = serde_json::from_str(s)?;
        let obj: &Map<String, Value> = v
            .as_object()
            .ok_or_else(|| invalid("<root>", json_kind(&v), "config.json must be a JSON object"))?;
        let f = Fields::root(obj);
        // DeepSeek's inference config names the model's width `dim`; every other (HF's, V4.1's
        // `text_config` wrapper) is Hugging Face's layout.
        declared::check(
            &f,
            !(f.has("dim") || f.has("n_layers")) || f.has("hidden_size"),
        )?;
        if v41::declared(&f)? {
            let text = f.obj("text_config")?.unwrap_or(Fields::root(obj));
            let mut cfg = hf::parse(&text, true)?;
            cfg.validate(&HF_KEYS)?;
            cfg.vision = vision::parse(&f, true)?;
            Ok(cfg)
        } else if f.has("hidden_size") {
            let mut cfg = hf::parse(&f, false)?;
            cfg.validate(&HF_KEYS)?;
            cfg.vision = vision::parse(&f, false)?;
            Ok(cfg)
        } else if f.has("dim") || f.has("n_layers") {
            let cfg = official::parse(&f)?;
            cfg.validate(&OFFICIAL_KEYS)?;
            Ok(cfg)
        } else {
            Err(ConfigError::Missing {
                field: "hidden_size (HF config) or dim (DeepSeek inference config)".into(),
            })
        }
    }

    /// Reads and parses a `config.json` file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let s = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_str(&s)
    }

    /// 0 for Sliding, compress_rate_csa for Csa, compress_rate_hca for Hca.
    ///
    /// # Panics
    /// If `layer >= num_hidden_layers` (MTP layers are always sliding; ask about them directly).
    pub fn compress_ratio(&self, layer: usize) -> usize {
        match self.layer_types[layer] {
            AttnKind::Sliding => 0,
            AttnKind::Csa => self.compress_rate_csa,
            AttnKind::Hca => self.compress_rate_hca,
            AttnKind::Shared => self.v41.as_ref().map_or(0, |v| v.compress_ratios[layer]),
        }
    }
}
