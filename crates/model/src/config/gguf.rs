//! The config of a GGUF file: its `deepseek4.*` metadata, which llama.cpp's converter writes
//! from the checkpoint's `config.json` (`conversion/deepseek.py`, `set_gguf_parameters`),
//! turned back into that `config.json` and parsed as one, so a GGUF model is validated by
//! the same rules as the checkpoint it came from.

use serde_json::{json, Map, Value as Json};

use std::path::Path;

use super::{ConfigError, ModelConfig};
use crate::checkpoint::gguf::{Metadata, Value};
use crate::checkpoint::Checkpoint;

const ARCH: &str = "deepseek4";

/// `(GGUF key under deepseek4., config.json key)` for the values copied as they are.
const SCALARS: &[(&str, &str)] = &[
    ("block_count", "num_hidden_layers"),
    ("context_length", "max_position_embeddings"),
    ("embedding_length", "hidden_size"),
    ("attention.head_count", "num_attention_heads"),
    ("attention.head_count_kv", "num_key_value_heads"),
    ("attention.key_length", "head_dim"),
    ("rope.dimension_count", "qk_rope_head_dim"),
    ("rope.freq_base", "rope_theta"),
    ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
    ("attention.q_lora_rank", "q_lora_rank"),
    ("attention.sliding_window", "sliding_window"),
    ("attention.output_group_count", "o_groups"),
    ("attention.output_lora_rank", "o_lora_rank"),
    ("attention.compress_rope_freq_base", "compress_rope_theta"),
    ("attention.indexer.head_count", "index_n_heads"),
    ("attention.indexer.key_length", "index_head_dim"),
    ("attention.indexer.top_k", "index_topk"),
    ("expert_count", "n_routed_experts"),
    ("expert_used_count", "num_experts_per_tok"),
    ("expert_shared_count", "n_shared_experts"),
    ("expert_feed_forward_length", "moe_intermediate_size"),
    ("expert_weights_scale", "routed_scaling_factor"),
    ("expert_weights_norm", "norm_topk_prob"),
    ("hyper_connection.count", "hc_mult"),
    ("hyper_connection.sinkhorn_iterations", "hc_sinkhorn_iters"),
    ("hyper_connection.epsilon", "hc_eps"),
    ("hash_layer_count", "num_hash_layers"),
    ("nextn_predict_layers", "num_nextn_predict_layers"),
];

/// `(GGUF key under deepseek4.rope.scaling., rope_scaling key)`.
const YARN: &[(&str, &str)] = &[
    ("factor", "factor"),
    (
        "original_context_length",
        "original_max_position_embeddings",
    ),
    ("yarn_beta_fast", "beta_fast"),
    ("yarn_beta_slow", "beta_slow"),
];

fn bad(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: key.to_string(),
        value: String::new(),
        reason: reason.into(),
    }
}

fn json_of(key: &str, v: &Value) -> Result<Json, ConfigError> {
    Ok(match v {
        Value::Bool(b) => json!(b),
        Value::Str(s) => json!(s),
        Value::F32(x) => json!(*x as f64),
        Value::F64(x) => json!(x),
        Value::Array(items) => Json::Array(
            items
                .iter()
                .map(|i| json_of(key, i))
                .collect::<Result<_, _>>()?,
        ),
        other => match other.as_u64() {
            Some(u) => json!(u),
            None => json!(other.as_f64().ok_or_else(|| bad(key, "not a number"))?),
        },
    })
}

/// The `config.json` (HF's layout) the metadata `meta` was written from.
pub fn config_json(meta: &Metadata) -> Result<Json, ConfigError> {
    let arch = meta.get("general.architecture").and_then(Value::as_str);
    if arch != Some(ARCH) {
        return Err(bad(
            "general.architecture",
            format!("is {arch:?}; deepinfer runs llama.cpp's `{ARCH}` GGUF files (DeepSeek-V4)"),
        ));
    }
    let key = |k: &str| format!("{ARCH}.{k}");
    let mut cfg = Map::new();
    cfg.insert("model_type".into(), json!("deepseek_v4"));
    for (g, h) in SCALARS {
        if let Some(v) = meta.get(&key(g)) {
            cfg.insert(h.to_string(), json_of(&key(g), v)?);
        }
    }
    // llama.cpp ships the MTP block in a sidecar file: the main file has none.
    cfg.entry("num_nextn_predict_layers").or_insert(json!(0));
    let ratios = key("attention.compress_ratios");
    if let Some(v) = meta.get(&ratios) {
        cfg.insert("compress_ratios".into(), json_of(&ratios, v)?);
    }
    cfg.insert("scoring_func".into(), json!(scoring(meta)?));
    cfg.insert("swiglu_limit".into(), json!(swiglu_limit(meta)?));
    if let Some(rs) = rope_scaling(meta)? {
        cfg.insert("rope_scaling".into(), rs);
    }
    let vocab = meta
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .map(<[Value]>::len);
    if let Some(n) = vocab {
        cfg.insert("vocab_size".into(), json!(n));
    }
    for (g, h) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
    ] {
        if let Some(id) = meta.get(g).and_then(Value::as_u64) {
            cfg.insert(h.into(), json!(id));
        }
    }
    Ok(Json::Object(cfg))
}

/// `expert_gating_func` (gguf-py's `ExpertGatingFuncType`: 1 softmax, 2 sigmoid, 4
/// sqrt-softplus) as `scoring_func`.
fn scoring(meta: &Metadata) -> Result<&'static str, ConfigError> {
    let k = format!("{ARCH}.expert_gating_func");
    match meta.get(&k).and_then(Value::as_u64) {
        None | Some(4) => Ok("sqrtsoftplus"),
        Some(1) => Ok("softmax"),
        Some(2) => Ok("sigmoid"),
        Some(n) => Err(bad(
            &k,
            format!("is {n}: 1 (softmax), 2 (sigmoid) or 4 (sqrtsoftplus)"),
        )),
    }
}

/// The per-layer `swiglu_clamp_exp` (and `_shexp`) values, which V4's config states once as
/// `swiglu_limit`: they must agree, since the engine clamps every expert alike.
fn swiglu_limit(meta: &Metadata) -> Result<f64, ConfigError> {
    let mut limit: Option<f64> = None;
    for k in ["swiglu_clamp_exp", "swiglu_clamp_shexp"].map(|k| format!("{ARCH}.{k}")) {
        let Some(v) = meta.get(&k) else { continue };
        let values: Vec<f64> = match v.as_array() {
            Some(a) => a.iter().filter_map(Value::as_f64).collect(),
            None => v.as_f64().into_iter().collect(),
        };
        for x in values {
            match limit {
                Some(l) if l != x => {
                    return Err(bad(
                        &k,
                        format!(
                        "holds {x} beside {l}; deepinfer clamps every layer's experts to one limit"
                    ),
                    ))
                }
                _ => limit = Some(x),
            }
        }
    }
    Ok(limit.unwrap_or(10.0))
}

fn rope_scaling(meta: &Metadata) -> Result<Option<Json>, ConfigError> {
    let k = |s: &str| format!("{ARCH}.rope.scaling.{s}");
    match meta.get(&k("type")).and_then(Value::as_str) {
        None | Some("none") => Ok(None),
        Some("yarn") => {
            let mut rs = Map::new();
            rs.insert("type".into(), json!("yarn"));
            for (g, h) in YARN {
                if let Some(v) = meta.get(&k(g)) {
                    rs.insert(h.to_string(), json_of(&k(g), v)?);
                }
            }
            Ok(Some(Json::Object(rs)))
        }
        Some(other) => Err(bad(&k("type"), format!("is {other:?}; V4 uses yarn"))),
    }
}

impl ModelConfig {
    /// The config of a GGUF file, from its metadata (see [`config_json`]).
    pub fn from_gguf(meta: &Metadata) -> Result<Self, ConfigError> {
        Self::from_json_str(&config_json(meta)?.to_string())
    }

    /// The config of the checkpoint `ck` opened at `path`, and the bytes it was read from
    /// (what identifies it beside the tensors): `path/config.json`, or a GGUF file's
    /// metadata as the `config.json` it stands for.
    pub fn of_checkpoint(path: &Path, ck: &Checkpoint) -> Result<(Self, Vec<u8>), ConfigError> {
        match ck.gguf_metadata() {
            Some(meta) => {
                let json = config_json(meta)?.to_string();
                Ok((Self::from_json_str(&json)?, json.into_bytes()))
            }
            None => {
                let file = path.join("config.json");
                let bytes = std::fs::read(&file)
                    .map_err(|source| ConfigError::Io { path: file, source })?;
                let text = String::from_utf8_lossy(&bytes);
                Ok((Self::from_json_str(&text)?, bytes))
            }
        }
    }
}
