//! Model hyper-parameters, read from either flavour of `config.json` a V4 checkpoint ships with:
//! HF's (`model_type: deepseek_v4`, possibly carrying the legacy keys HF folds in) or DeepSeek's
//! own `inference/config.json` (`ModelArgs` names). Both become one [`ModelConfig`] so the rest
//! of the engine never cares which one it was given.
//!
//! Defaults for absent keys are the ones the matching reference would use (HF's
//! `DeepseekV4Config` fields, or `ModelArgs` defaults), so a config loads here exactly as it
//! would load there — except where the reference would crash or silently misread, which is an
//! error here instead.

use std::fmt::Display;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

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

/// YaRN frequency interpolation (spec §2). No attention/mscale factor exists here on purpose:
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
    /// Parses and validates a `config.json` body of either flavour. The flavour is chosen by
    /// `hidden_size` (HF) versus `dim`/`n_layers` (official); unknown keys are ignored because
    /// real configs carry many that do not affect the forward pass.
    pub fn from_json_str(s: &str) -> Result<Self, ConfigError> {
        let v: Value = serde_json::from_str(s)?;
        let obj: &Map<String, Value> = v
            .as_object()
            .ok_or_else(|| invalid("<root>", json_kind(&v), "config.json must be a JSON object"))?;
        let f = Fields::root(obj);
        if f.has("hidden_size") {
            let cfg = parse_hf(&f)?;
            cfg.validate(&HF_KEYS)?;
            Ok(cfg)
        } else if f.has("dim") || f.has("n_layers") {
            let cfg = parse_official(&f)?;
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
        }
    }

    fn validate(&self, k: &Keys) -> Result<(), ConfigError> {
        let n = self.num_hidden_layers;
        for (field, v) in [
            (k.vocab, self.vocab_size),
            (k.hidden, self.hidden_size),
            (k.layers, n),
            (k.heads, self.num_attention_heads),
            (k.q_lora, self.q_lora_rank),
            (k.o_lora, self.o_lora_rank),
            (k.inter, self.moe_intermediate_size),
            (k.experts, self.n_routed_experts),
            (k.topk, self.num_experts_per_tok),
            (k.index_heads, self.index_n_heads),
            (k.max_pos, self.max_position_embeddings),
        ] {
            ensure(v > 0, field, v, "must be > 0")?;
        }
        let rd = self.qk_rope_head_dim;
        ensure(
            rd > 0 && rd.is_multiple_of(2),
            k.rope_dim,
            rd,
            "RoPE rotates pairs: must be even and > 0",
        )?;
        ensure(
            self.head_dim.is_multiple_of(2),
            k.head_dim,
            self.head_dim,
            "must be even",
        )?;
        ensure(
            self.head_dim >= rd,
            k.head_dim,
            self.head_dim,
            format!("must be >= {} = {rd}", k.rope_dim),
        )?;
        ensure(
            self.index_head_dim >= rd,
            k.index_dim,
            self.index_head_dim,
            format!(
                "indexer heads carry RoPE too: must be >= {} = {rd}",
                k.rope_dim
            ),
        )?;
        ensure(self.o_groups > 0, k.o_groups, self.o_groups, "must be > 0")?;
        ensure(
            self.num_attention_heads.is_multiple_of(self.o_groups),
            k.o_groups,
            self.o_groups,
            format!("must divide {} = {}", k.heads, self.num_attention_heads),
        )?;
        for (field, len) in [
            (k.layer_types, self.layer_types.len()),
            (k.mlp_types, self.mlp_layer_types.len()),
        ] {
            ensure(
                len == n,
                field,
                format!("{len} entries"),
                format!("needs one entry per layer ({} = {n})", k.layers),
            )?;
        }
        ensure(
            self.compress_rate_csa >= 2,
            k.csa_rate,
            self.compress_rate_csa,
            "must be >= 2",
        )?;
        ensure(
            self.compress_rate_hca >= 2,
            k.hca_rate,
            self.compress_rate_hca,
            "must be >= 2",
        )?;
        ensure(
            self.num_experts_per_tok <= self.n_routed_experts,
            k.topk,
            self.num_experts_per_tok,
            format!("cannot exceed {} = {}", k.experts, self.n_routed_experts),
        )?;
        ensure(
            self.index_topk >= 1,
            k.index_topk,
            self.index_topk,
            "must be >= 1",
        )?;
        ensure(self.hc_mult >= 1, k.hc_mult, self.hc_mult, "must be >= 1")?;
        ensure(
            self.hc_sinkhorn_iters >= 1,
            k.hc_iters,
            self.hc_sinkhorn_iters,
            "must be >= 1",
        )?;
        ensure(
            self.sliding_window >= 1,
            k.window,
            self.sliding_window,
            "must be >= 1",
        )?;
        let eps = self.rms_norm_eps;
        ensure(
            eps > 0.0 && eps.is_finite(),
            k.norm_eps,
            eps,
            "must be a finite number > 0 (as f32)",
        )?;
        let hc_eps = self.hc_eps;
        ensure(
            hc_eps >= 0.0 && hc_eps.is_finite(),
            k.hc_eps,
            hc_eps,
            "must be finite and >= 0",
        )?;
        let rs = self.routed_scaling_factor;
        ensure(
            rs > 0.0 && rs.is_finite(),
            k.route_scale,
            rs,
            "must be finite and > 0",
        )?;
        ensure(
            self.swiglu_limit > 0.0,
            k.swiglu,
            self.swiglu_limit,
            "must be > 0",
        )?;
        for (rope, theta_key, yarn_keys) in [
            (&self.rope_main, k.rope_theta, k.main_yarn),
            (&self.rope_compress, k.compress_theta, k.compress_yarn),
        ] {
            // ln(theta) divides the YaRN correction range and the frequencies degenerate at 1.
            ensure(
                rope.theta > 1.0 && rope.theta.is_finite(),
                theta_key,
                rope.theta,
                "must be finite and > 1",
            )?;
            if let Some(y) = &rope.yarn {
                let [factor, orig, fast, slow] = yarn_keys;
                ensure(
                    y.factor > 0.0 && y.factor.is_finite(),
                    factor,
                    y.factor,
                    "must be finite and > 0",
                )?;
                let o = y.original_max_position_embeddings;
                ensure(o > 0.0 && o.is_finite(), orig, o, "must be finite and > 0")?;
                ensure(
                    y.beta_fast > 0.0 && y.beta_fast.is_finite(),
                    fast,
                    y.beta_fast,
                    "must be finite and > 0",
                )?;
                ensure(
                    y.beta_slow > 0.0 && y.beta_slow.is_finite(),
                    slow,
                    y.beta_slow,
                    "must be finite and > 0",
                )?;
            }
        }
        Ok(())
    }
}

fn ensure(
    ok: bool,
    field: &str,
    value: impl Display,
    reason: impl Into<String>,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(invalid(field, value, reason))
    }
}

fn json_kind(v: &Value) -> String {
    match v {
        Value::Object(_) => "an object".into(),
        Value::Array(_) => "an array".into(),
        other => other.to_string(),
    }
}

// ------------------------------------------------------------------------------------------
// Field access with errors that carry the field's path in the file.

struct Fields<'a> {
    obj: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> Fields<'a> {
    fn root(obj: &'a Map<String, Value>) -> Self {
        Fields {
            obj,
            prefix: String::new(),
        }
    }

    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// `null` counts as absent, as it does for HF's optional fields.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn usize(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        self.get(key)
            .map(|v| to_usize(v, &self.name(key)))
            .transpose()
    }

    fn usize_or(&self, key: &str, default: usize) -> Result<usize, ConfigError> {
        Ok(self.usize(key)?.unwrap_or(default))
    }

    fn req_usize(&self, key: &str) -> Result<usize, ConfigError> {
        self.usize(key)?.ok_or_else(|| ConfigError::Missing {
            field: self.name(key),
        })
    }

    fn f64(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| invalid(self.name(key), json_kind(v), "must be a number"))
            })
            .transpose()
    }

    fn f64_or(&self, key: &str, default: f64) -> Result<f64, ConfigError> {
        Ok(self.f64(key)?.unwrap_or(default))
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| invalid(self.name(key), json_kind(v), "must be true or false")),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| invalid(self.name(key), json_kind(v), "must be a string"))
            })
            .transpose()
    }

    fn obj(&self, key: &str) -> Result<Option<Fields<'a>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(obj)) => Ok(Some(Fields {
                obj,
                prefix: format!("{}.", self.name(key)),
            })),
            Some(v) => Err(invalid(self.name(key), json_kind(v), "must be an object")),
        }
    }

    fn list(&self, key: &str) -> Result<Option<&'a Vec<Value>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(invalid(self.name(key), json_kind(v), "must be a list")),
        }
    }

    fn usize_list(&self, key: &str) -> Result<Option<Vec<usize>>, ConfigError> {
        let Some(list) = self.list(key)? else {
            return Ok(None);
        };
        let items = list.iter().enumerate();
        items
            .map(|(i, v)| to_usize(v, &format!("{}[{i}]", self.name(key))))
            .collect::<Result<_, _>>()
            .map(Some)
    }

    fn str_list(&self, key: &str) -> Result<Option<Vec<(String, &'a str)>>, ConfigError> {
        let Some(list) = self.list(key)? else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(list.len());
        for (i, v) in list.iter().enumerate() {
            let field = format!("{}[{i}]", self.name(key));
            let s = v
                .as_str()
                .ok_or_else(|| invalid(&field, json_kind(v), "must be a string"))?;
            out.push((field, s));
        }
        Ok(Some(out))
    }
}

/// Integers may arrive as `4` or `4.0` depending on which tool wrote the file.
fn to_usize(v: &Value, field: &str) -> Result<usize, ConfigError> {
    if let Some(u) = v.as_u64() {
        return usize::try_from(u).map_err(|_| invalid(field, u, "too large"));
    }
    match v.as_f64() {
        Some(x) if x >= 0.0 && x.fract() == 0.0 && x < 2f64.powi(53) => Ok(x as usize),
        _ => Err(invalid(
            field,
            json_kind(v),
            "must be a non-negative integer",
        )),
    }
}

fn to_token_id(v: &Value, field: &str) -> Result<u32, ConfigError> {
    let u = to_usize(v, field)?;
    u32::try_from(u).map_err(|_| invalid(field, u, "token id does not fit in u32"))
}

/// Source-file names of the fields `validate` checks, per flavour, so errors quote what the
/// user actually wrote.
struct Keys {
    vocab: &'static str,
    hidden: &'static str,
    layers: &'static str,
    heads: &'static str,
    head_dim: &'static str,
    rope_dim: &'static str,
    q_lora: &'static str,
    o_groups: &'static str,
    o_lora: &'static str,
    window: &'static str,
    layer_types: &'static str,
    mlp_types: &'static str,
    csa_rate: &'static str,
    hca_rate: &'static str,
    index_heads: &'static str,
    index_dim: &'static str,
    index_topk: &'static str,
    experts: &'static str,
    topk: &'static str,
    inter: &'static str,
    route_scale: &'static str,
    swiglu: &'static str,
    hc_mult: &'static str,
    hc_iters: &'static str,
    hc_eps: &'static str,
    norm_eps: &'static str,
    max_pos: &'static str,
    rope_theta: &'static str,
    compress_theta: &'static str,
    /// factor, original length, beta_fast, beta_slow.
    main_yarn: [&'static str; 4],
    compress_yarn: [&'static str; 4],
}

const HF_KEYS: Keys = Keys {
    vocab: "vocab_size",
    hidden: "hidden_size",
    layers: "num_hidden_layers",
    heads: "num_attention_heads",
    head_dim: "head_dim",
    rope_dim: "qk_rope_head_dim",
    q_lora: "q_lora_rank",
    o_groups: "o_groups",
    o_lora: "o_lora_rank",
    window: "sliding_window",
    layer_types: "layer_types",
    mlp_types: "mlp_layer_types",
    csa_rate: "compress_rates.compressed_sparse_attention",
    hca_rate: "compress_rates.heavily_compressed_attention",
    index_heads: "index_n_heads",
    index_dim: "index_head_dim",
    index_topk: "index_topk",
    experts: "n_routed_experts",
    topk: "num_experts_per_tok",
    inter: "moe_intermediate_size",
    route_scale: "routed_scaling_factor",
    swiglu: "swiglu_limit",
    hc_mult: "hc_mult",
    hc_iters: "hc_sinkhorn_iters",
    hc_eps: "hc_eps",
    norm_eps: "rms_norm_eps",
    max_pos: "max_position_embeddings",
    rope_theta: "rope_theta",
    compress_theta: "compress_rope_theta",
    main_yarn: [
        "rope_parameters.main.factor",
        "rope_parameters.main.original_max_position_embeddings",
        "rope_parameters.main.beta_fast",
        "rope_parameters.main.beta_slow",
    ],
    compress_yarn: [
        "rope_parameters.compress.factor",
        "rope_parameters.compress.original_max_position_embeddings",
        "rope_parameters.compress.beta_fast",
        "rope_parameters.compress.beta_slow",
    ],
};

const OFFICIAL_KEYS: Keys = Keys {
    vocab: "vocab_size",
    hidden: "dim",
    layers: "n_layers",
    heads: "n_heads",
    head_dim: "head_dim",
    rope_dim: "rope_head_dim",
    q_lora: "q_lora_rank",
    o_groups: "o_groups",
    o_lora: "o_lora_rank",
    window: "window_size",
    layer_types: "compress_ratios",
    mlp_types: "n_hash_layers",
    csa_rate: "compress_ratios",
    hca_rate: "compress_ratios",
    index_heads: "index_n_heads",
    index_dim: "index_head_dim",
    index_topk: "index_topk",
    experts: "n_routed_experts",
    topk: "n_activated_experts",
    inter: "moe_inter_dim",
    route_scale: "route_scale",
    swiglu: "swiglu_limit",
    hc_mult: "hc_mult",
    hc_iters: "hc_sinkhorn_iters",
    hc_eps: "hc_eps",
    norm_eps: "norm_eps",
    max_pos: "max_seq_len",
    rope_theta: "rope_theta",
    compress_theta: "compress_rope_theta",
    main_yarn: ["rope_factor", "original_seq_len", "beta_fast", "beta_slow"],
    compress_yarn: ["rope_factor", "original_seq_len", "beta_fast", "beta_slow"],
};

const CSA_NAME: &str = "compressed_sparse_attention";
const HCA_NAME: &str = "heavily_compressed_attention";

fn scoring(field: &str, s: &str) -> Result<ScoringFunc, ConfigError> {
    match s {
        "sqrtsoftplus" => Ok(ScoringFunc::SqrtSoftplus),
        "softmax" => Ok(ScoringFunc::Softmax),
        "sigmoid" => Ok(ScoringFunc::Sigmoid),
        other => Err(invalid(
            field,
            format!("{other:?}"),
            "expected sqrtsoftplus, softmax or sigmoid",
        )),
    }
}

/// `bos_token_id` absent means the flavour default; explicit `null` means none.
fn token_ids(
    f: &Fields,
    default_bos: Option<u32>,
    default_eos: &[u32],
) -> Result<(Option<u32>, Vec<u32>), ConfigError> {
    let bos = match f.obj.get("bos_token_id") {
        None => default_bos,
        Some(Value::Null) => None,
        Some(v) => Some(to_token_id(v, "bos_token_id")?),
    };
    let eos = match f.obj.get("eos_token_id") {
        None => default_eos.to_vec(),
        Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, v)| to_token_id(v, &format!("eos_token_id[{i}]")))
            .collect::<Result<_, _>>()?,
        Some(v) => vec![to_token_id(v, "eos_token_id")?],
    };
    Ok((bos, eos))
}

/// `int(head_dim * partial_rotary_factor)`, as HF sizes the rotary slice.
fn rope_dim_from_factor(head_dim: usize, factor: f64, field: &str) -> Result<usize, ConfigError> {
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(invalid(field, factor, "must be in (0, 1]"));
    }
    Ok((head_dim as f64 * factor) as usize)
}

/// One nested HF rope entry (`rope_parameters.main` / `.compress`). `default_theta` is the
/// top-level `rope_theta` for both entries: that is what HF fills in when a nested entry lacks
/// its own, even for `compress`.
fn hf_rope_entry(
    e: &Fields,
    default_theta: f64,
    max_pos: usize,
) -> Result<RopeParams, ConfigError> {
    let theta = e.f64_or("rope_theta", default_theta)?;
    let kind_key = if e.has("rope_type") {
        "rope_type"
    } else {
        "type"
    };
    let yarn = match e.str(kind_key)?.unwrap_or("default") {
        "default" => None,
        "yarn" => Some(hf_yarn(e, max_pos)?),
        other => {
            return Err(invalid(
                e.name(kind_key),
                format!("{other:?}"),
                "DeepSeek-V4 uses only \"default\" or \"yarn\" RoPE",
            ))
        }
    };
    Ok(RopeParams { theta, yarn })
}

/// YaRN fields with HF's fallbacks: original length defaults to `max_position_embeddings`,
/// factor to their ratio, and a missing or zero beta to 32 / 1.
fn hf_yarn(e: &Fields, max_pos: usize) -> Result<Yarn, ConfigError> {
    let original = e.f64_or("original_max_position_embeddings", max_pos as f64)?;
    let factor = match e.f64("factor")? {
        Some(f) => f,
        None => max_pos as f64 / original,
    };
    let beta = |key: &str, default: f64| -> Result<f64, ConfigError> {
        Ok(e.f64(key)?.filter(|&b| b != 0.0).unwrap_or(default))
    };
    if let Some(af) = e.f64("attention_factor")? {
        if af != 1.0 {
            tracing::warn!(
                field = %e.name("attention_factor"),
                value = af,
                "ignored: the DeepSeek-V4 reference never scales cos/sin by a YaRN attention factor"
            );
        }
    }
    Ok(Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast: beta("beta_fast", 32.0)?,
        beta_slow: beta("beta_slow", 1.0)?,
    })
}

fn parse_hf(f: &Fields) -> Result<ModelConfig, ConfigError> {
    if let Some(mt) = f.str("model_type")? {
        if mt != "deepseek_v4" {
            return Err(invalid(
                "model_type",
                format!("{mt:?}"),
                "only deepseek_v4 is supported (V4.1 is a different architecture)",
            ));
        }
    }
    let n = f.usize_or("num_hidden_layers", 43)?;
    let head_dim = f.usize_or("head_dim", 512)?;
    let max_pos = f.usize_or("max_position_embeddings", 1_048_576)?;

    // Compression rates: an explicit dict replaces HF's default wholesale, then the legacy
    // scalars override single entries.
    let rates_dict = f.obj("compress_rates")?;
    let (mut csa_rate, mut hca_rate) = (None, None);
    if let Some(d) = &rates_dict {
        for (key, v) in d.obj {
            let field = d.name(key);
            match key.as_str() {
                CSA_NAME => csa_rate = Some(to_usize(v, &field)?),
                HCA_NAME => hca_rate = Some(to_usize(v, &field)?),
                _ => {
                    return Err(invalid(
                        "compress_rates",
                        format!("{key:?}"),
                        format!("unknown layer type; expected {CSA_NAME} or {HCA_NAME}"),
                    ))
                }
            }
        }
    }
    if let Some(r) = f.usize("compress_rate_csa")? {
        csa_rate = Some(r);
    }
    if let Some(r) = f.usize("compress_rate_hca")? {
        hca_rate = Some(r);
    }

    // Layer kinds: explicit `layer_types` > legacy per-layer `compress_ratios` (which may carry
    // trailing MTP entries) > HF's default (the V4-Pro schedule). Lists are cut to the layer
    // count as HF does; a short list fails validation.
    let layer_types = if let Some(list) = f.str_list("layer_types")? {
        let mut kinds = Vec::with_capacity(n);
        for (field, s) in list.into_iter().take(n) {
            kinds.push(match s {
                "sliding_attention" => AttnKind::Sliding,
                CSA_NAME => AttnKind::Csa,
                HCA_NAME => AttnKind::Hca,
                other => {
                    return Err(invalid(
                        field,
                        format!("{other:?}"),
                        format!("expected sliding_attention, {CSA_NAME} or {HCA_NAME}"),
                    ))
                }
            });
        }
        kinds
    } else if let Some(ratios) = f.usize_list("compress_ratios")? {
        legacy_ratios_to_kinds(&ratios, n, &mut csa_rate, &mut hca_rate)?
    } else {
        (0..n)
            .map(|i| match i {
                0 | 1 => AttnKind::Hca,
                _ if i % 2 == 1 => AttnKind::Hca,
                _ => AttnKind::Csa,
            })
            .collect()
    };
    // A dict that leaves out the rate of a kind the model uses would crash HF; refuse it.
    for (kind, rate, name) in [
        (AttnKind::Csa, csa_rate, CSA_NAME),
        (AttnKind::Hca, hca_rate, HCA_NAME),
    ] {
        if rates_dict.is_some() && rate.is_none() && layer_types.contains(&kind) {
            return Err(ConfigError::Missing {
                field: format!("compress_rates.{name}"),
            });
        }
    }

    let mlp_layer_types = if let Some(list) = f.str_list("mlp_layer_types")? {
        let mut kinds = Vec::with_capacity(n);
        for (field, s) in list.into_iter().take(n) {
            kinds.push(match s {
                "hash_moe" => MlpKind::Hash,
                "moe" => MlpKind::Scored,
                other => {
                    return Err(invalid(
                        field,
                        format!("{other:?}"),
                        "expected hash_moe or moe",
                    ))
                }
            });
        }
        kinds
    } else {
        let n_hash = f.usize_or("num_hash_layers", 3)?;
        (0..n)
            .map(|i| {
                if i < n_hash {
                    MlpKind::Hash
                } else {
                    MlpKind::Scored
                }
            })
            .collect()
    };

    // RoPE tables. `rope_scaling` (legacy) wins over `rope_parameters`, as in HF. Only a dict
    // with both `main` and `compress` entries is "nested"; anything else is a flat YaRN spec
    // for the compress table, whose theta is always `compress_rope_theta`.
    let rope_theta = f.f64_or("rope_theta", 10000.0)?;
    let compress_theta = f.f64_or("compress_rope_theta", 160000.0)?;
    let rp = match f.obj("rope_scaling")? {
        Some(rs) if !rs.obj.is_empty() => Some(rs),
        _ => f.obj("rope_parameters")?,
    };
    let nested = match &rp {
        Some(rp) => match (rp.obj("main")?, rp.obj("compress")?) {
            (Some(m), Some(c)) => Some((m, c)),
            _ => None,
        },
        None => None,
    };
    let (rope_main, rope_compress) = match (&nested, &rp) {
        (Some((m, c)), _) => (
            hf_rope_entry(m, rope_theta, max_pos)?,
            hf_rope_entry(c, rope_theta, max_pos)?,
        ),
        (None, flat) => {
            let main = RopeParams {
                theta: rope_theta,
                yarn: None,
            };
            let yarn = match flat {
                Some(flat) => hf_rope_entry(flat, compress_theta, max_pos)?.yarn,
                None => None,
            };
            let compress = RopeParams {
                theta: compress_theta,
                yarn,
            };
            (main, compress)
        }
    };

    // Rotary width: HF derives it from `partial_rotary_factor` (default 64/512), folding in a
    // legacy `qk_rope_head_dim`. When both are present they must agree; nested rope entries
    // size the actual tables, so they must agree as well.
    let prf = f.f64("partial_rotary_factor")?;
    let legacy_rd = f.usize("qk_rope_head_dim")?;
    let nested_main_prf = match &nested {
        Some((m, _)) => m.f64("partial_rotary_factor")?,
        None => None,
    };
    let qk_rope_head_dim = match (prf, legacy_rd) {
        (Some(p), Some(r)) => {
            let d = rope_dim_from_factor(head_dim, p, "partial_rotary_factor")?;
            if d != r {
                return Err(invalid(
                    "qk_rope_head_dim",
                    r,
                    format!("disagrees with partial_rotary_factor {p} × head_dim {head_dim} = {d}"),
                ));
            }
            r
        }
        (Some(p), None) => rope_dim_from_factor(head_dim, p, "partial_rotary_factor")?,
        (None, Some(r)) => r,
        (None, None) => match nested_main_prf {
            Some(p) => {
                rope_dim_from_factor(head_dim, p, "rope_parameters.main.partial_rotary_factor")?
            }
            None => rope_dim_from_factor(head_dim, 64.0 / 512.0, "partial_rotary_factor")?,
        },
    };
    if let Some((m, c)) = &nested {
        for e in [m, c] {
            if let Some(p) = e.f64("partial_rotary_factor")? {
                let field = e.name("partial_rotary_factor");
                let d = rope_dim_from_factor(head_dim, p, &field)?;
                if d != qk_rope_head_dim {
                    return Err(invalid(
                        field,
                        p,
                        format!("gives a rotary width of {d}, but qk_rope_head_dim is {qk_rope_head_dim}"),
                    ));
                }
            }
        }
    }

    let scoring_func = scoring(
        "scoring_func",
        f.str("scoring_func")?.unwrap_or("sqrtsoftplus"),
    )?;
    let (bos_token_id, eos_token_ids) = token_ids(f, Some(0), &[1])?;
    Ok(ModelConfig {
        vocab_size: f.usize_or("vocab_size", 129280)?,
        hidden_size: f.req_usize("hidden_size")?,
        num_hidden_layers: n,
        num_attention_heads: f.usize_or("num_attention_heads", 64)?,
        head_dim,
        qk_rope_head_dim,
        q_lora_rank: f.usize_or("q_lora_rank", 1024)?,
        o_groups: f.usize_or("o_groups", 8)?,
        o_lora_rank: f.usize_or("o_lora_rank", 1024)?,
        sliding_window: f.usize_or("sliding_window", 128)?,
        layer_types,
        compress_rate_csa: csa_rate.unwrap_or(4),
        compress_rate_hca: hca_rate.unwrap_or(128),
        mlp_layer_types,
        index_n_heads: f.usize_or("index_n_heads", 64)?,
        index_head_dim: f.usize_or("index_head_dim", 128)?,
        index_topk: f.usize_or("index_topk", 512)?,
        n_routed_experts: f.usize_or("n_routed_experts", 256)?,
        num_experts_per_tok: f.usize_or("num_experts_per_tok", 6)?,
        n_shared_experts: f.usize_or("n_shared_experts", 1)?,
        moe_intermediate_size: f.usize_or("moe_intermediate_size", 2048)?,
        scoring_func,
        norm_topk_prob: f.bool_or("norm_topk_prob", true)?,
        routed_scaling_factor: f.f64_or("routed_scaling_factor", 1.5)? as f32,
        swiglu_limit: f.f64_or("swiglu_limit", 10.0)? as f32,
        hc_mult: f.usize_or("hc_mult", 4)?,
        hc_sinkhorn_iters: f.usize_or("hc_sinkhorn_iters", 20)?,
        hc_eps: f.f64_or("hc_eps", 1e-6)? as f32,
        rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)? as f32,
        rope_main,
        rope_compress,
        max_position_embeddings: max_pos,
        num_nextn_predict_layers: f.usize_or("num_nextn_predict_layers", 1)?,
        bos_token_id,
        eos_token_ids,
    })
}

/// Legacy per-layer ratios in an HF config. HF itself maps only 0/4/128 and crashes on
/// anything else; here 4 is CSA and any other non-zero ratio is HCA at that rate (the official
/// reading), provided it agrees with any rate the config states explicitly.
fn legacy_ratios_to_kinds(
    ratios: &[usize],
    n: usize,
    csa_rate: &mut Option<usize>,
    hca_rate: &mut Option<usize>,
) -> Result<Vec<AttnKind>, ConfigError> {
    let mut kinds = Vec::with_capacity(n);
    for (i, &r) in ratios.iter().enumerate().take(n) {
        let field = format!("compress_ratios[{i}]");
        kinds.push(match r {
            0 => AttnKind::Sliding,
            4 => {
                if let Some(c) = *csa_rate {
                    if c != 4 {
                        return Err(invalid(
                            field,
                            r,
                            format!("ratio 4 means CSA, but the CSA rate is set to {c}"),
                        ));
                    }
                }
                *csa_rate = Some(4);
                AttnKind::Csa
            }
            m => {
                match *hca_rate {
                    Some(h) if h != m => {
                        return Err(invalid(
                            field,
                            m,
                            format!("a model has one HCA rate, and it is already {h}"),
                        ))
                    }
                    _ => *hca_rate = Some(m),
                }
                AttnKind::Hca
            }
        });
    }
    Ok(kinds)
}

/// DeepSeek's `inference/config.json`. Absent keys take `ModelArgs` defaults, except those
/// whose defaults describe the 7-layer debug model rather than any shipped one: without them a
/// config would load as a silently different architecture, so they are required.
fn parse_official(f: &Fields) -> Result<ModelConfig, ConfigError> {
    let n = f.req_usize("n_layers")?;
    let hidden_size = f.req_usize("dim")?;
    let num_attention_heads = f.req_usize("n_heads")?;
    let moe_intermediate_size = f.req_usize("moe_inter_dim")?;
    let n_routed_experts = f.req_usize("n_routed_experts")?;
    let num_experts_per_tok = f.req_usize("n_activated_experts")?;
    let ratios = f
        .usize_list("compress_ratios")?
        .ok_or_else(|| ConfigError::Missing {
            field: "compress_ratios".into(),
        })?;
    if ratios.len() < n {
        return Err(invalid(
            "compress_ratios",
            format!("{} entries", ratios.len()),
            format!("needs one ratio per layer (n_layers = {n}), MTP entries may follow"),
        ));
    }
    // Ratio 4 selects the overlapping compressor + indexer in the reference; every other
    // non-zero ratio is plain heavy compression, and the model has a single such rate.
    let mut hca: Option<(usize, usize)> = None;
    let mut layer_types = Vec::with_capacity(n);
    for (i, &r) in ratios.iter().enumerate().take(n) {
        layer_types.push(match r {
            0 => AttnKind::Sliding,
            4 => AttnKind::Csa,
            m => {
                if let Some((first_layer, first)) = hca {
                    if first != m {
                        return Err(invalid(
                            format!("compress_ratios[{i}]"),
                            m,
                            format!("differs from the HCA ratio {first} of layer {first_layer}; one HCA rate per model"),
                        ));
                    }
                }
                hca.get_or_insert((i, m));
                AttnKind::Hca
            }
        });
    }
    let n_hash = f.usize_or("n_hash_layers", 0)?;
    let mlp_layer_types = (0..n)
        .map(|i| {
            if i < n_hash {
                MlpKind::Hash
            } else {
                MlpKind::Scored
            }
        })
        .collect();

    let score = scoring("score_func", f.str("score_func")?.unwrap_or("sqrtsoftplus"))?;
    let swiglu = f.f64_or("swiglu_limit", 0.0)?;
    let original_seq_len = f.usize_or("original_seq_len", 0)?;
    let rope_factor = f.f64_or("rope_factor", 40.0)?;
    let yarn = (original_seq_len > 0)
        .then(|| -> Result<Yarn, ConfigError> {
            Ok(Yarn {
                factor: rope_factor,
                original_max_position_embeddings: original_seq_len as f64,
                beta_fast: f.f64_or("beta_fast", 32.0)?,
                beta_slow: f.f64_or("beta_slow", 1.0)?,
            })
        })
        .transpose()?;
    // `max_seq_len` is the length the reference precomputes tables for; failing that, YaRN's
    // extended length is what HF configs state as `max_position_embeddings`.
    let max_position_embeddings =
        match (f.usize("max_position_embeddings")?, f.usize("max_seq_len")?) {
            (Some(m), _) | (None, Some(m)) => m,
            (None, None) if original_seq_len > 0 => {
                (original_seq_len as f64 * rope_factor).round() as usize
            }
            (None, None) => 4096,
        };
    let (bos_token_id, eos_token_ids) = token_ids(f, None, &[])?;
    Ok(ModelConfig {
        vocab_size: f.usize_or("vocab_size", 129280)?,
        hidden_size,
        num_hidden_layers: n,
        num_attention_heads,
        head_dim: f.usize_or("head_dim", 512)?,
        qk_rope_head_dim: f.usize_or("rope_head_dim", 64)?,
        q_lora_rank: f.usize_or("q_lora_rank", 1024)?,
        o_groups: f.usize_or("o_groups", 8)?,
        o_lora_rank: f.usize_or("o_lora_rank", 1024)?,
        sliding_window: f.usize_or("window_size", 128)?,
        layer_types,
        compress_rate_csa: 4,
        compress_rate_hca: hca.map_or(128, |(_, m)| m),
        mlp_layer_types,
        index_n_heads: f.usize_or("index_n_heads", 64)?,
        index_head_dim: f.usize_or("index_head_dim", 128)?,
        index_topk: f.usize_or("index_topk", 512)?,
        n_routed_experts,
        num_experts_per_tok,
        n_shared_experts: f.usize_or("n_shared_experts", 1)?,
        moe_intermediate_size,
        scoring_func: score,
        norm_topk_prob: score != ScoringFunc::Softmax,
        routed_scaling_factor: f.f64_or("route_scale", 1.0)? as f32,
        swiglu_limit: if swiglu > 0.0 {
            swiglu as f32
        } else {
            f32::INFINITY
        },
        hc_mult: f.usize_or("hc_mult", 4)?,
        hc_sinkhorn_iters: f.usize_or("hc_sinkhorn_iters", 20)?,
        hc_eps: f.f64_or("hc_eps", 1e-6)? as f32,
        rms_norm_eps: f.f64_or("norm_eps", 1e-6)? as f32,
        rope_main: RopeParams {
            theta: f.f64_or("rope_theta", 10000.0)?,
            yarn: None,
        },
        rope_compress: RopeParams {
            theta: f.f64_or("compress_rope_theta", 40000.0)?,
            yarn,
        },
        max_position_embeddings,
        num_nextn_predict_layers: f.usize_or("n_mtp_layers", 1)?,
        bos_token_id,
        eos_token_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttnKind::{Csa, Hca, Sliding};
    use MlpKind::{Hash, Scored};

    /// Spec §10.2's tiny config as HF's `save_pretrained` writes it (nested rope parameters,
    /// explicit layer schedules, plenty of keys that do not matter here).
    const TINY_HF: &str = r#"{
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": 512, "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 128, "q_lora_rank": 128, "o_groups": 2,
        "o_lora_rank": 128, "sliding_window": 8,
        "layer_types": ["sliding_attention", "compressed_sparse_attention",
                        "heavily_compressed_attention", "compressed_sparse_attention"],
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe"],
        "index_n_heads": 16, "index_head_dim": 128, "index_topk": 3,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "moe_intermediate_size": 128, "scoring_func": "sqrtsoftplus", "norm_topk_prob": true,
        "routed_scaling_factor": 1.5, "swiglu_limit": 1.0, "hc_mult": 4, "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-06, "rms_norm_eps": 1e-06, "partial_rotary_factor": 0.5,
        "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
        "rope_parameters": {
            "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16.0,
                         "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1,
                         "attention_factor": 1.0, "partial_rotary_factor": 0.5}},
        "max_position_embeddings": 4096, "num_nextn_predict_layers": 1,
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": null,
        "torch_dtype": "bfloat16", "id2label": {"0": "LABEL_0"}, "transformers_version": "5.23.0"
    }"#;

    fn flash_yarn() -> Yarn {
        Yarn {
            factor: 16.0,
            original_max_position_embeddings: 65536.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }
    }

    fn parse(s: &str) -> ModelConfig {
        ModelConfig::from_json_str(s).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Replaces (or, with `None`, removes) top-level keys of a JSON config.
    fn edit(base: &str, changes: &[(&str, Option<Value>)]) -> String {
        let mut v: Value = serde_json::from_str(base).unwrap();
        let obj = v.as_object_mut().unwrap();
        for (k, val) in changes {
            match val {
                Some(val) => obj.insert(k.to_string(), val.clone()),
                None => obj.remove(*k),
            };
        }
        v.to_string()
    }

    fn err(s: &str) -> String {
        ModelConfig::from_json_str(s)
            .expect_err("config should be rejected")
            .to_string()
    }

    fn assert_err(s: &str, parts: &[&str]) {
        let msg = err(s);
        for p in parts {
            assert!(msg.contains(p), "error {msg:?} should contain {p:?}");
        }
    }

    #[test]
    fn tiny_hf_config() {
        let c = parse(TINY_HF);
        assert_eq!(
            (c.vocab_size, c.hidden_size, c.num_hidden_layers),
            (512, 256, 4)
        );
        assert_eq!(
            (c.num_attention_heads, c.head_dim, c.qk_rope_head_dim),
            (4, 128, 64)
        );
        assert_eq!(
            (c.q_lora_rank, c.o_groups, c.o_lora_rank, c.sliding_window),
            (128, 2, 128, 8)
        );
        assert_eq!(c.layer_types, [Sliding, Csa, Hca, Csa]);
        assert_eq!((c.compress_rate_csa, c.compress_rate_hca), (4, 8));
        assert_eq!(
            (0..4).map(|l| c.compress_ratio(l)).collect::<Vec<_>>(),
            [0, 4, 8, 4]
        );
        assert_eq!(c.mlp_layer_types, [Hash, Hash, Scored, Scored]);
        assert_eq!(
            (c.index_n_heads, c.index_head_dim, c.index_topk),
            (16, 128, 3)
        );
        assert_eq!(
            (
                c.n_routed_experts,
                c.num_experts_per_tok,
                c.n_shared_experts
            ),
            (8, 2, 1)
        );
        assert_eq!(c.moe_intermediate_size, 128);
        assert_eq!(c.scoring_func, ScoringFunc::SqrtSoftplus);
        assert!(c.norm_topk_prob);
        assert_eq!((c.routed_scaling_factor, c.swiglu_limit), (1.5, 1.0));
        assert_eq!(
            (c.hc_mult, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps),
            (4, 20, 1e-6, 1e-6)
        );
        assert_eq!(
            c.rope_main,
            RopeParams {
                theta: 10000.0,
                yarn: None
            }
        );
        assert_eq!(
            c.rope_compress,
            RopeParams {
                theta: 160000.0,
                yarn: Some(flash_yarn())
            }
        );
        assert_eq!(
            (c.max_position_embeddings, c.num_nextn_predict_layers),
            (4096, 1)
        );
        assert_eq!(
            (c.bos_token_id, c.eos_token_ids.clone()),
            (Some(0), vec![1])
        );
    }

    /// The same model described only with the legacy keys HF folds in.
    const TINY_LEGACY: &str = r#"{
        "model_type": "deepseek_v4", "vocab_size": 512, "hidden_size": 256,
        "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 128, "q_lora_rank": 128,
        "o_groups": 2, "o_lora_rank": 128, "sliding_window": 8,
        "compress_ratios": [0, 4, 8, 4, 0], "num_hash_layers": 2, "qk_rope_head_dim": 64,
        "index_n_heads": 16, "index_head_dim": 128, "index_topk": 3,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
        "swiglu_limit": 1.0, "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        "max_position_embeddings": 4096, "eos_token_id": [1, 2], "bos_token_id": null,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
        "expert_dtype": "fp4"
    }"#;

    #[test]
    fn hf_legacy_keys_fold_like_hf() {
        let c = parse(TINY_LEGACY);
        let t = parse(TINY_HF);
        assert_eq!(c.layer_types, t.layer_types, "trailing MTP ratio dropped");
        assert_eq!((c.compress_rate_csa, c.compress_rate_hca), (4, 8));
        assert_eq!(c.mlp_layer_types, t.mlp_layer_types);
        assert_eq!(c.qk_rope_head_dim, 64);
        assert_eq!(c.rope_main, t.rope_main);
        assert_eq!(
            c.rope_compress, t.rope_compress,
            "YaRN only on the compress table"
        );
        assert_eq!((c.bos_token_id, c.eos_token_ids), (None, vec![1, 2]));
    }

    /// V4-Flash as shipped (spec §1.1): HF keys, legacy schedule fields.
    fn flash_hf() -> String {
        let mut ratios = vec![0, 0];
        for _ in 0..20 {
            ratios.extend([4, 128]);
        }
        ratios.extend([4, 0]);
        assert_eq!(ratios.len(), 44);
        let base = serde_json::json!({
            "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
            "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
            "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
            "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
            "sliding_window": 128, "compress_ratios": ratios, "compress_rope_theta": 160000,
            "rope_theta": 10000,
            "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                             "beta_fast": 32, "beta_slow": 1},
            "max_position_embeddings": 1048576, "index_n_heads": 64, "index_head_dim": 128,
            "index_topk": 512, "n_routed_experts": 256, "num_experts_per_tok": 6
        });
        let rest = serde_json::json!({
            "n_shared_experts": 1, "moe_intermediate_size": 2048, "scoring_func": "sqrtsoftplus",
            "topk_method": "noaux_tc", "norm_topk_prob": true, "routed_scaling_factor": 1.5,
            "num_hash_layers": 3, "swiglu_limit": 10.0, "hc_mult": 4, "hc_sinkhorn_iters": 20,
            "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "num_nextn_predict_layers": 1,
            "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false,
            "expert_dtype": "fp4",
            "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                    "quant_method": "fp8", "scale_fmt": "ue8m0",
                                    "weight_block_size": [128, 128]}
        });
        let changes: Vec<(&str, Option<Value>)> = rest
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), Some(v.clone())))
            .collect();
        edit(&base.to_string(), &changes)
    }

    #[test]
    fn v4_flash_hf_config() {
        let c = parse(&flash_hf());
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.num_attention_heads),
            (4096, 43, 64)
        );
        assert_eq!(c.layer_types.len(), 43);
        assert_eq!(&c.layer_types[..2], [Sliding, Sliding]);
        for l in 2..43 {
            let want = if l % 2 == 0 { Csa } else { Hca };
            assert_eq!(c.layer_types[l], want, "layer {l}");
        }
        assert_eq!(c.layer_types.iter().filter(|k| **k == Csa).count(), 21);
        assert_eq!(c.layer_types.iter().filter(|k| **k == Hca).count(), 20);
        assert_eq!(
            (
                c.compress_ratio(2),
                c.compress_ratio(3),
                c.compress_ratio(0)
            ),
            (4, 128, 0)
        );
        assert_eq!(c.mlp_layer_types.iter().filter(|k| **k == Hash).count(), 3);
        assert_eq!(&c.mlp_layer_types[..4], [Hash, Hash, Hash, Scored]);
        assert_eq!((c.qk_rope_head_dim, c.head_dim), (64, 512));
        assert_eq!(
            c.rope_main,
            RopeParams {
                theta: 10000.0,
                yarn: None
            }
        );
        assert_eq!(
            c.rope_compress,
            RopeParams {
                theta: 160000.0,
                yarn: Some(flash_yarn())
            }
        );
        assert_eq!(
            (
                c.n_routed_experts,
                c.num_experts_per_tok,
                c.moe_intermediate_size
            ),
            (256, 6, 2048)
        );
        assert_eq!(
            (c.index_topk, c.routed_scaling_factor, c.swiglu_limit),
            (512, 1.5, 10.0)
        );
        assert_eq!(c.max_position_embeddings, 1 << 20);
    }

    /// V4-Flash's own `inference/config.json` (as transcribed in spec sources).
    const FLASH_OFFICIAL: &str = r#"{"vocab_size":129280,"dim":4096,"moe_inter_dim":2048,"n_layers":43,
        "n_hash_layers":3,"n_heads":64,"n_routed_experts":256,"n_shared_experts":1,
        "n_activated_experts":6,"score_func":"sqrtsoftplus","route_scale":1.5,"swiglu_limit":10.0,
        "q_lora_rank":1024,"head_dim":512,"rope_head_dim":64,"o_groups":8,"o_lora_rank":1024,
        "window_size":128,"original_seq_len":65536,"rope_theta":10000,"rope_factor":16,
        "beta_fast":32,"beta_slow":1,"index_n_heads":64,"index_head_dim":128,"index_topk":512,
        "hc_mult":4,"hc_sinkhorn_iters":20,"dtype":"fp8","scale_fmt":"ue8m0","expert_dtype":"fp4",
        "compress_rope_theta":160000,"compress_ratios":[0,0,4,128,4,128,4,128,4,128,4,128,4,128,
        4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,0]}"#;

    /// Every architectural field, for comparing the two flavours of one model.
    fn arch(c: &ModelConfig) -> String {
        let mut c = c.clone();
        c.bos_token_id = None;
        c.eos_token_ids.clear();
        format!("{c:?}")
    }

    #[test]
    fn v4_flash_official_names_match_hf() {
        let off = parse(FLASH_OFFICIAL);
        let hf = parse(&flash_hf());
        assert_eq!(arch(&off), arch(&hf));
        assert_eq!((off.bos_token_id, off.eos_token_ids.len()), (None, 0));
        assert_eq!(
            off.max_position_embeddings,
            1 << 20,
            "65536 × 16 when max_seq_len is absent"
        );
    }

    #[test]
    fn official_flavour_details() {
        // Pro-style schedule with another HCA ratio, softmax routing, no YaRN, no clamp.
        let s = r#"{"dim": 256, "n_layers": 4, "n_heads": 4, "moe_inter_dim": 128,
            "n_routed_experts": 8, "n_activated_experts": 2, "compress_ratios": [16, 16, 4, 0, 0],
            "score_func": "softmax", "head_dim": 128, "rope_head_dim": 32, "index_head_dim": 64,
            "o_groups": 2, "max_seq_len": 2048, "eos_token_id": 7}"#;
        let c = parse(s);
        assert_eq!(c.layer_types, [Hca, Hca, Csa, Sliding]);
        assert_eq!((c.compress_rate_csa, c.compress_rate_hca), (4, 16));
        assert_eq!(
            c.mlp_layer_types, [Scored; 4],
            "ModelArgs default: no hash layers"
        );
        assert_eq!(c.scoring_func, ScoringFunc::Softmax);
        assert!(
            !c.norm_topk_prob,
            "the reference renormalises only non-softmax scores"
        );
        assert_eq!(
            c.swiglu_limit,
            f32::INFINITY,
            "swiglu_limit 0 disables the clamp"
        );
        assert_eq!(c.routed_scaling_factor, 1.0);
        assert_eq!(
            c.rope_compress,
            RopeParams {
                theta: 40000.0,
                yarn: None
            }
        );
        assert_eq!(c.max_position_embeddings, 2048);
        assert_eq!(c.num_nextn_predict_layers, 1);
        assert_eq!((c.bos_token_id, c.eos_token_ids), (None, vec![7]));
    }

    #[test]
    fn hf_defaults_follow_hf_config_class() {
        let c = parse(r#"{"hidden_size": 4096}"#);
        assert_eq!(c.num_hidden_layers, 43);
        assert_eq!(
            &c.layer_types[..5],
            [Hca, Hca, Csa, Hca, Csa],
            "V4-Pro default schedule"
        );
        assert_eq!(c.layer_types[42], Csa);
        assert_eq!(&c.mlp_layer_types[..4], [Hash, Hash, Hash, Scored]);
        assert_eq!(
            (c.head_dim, c.qk_rope_head_dim, c.sliding_window),
            (512, 64, 128)
        );
        assert_eq!((c.compress_rate_csa, c.compress_rate_hca), (4, 128));
        assert_eq!(
            c.rope_compress,
            RopeParams {
                theta: 160000.0,
                yarn: None
            }
        );
        assert_eq!(
            (c.bos_token_id, c.eos_token_ids.clone()),
            (Some(0), vec![1])
        );
        assert_eq!((c.swiglu_limit, c.routed_scaling_factor), (10.0, 1.5));
    }

    #[test]
    fn hf_rope_variants() {
        // Flat `rope_parameters` (no main/compress) is the compress YaRN spec; missing
        // original length and factor fall back as in HF, zero betas mean the defaults.
        let s = edit(
            TINY_HF,
            &[(
                "rope_parameters",
                Some(
                    serde_json::json!({"rope_type": "yarn", "beta_fast": 0, "attention_factor": 1.3}),
                ),
            )],
        );
        let c = parse(&s);
        assert_eq!(
            c.rope_main,
            RopeParams {
                theta: 10000.0,
                yarn: None
            }
        );
        let y = Yarn {
            factor: 1.0,
            original_max_position_embeddings: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        assert_eq!(
            c.rope_compress,
            RopeParams {
                theta: 160000.0,
                yarn: Some(y)
            }
        );
        // `rope_scaling` wins over `rope_parameters`.
        let s = edit(
            &s,
            &[(
                "rope_scaling",
                Some(serde_json::json!({"type": "yarn", "factor": 4})),
            )],
        );
        assert_eq!(parse(&s).rope_compress.yarn.unwrap().factor, 4.0);
        // Nested entries without a theta take the top-level `rope_theta`, as HF fills them.
        let s = edit(
            TINY_HF,
            &[(
                "rope_parameters",
                Some(
                    serde_json::json!({"main": {"rope_type": "default"}, "compress": {"rope_type": "default"}}),
                ),
            )],
        );
        let c = parse(&s);
        assert_eq!(
            (c.rope_main.theta, c.rope_compress.theta),
            (10000.0, 10000.0)
        );
        assert_eq!(c.rope_compress.yarn, None);
        // Nothing at all: default rope for both tables.
        let s = edit(TINY_HF, &[("rope_parameters", None)]);
        assert_eq!(
            parse(&s).rope_compress,
            RopeParams {
                theta: 160000.0,
                yarn: None
            }
        );
    }

    #[test]
    fn rope_width_sources() {
        // Legacy qk_rope_head_dim alone, nested factor alone, and agreement of both.
        let no_prf = edit(TINY_HF, &[("partial_rotary_factor", None)]);
        assert_eq!(
            parse(&no_prf).qk_rope_head_dim,
            64,
            "from rope_parameters.main"
        );
        let s = edit(TINY_LEGACY, &[("qk_rope_head_dim", Some(32.into()))]);
        assert_eq!(parse(&s).qk_rope_head_dim, 32);
        let s = edit(
            TINY_LEGACY,
            &[
                ("partial_rotary_factor", Some(0.25.into())),
                ("qk_rope_head_dim", None),
            ],
        );
        assert_eq!(
            parse(&s).qk_rope_head_dim,
            32,
            "factor alone: int(128 × 0.25)"
        );
    }

    #[test]
    fn from_file_reads_and_reports_path() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, TINY_HF).unwrap();
        assert_eq!(ModelConfig::from_file(&p).unwrap().hidden_size, 256);
        let missing = dir.path().join("absent.json");
        let e = ModelConfig::from_file(&missing).unwrap_err().to_string();
        assert!(e.contains("absent.json"), "{e}");
    }

    #[test]
    fn golden_fixture_configs_agree_across_flavours() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden");
        for name in ["tiny-a", "tiny-b"] {
            let (hf, off) = (
                root.join(name).join("hf/config.json"),
                root.join(name).join("official/config.json"),
            );
            if !hf.is_file() || !off.is_file() {
                continue;
            }
            let hf = ModelConfig::from_file(&hf).unwrap();
            let off = ModelConfig::from_file(&off).unwrap();
            let mut off_tokens = off.clone();
            off_tokens.bos_token_id = hf.bos_token_id;
            off_tokens.eos_token_ids = hf.eos_token_ids.clone();
            assert_eq!(format!("{off_tokens:?}"), format!("{hf:?}"), "{name}");
        }
    }

    // ------------------------------------------------------------- one test per rule

    fn with(key: &str, v: Value) -> String {
        edit(TINY_HF, &[(key, Some(v))])
    }

    #[test]
    fn rejects_bad_json_and_unknown_flavour() {
        assert_err("{", &["not valid JSON"]);
        assert_err("[1]", &["must be a JSON object"]);
        assert_err(r#"{"vocab_size": 5}"#, &["hidden_size", "dim"]);
        assert_err(
            &with("model_type", "deepseek_v41".into()),
            &["model_type", "deepseek_v41"],
        );
    }

    #[test]
    fn rejects_zero_sizes() {
        for key in [
            "hidden_size",
            "num_attention_heads",
            "vocab_size",
            "num_hidden_layers",
        ] {
            assert_err(&with(key, 0.into()), &[&format!("`{key}` = 0"), "> 0"]);
        }
        assert_err(
            &with("hidden_size", (-3).into()),
            &["hidden_size", "-3", "non-negative integer"],
        );
        assert_err(&with("hidden_size", 2.5.into()), &["hidden_size", "2.5"]);
        assert_err(
            &with("hidden_size", "256".into()),
            &["hidden_size", "\"256\""],
        );
    }

    #[test]
    fn rejects_bad_head_dims() {
        let legacy = |changes: &[(&str, Value)]| {
            let changes: Vec<(&str, Option<Value>)> =
                changes.iter().map(|(k, v)| (*k, Some(v.clone()))).collect();
            edit(TINY_LEGACY, &changes)
        };
        assert_err(
            &legacy(&[("head_dim", 129.into())]),
            &["`head_dim` = 129", "even"],
        );
        assert_err(
            &legacy(&[("head_dim", 48.into())]),
            &["`head_dim` = 48", "qk_rope_head_dim = 64"],
        );
        assert_err(
            &legacy(&[("qk_rope_head_dim", 63.into())]),
            &["`qk_rope_head_dim` = 63", "even"],
        );
        assert_err(
            &legacy(&[("qk_rope_head_dim", 0.into())]),
            &["`qk_rope_head_dim` = 0"],
        );
        assert_err(
            &with("head_dim", 127.into()),
            &["`qk_rope_head_dim` = 63", "even"],
        );
        assert_err(
            &with("index_head_dim", 32.into()),
            &["`index_head_dim` = 32", "qk_rope_head_dim = 64"],
        );
        assert_err(
            &with("partial_rotary_factor", 1.5.into()),
            &["partial_rotary_factor", "1.5", "(0, 1]"],
        );
        assert_err(
            &legacy(&[("partial_rotary_factor", 0.25.into())]),
            &[
                "`qk_rope_head_dim` = 64",
                "partial_rotary_factor 0.25",
                "= 32",
            ],
        );
        assert_err(
            &with("partial_rotary_factor", 0.25.into()),
            &["rope_parameters.main.partial_rotary_factor", "0.5", "32"],
        );
    }

    #[test]
    fn rejects_groups_not_dividing_heads() {
        assert_err(
            &with("o_groups", 3.into()),
            &["`o_groups` = 3", "num_attention_heads = 4"],
        );
        assert_err(&with("o_groups", 0.into()), &["`o_groups` = 0"]);
    }

    #[test]
    fn rejects_schedule_length_mismatch() {
        let s = with(
            "layer_types",
            serde_json::json!(["sliding_attention", "compressed_sparse_attention"]),
        );
        assert_err(&s, &["`layer_types` = 2 entries", "num_hidden_layers = 4"]);
        let s = with("mlp_layer_types", serde_json::json!(["moe"]));
        assert_err(&s, &["`mlp_layer_types` = 1 entries"]);
        let s = edit(
            TINY_LEGACY,
            &[("compress_ratios", Some(serde_json::json!([0, 4])))],
        );
        assert_err(&s, &["`layer_types` = 2 entries"]);
        let s = edit(
            FLASH_OFFICIAL,
            &[("compress_ratios", Some(serde_json::json!([0, 4])))],
        );
        assert_err(&s, &["`compress_ratios` = 2 entries", "n_layers = 43"]);
        // Longer lists are cut, as HF does.
        let s = with(
            "mlp_layer_types",
            serde_json::json!(["moe", "moe", "moe", "moe", "hash_moe"]),
        );
        assert_eq!(parse(&s).mlp_layer_types, [Scored; 4]);
    }

    #[test]
    fn rejects_unknown_layer_type_strings() {
        let s = with(
            "layer_types",
            serde_json::json!(["sliding_attention", "full_attention", "x", "y"]),
        );
        assert_err(
            &s,
            &["`layer_types[1]` = \"full_attention\"", "sliding_attention"],
        );
        let s = with(
            "mlp_layer_types",
            serde_json::json!(["moe", "dense", "moe", "moe"]),
        );
        assert_err(&s, &["`mlp_layer_types[1]` = \"dense\"", "hash_moe"]);
        let s = with(
            "compress_rates",
            serde_json::json!({"sliding_attention": 0}),
        );
        assert_err(&s, &["`compress_rates` = \"sliding_attention\""]);
        let s = with("scoring_func", "relu".into());
        assert_err(&s, &["`scoring_func` = \"relu\"", "sqrtsoftplus"]);
        let s = edit(FLASH_OFFICIAL, &[("score_func", Some("tanh".into()))]);
        assert_err(&s, &["`score_func` = \"tanh\""]);
        let mut v: Value = serde_json::from_str(TINY_HF).unwrap();
        v["rope_parameters"]["compress"]["rope_type"] = "longrope".into();
        assert_err(
            &v.to_string(),
            &["rope_parameters.compress.rope_type", "longrope"],
        );
    }

    #[test]
    fn rejects_bad_compress_rates() {
        let s = with(
            "compress_rates",
            serde_json::json!({"compressed_sparse_attention": 1,
            "heavily_compressed_attention": 8}),
        );
        assert_err(
            &s,
            &["`compress_rates.compressed_sparse_attention` = 1", ">= 2"],
        );
        let s = with(
            "compress_rates",
            serde_json::json!({"compressed_sparse_attention": 4,
            "heavily_compressed_attention": 0}),
        );
        assert_err(&s, &["`compress_rates.heavily_compressed_attention` = 0"]);
        let s = with(
            "compress_rates",
            serde_json::json!({"compressed_sparse_attention": 4}),
        );
        assert_err(
            &s,
            &["lacks required field `compress_rates.heavily_compressed_attention`"],
        );
        // Legacy HF ratios: one HCA rate, consistent with any explicit rate.
        let s = edit(
            TINY_LEGACY,
            &[("compress_ratios", Some(serde_json::json!([0, 4, 8, 16])))],
        );
        assert_err(&s, &["`compress_ratios[3]` = 16", "already 8"]);
        let s = edit(TINY_LEGACY, &[("compress_rate_hca", Some(128.into()))]);
        assert_err(&s, &["`compress_ratios[2]` = 8", "already 128"]);
        let s = edit(TINY_LEGACY, &[("compress_rate_csa", Some(8.into()))]);
        assert_err(&s, &["`compress_ratios[1]` = 4", "CSA rate is set to 8"]);
        let s = edit(
            FLASH_OFFICIAL,
            &[(
                "compress_ratios",
                Some(serde_json::json!([
                    0, 0, 4, 128, 4, 64, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                    128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                    128, 4
                ])),
            )],
        );
        assert_err(
            &s,
            &["`compress_ratios[5]` = 64", "HCA ratio 128 of layer 3"],
        );
        let s = edit(
            FLASH_OFFICIAL,
            &[(
                "compress_ratios",
                Some(serde_json::json!([
                    0, 0, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1,
                    4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4
                ])),
            )],
        );
        assert_err(&s, &["`compress_ratios` = 1", ">= 2"]);
    }

    #[test]
    fn rejects_too_many_active_experts() {
        assert_err(
            &with("num_experts_per_tok", 9.into()),
            &["`num_experts_per_tok` = 9", "n_routed_experts = 8"],
        );
        let s = edit(FLASH_OFFICIAL, &[("n_activated_experts", Some(300.into()))]);
        assert_err(
            &s,
            &["`n_activated_experts` = 300", "n_routed_experts = 256"],
        );
    }

    #[test]
    fn rejects_small_counts() {
        assert_err(&with("index_topk", 0.into()), &["`index_topk` = 0", ">= 1"]);
        assert_err(&with("hc_mult", 0.into()), &["`hc_mult` = 0", ">= 1"]);
        assert_err(
            &with("hc_sinkhorn_iters", 0.into()),
            &["`hc_sinkhorn_iters` = 0", ">= 1"],
        );
        assert_err(
            &with("sliding_window", 0.into()),
            &["`sliding_window` = 0", ">= 1"],
        );
        let s = edit(FLASH_OFFICIAL, &[("window_size", Some(0.into()))]);
        assert_err(&s, &["`window_size` = 0"]);
    }

    #[test]
    fn rejects_bad_floats() {
        assert_err(
            &with("rms_norm_eps", 0.into()),
            &["`rms_norm_eps` = 0", "> 0"],
        );
        assert_err(
            &with("rms_norm_eps", 1e-50.into()),
            &["`rms_norm_eps` = 0", "as f32"],
        );
        assert_err(&with("hc_eps", (-1.0).into()), &["`hc_eps` = -1"]);
        assert_err(
            &with("routed_scaling_factor", 0.into()),
            &["`routed_scaling_factor` = 0"],
        );
        assert_err(
            &with("swiglu_limit", 0.into()),
            &["`swiglu_limit` = 0", "> 0"],
        );
        assert_err(
            &with("norm_topk_prob", 1.into()),
            &["`norm_topk_prob` = 1", "true or false"],
        );
        let mut v: Value = serde_json::from_str(TINY_HF).unwrap();
        v["rope_parameters"]["compress"]["factor"] = 0.into();
        assert_err(&v.to_string(), &["`rope_parameters.compress.factor` = 0"]);
        v["rope_parameters"]["compress"]["factor"] = 16.into();
        v["rope_parameters"]["main"]["rope_theta"] = 1.into();
        assert_err(&v.to_string(), &["`rope_theta` = 1", "> 1"]);
        let s = edit(FLASH_OFFICIAL, &[("norm_eps", Some((-1e-6).into()))]);
        assert_err(&s, &["`norm_eps` = -0.000001"]);
    }

    #[test]
    fn rejects_missing_official_keys() {
        for key in [
            "dim",
            "n_layers",
            "n_heads",
            "moe_inter_dim",
            "n_routed_experts",
            "n_activated_experts",
            "compress_ratios",
        ] {
            let s = edit(FLASH_OFFICIAL, &[(key, None)]);
            if key == "dim" {
                // Still detected as official through n_layers.
                assert_err(&s, &["lacks required field `dim`"]);
            } else {
                assert_err(&s, &[&format!("lacks required field `{key}`")]);
            }
        }
    }

    #[test]
    fn rejects_bad_token_ids() {
        assert_err(
            &with("eos_token_id", serde_json::json!([1, "x"])),
            &["`eos_token_id[1]` = \"x\""],
        );
        assert_err(
            &with("bos_token_id", (1u64 << 40).into()),
            &["`bos_token_id` = 1099511627776", "u32"],
        );
    }
}
