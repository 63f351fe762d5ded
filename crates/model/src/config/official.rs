//! DeepSeek's own `inference/config.json` (`ModelArgs` names). It differs from the HF flavour
//! in more than names (which keys are required, the defaults, what `swiglu_limit = 0` or a
//! compress ratio other than 4 means), so it gets its own reader rather than a renaming table.

use super::fields::{scoring, token_ids, Fields};
use super::validate::MAX_LAYERS;
use super::{invalid, AttnKind, ConfigError, MlpKind, ModelConfig, RopeParams, ScoringFunc, Yarn};

/// DeepSeek's `inference/config.json`. Absent keys take `ModelArgs` defaults, except those
/// whose defaults describe the 7-layer debug model rather than any shipped one: without them a
/// config would load as a silently different architecture, so they are required.
pub(super) fn parse(f: &Fields) -> Result<ModelConfig, ConfigError> {
    let n = f.req_usize("n_layers")?;
    if n > MAX_LAYERS {
        // Checked before the per-layer lists are sized by it.
        return Err(invalid(
            "n_layers",
            n,
            format!("must be at most {MAX_LAYERS}"),
        ));
    }
    let hidden_size = f.req_usize("dim")?;
    let num_attention_heads = f.req_usize("n_heads")?;
    let moe_intermediate_size = f.req_usize("moe_inter_dim")?;
    let n_routed_experts = f.req_usize("n_routed_experts")?;
    let num_experts_per_tok = f.req_usize("n_activated_experts")?;
    let (layer_types, hca_rate) = layer_kinds(f, n)?;
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
    let (yarn, max_position_embeddings) = compress_yarn(f)?;
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
        compress_rate_hca: hca_rate,
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
        numerics: Default::default(),
        v41: None,
        dspark: None,
        vision: None,
    })
}

/// Each layer's kind from the per-layer `compress_ratios` (MTP entries may follow), and the
/// model's HCA rate (128 where no layer states one). Ratio 4 selects the overlapping
/// compressor + indexer in the reference; every other non-zero ratio is plain heavy
/// compression, and the model has a single such rate.
fn layer_kinds(f: &Fields, n: usize) -> Result<(Vec<AttnKind>, usize), ConfigError> {
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
    Ok((layer_types, hca.map_or(128, |(_, m)| m)))
}

/// The compress table's YaRN (when `original_seq_len` is set) and the context length:
/// `max_seq_len` is the length the reference precomputes tables for; failing that, YaRN's
/// extended length is what HF configs state as `max_position_embeddings`.
fn compress_yarn(f: &Fields) -> Result<(Option<Yarn>, usize), ConfigError> {
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
    let max_position_embeddings =
        match (f.usize("max_position_embeddings")?, f.usize("max_seq_len")?) {
            (Some(m), _) | (None, Some(m)) => m,
            (None, None) if original_seq_len > 0 => {
                (original_seq_len as f64 * rope_factor).round() as usize
            }
            (None, None) => 4096,
        };
    Ok((yarn, max_position_embeddings))
}
