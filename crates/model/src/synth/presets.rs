//! Named model shapes and the `config.json` each one ships with.

use serde_json::{json, Value};

use super::SynthError;
use crate::config::ModelConfig;

/// Every preset [`preset`] knows, in the order error messages list them.
pub const PRESETS: &[&str] = &["tiny", "bench"];

/// The hyper-parameters of a synthetic checkpoint, in HF `config.json` terms. One per-layer
/// compression ratio list (0 = SWA, 4 = CSA, other = HCA at that rate) rather than kinds,
/// because that is what shipped configs carry and what the official inventory is keyed on.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub name: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub sliding_window: usize,
    /// One entry per layer; its length is the layer count (no MTP entries: none are written).
    pub compress_ratios: Vec<usize>,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_shared_experts: usize,
    pub moe_intermediate_size: usize,
    pub num_hash_layers: usize,
    pub routed_scaling_factor: f64,
    pub swiglu_limit: f64,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub compress_rope_theta: f64,
    pub yarn_factor: f64,
    pub yarn_original_max_position_embeddings: usize,
    pub yarn_beta_fast: f64,
    pub yarn_beta_slow: f64,
    pub max_position_embeddings: usize,
}

/// The real tokenizer's vocabulary, so synthetic checkpoints run on real text.
const VOCAB: usize = 129_280;

/// V4-Flash's non-shape settings; presets differ only in shape.
fn flash_like(name: &str) -> SynthSpec {
    SynthSpec {
        name: name.to_string(),
        vocab_size: VOCAB,
        hidden_size: 4096,
        num_attention_heads: 64,
        head_dim: 512,
        qk_rope_head_dim: 64,
        q_lora_rank: 1024,
        o_groups: 8,
        o_lora_rank: 1024,
        sliding_window: 128,
        compress_ratios: Vec::new(),
        index_n_heads: 64,
        index_head_dim: 128,
        index_topk: 512,
        n_routed_experts: 256,
        num_experts_per_tok: 6,
        n_shared_experts: 1,
        moe_intermediate_size: 2048,
        num_hash_layers: 3,
        routed_scaling_factor: 1.5,
        swiglu_limit: 10.0,
        hc_mult: 4,
        hc_sinkhorn_iters: 20,
        hc_eps: 1e-6,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        compress_rope_theta: 160000.0,
        yarn_factor: 16.0,
        yarn_original_max_position_embeddings: 65536,
        yarn_beta_fast: 32.0,
        yarn_beta_slow: 1.0,
        max_position_embeddings: 1_048_576,
    }
}

/// Looks a preset up by name.
///
/// * `tiny`: every layer kind and both router kinds at toy width (SWA, CSA, HCA m=8, CSA; two
///   hash layers) with the real vocabulary; tens of MB, written in about a second.
/// * `bench`: V4-Flash's architecture at a width this machine can run (hidden 2048, 12 layers,
///   64 experts), about 3.3 GB; the shape performance numbers are quoted for, so keep it fixed.
pub fn preset(name: &str) -> Result<SynthSpec, SynthError> {
    match name {
        "tiny" => Ok(SynthSpec {
            hidden_size: 128,
            num_attention_heads: 2,
            head_dim: 128,
            q_lora_rank: 128,
            o_groups: 2,
            o_lora_rank: 64,
            sliding_window: 16,
            compress_ratios: vec![0, 4, 8, 4],
            index_n_heads: 16,
            // Strictly wider than the rope slice (spec §10.1), unlike a 64-wide indexer head.
            index_head_dim: 128,
            index_topk: 4,
            n_routed_experts: 8,
            num_experts_per_tok: 2,
            moe_intermediate_size: 64,
            num_hash_layers: 2,
            max_position_embeddings: 65536,
            ..flash_like("tiny")
        }),
        "bench" => {
            // 2 SWA layers, then CSA/HCA alternating from CSA, as in V4-Flash.
            let mut ratios = vec![0, 0];
            ratios.extend((2..12).map(|l| if l % 2 == 0 { 4 } else { 128 }));
            Ok(SynthSpec {
                hidden_size: 2048,
                num_attention_heads: 16,
                q_lora_rank: 512,
                o_groups: 4,
                o_lora_rank: 512,
                compress_ratios: ratios,
                index_n_heads: 16,
                n_routed_experts: 64,
                moe_intermediate_size: 768,
                ..flash_like("bench")
            })
        }
        other => Err(SynthError::UnknownPreset {
            name: other.to_string(),
            known: PRESETS.join(", "),
        }),
    }
}

impl SynthSpec {
    pub fn num_hidden_layers(&self) -> usize {
        self.compress_ratios.len()
    }

    /// Refuses a hand-made spec the writer could not turn into a loadable checkpoint: one whose
    /// config a loader would reject, or whose FP4 experts would not split into 32-input groups.
    pub fn validate(&self) -> Result<(), SynthError> {
        let invalid = |reason: String| SynthError::InvalidSpec {
            name: self.name.clone(),
            reason,
        };
        ModelConfig::from_json_str(&self.config_json().to_string())
            .map_err(|e| invalid(e.to_string()))?;
        for (field, v) in [
            ("hidden_size", self.hidden_size),
            ("moe_intermediate_size", self.moe_intermediate_size),
        ] {
            if v % 32 != 0 {
                return Err(invalid(format!(
                    "{field} = {v} must be a multiple of 32 (FP4 experts scale 32-input groups)"
                )));
            }
        }
        Ok(())
    }

    /// The `config.json` a shipped V4 checkpoint would carry for this shape: HF keys plus the
    /// legacy ones real checkpoints still use (`compress_ratios`, `num_hash_layers`,
    /// `qk_rope_head_dim`, `rope_scaling`), so loaders are exercised on what they will meet.
    pub fn config_json(&self) -> Value {
        let pairs = [
            ("architectures", json!(["DeepseekV4ForCausalLM"])),
            ("model_type", json!("deepseek_v4")),
            ("vocab_size", json!(self.vocab_size)),
            ("hidden_size", json!(self.hidden_size)),
            ("num_hidden_layers", json!(self.num_hidden_layers())),
            ("num_attention_heads", json!(self.num_attention_heads)),
            ("num_key_value_heads", json!(1)),
            ("head_dim", json!(self.head_dim)),
            ("qk_rope_head_dim", json!(self.qk_rope_head_dim)),
            ("q_lora_rank", json!(self.q_lora_rank)),
            ("o_groups", json!(self.o_groups)),
            ("o_lora_rank", json!(self.o_lora_rank)),
            ("sliding_window", json!(self.sliding_window)),
            ("compress_ratios", json!(self.compress_ratios)),
            ("compress_rope_theta", json!(self.compress_rope_theta)),
            ("rope_theta", json!(self.rope_theta)),
            (
                "rope_scaling",
                json!({
                    "type": "yarn",
                    "rope_type": "yarn",
                    "factor": self.yarn_factor,
                    "original_max_position_embeddings": self.yarn_original_max_position_embeddings,
                    "beta_fast": self.yarn_beta_fast,
                    "beta_slow": self.yarn_beta_slow,
                }),
            ),
            (
                "max_position_embeddings",
                json!(self.max_position_embeddings),
            ),
            ("index_n_heads", json!(self.index_n_heads)),
            ("index_head_dim", json!(self.index_head_dim)),
            ("index_topk", json!(self.index_topk)),
            ("n_routed_experts", json!(self.n_routed_experts)),
            ("num_experts_per_tok", json!(self.num_experts_per_tok)),
            ("n_shared_experts", json!(self.n_shared_experts)),
            ("moe_intermediate_size", json!(self.moe_intermediate_size)),
            ("scoring_func", json!("sqrtsoftplus")),
            ("topk_method", json!("noaux_tc")),
            ("norm_topk_prob", json!(true)),
            ("routed_scaling_factor", json!(self.routed_scaling_factor)),
            ("num_hash_layers", json!(self.num_hash_layers)),
            ("swiglu_limit", json!(self.swiglu_limit)),
            ("hc_mult", json!(self.hc_mult)),
            ("hc_sinkhorn_iters", json!(self.hc_sinkhorn_iters)),
            ("hc_eps", json!(self.hc_eps)),
            ("rms_norm_eps", json!(self.rms_norm_eps)),
            ("num_nextn_predict_layers", json!(0)),
            ("bos_token_id", json!(0)),
            ("eos_token_id", json!(1)),
            ("tie_word_embeddings", json!(false)),
            ("hidden_act", json!("silu")),
            ("torch_dtype", json!("bfloat16")),
            ("expert_dtype", json!("fp4")),
            (
                "quantization_config",
                json!({
                    "quant_method": "fp8",
                    "activation_scheme": "dynamic",
                    "fmt": "e4m3",
                    "scale_fmt": "ue8m0",
                    "weight_block_size": [128, 128],
                }),
            ),
        ];
        Value::Object(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }
}
