//! HF `model_type: deepseek_v4` configs, including the legacy keys HF still folds in
//! (`compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`, `rope_scaling`, ...), read the
//! way HF's `DeepseekV4Config` reads them so a config means the same thing here as there.

use super::fields::{scoring, to_usize, token_ids, Fields};
use super::validate::MAX_LAYERS;
use super::{invalid, AttnKind, ConfigError, MlpKind, ModelConfig, RopeParams, Yarn};

const CSA_NAME: &str = "compressed_sparse_attention";
const HCA_NAME: &str = "heavily_compressed_attention";

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

/// A V4 config, or with `v41` the text part of a V4.1 one (whose own fields
/// [`super::v41::parse`] reads). Fields are read, and refused, in the order of the steps.
pub(super) fn parse(f: &Fields, v41: bool) -> Result<ModelConfig, ConfigError> {
    check_model_type(f, v41)?;
    let n = layer_count(f)?;
    let head_dim = f.usize_or("head_dim", 512)?;
    let max_pos = f.usize_or("max_position_embeddings", 1_048_576)?;
    let mut rates = CompressRates::read(f)?;
    let v41_ratios = if v41 { Some(v41_ratios(f, n)?) } else { None };
    let layer_types = attn_kinds(f, n, v41_ratios.as_deref(), &mut rates)?;
    rates.check_used(&layer_types)?;
    let mlp_layer_types = mlp_kinds(f, n, v41)?;
    let rope = RopeTables::read(f, max_pos)?;
    let qk_rope_head_dim = rope.rotary_width(f, head_dim)?;
    let (rope_main, rope_compress) = (rope.main, rope.compress);
    let (csa_rate, hca_rate) = (rates.csa, rates.hca);
    let scoring_func = scoring(
        "scoring_func",
        f.str("scoring_func")?.unwrap_or("sqrtsoftplus"),
    )?;
    let (bos_token_id, eos_token_ids) = token_ids(f, Some(0), &[1])?;
    let index_topk = f.usize_or("index_topk", 512)?;
    let vocab_size = f.usize_or("vocab_size", 129280)?;
    let dspark = super::dspark::parse(f, n, vocab_size, v41)?;
    let v41 = match v41_ratios {
        Some(r) => Some(super::v41::parse(f, r, index_topk)?),
        None => None,
    };
    Ok(ModelConfig {
        vocab_size,
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
        index_topk,
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
        numerics: Default::default(),
        v41,
        dspark,
        vision: None,
    })
}

fn check_model_type(f: &Fields, v41: bool) -> Result<(), ConfigError> {
    let expected: &[&str] = if v41 {
        &["deepseek_v41", "deepseek_v41_text"]
    } else {
        &["deepseek_v4"]
    };
    if let Some(mt) = f.str("model_type")? {
        if !expected.contains(&mt) {
            return Err(invalid(
                f.name("model_type"),
                format!("{mt:?}"),
                format!("expected {}", expected.join(" or ")),
            ));
        }
    }
    Ok(())
}

/// `num_hidden_layers`, checked before the per-layer lists are sized by it.
fn layer_count(f: &Fields) -> Result<usize, ConfigError> {
    let n = f.usize_or("num_hidden_layers", 43)?;
    if n > MAX_LAYERS {
        return Err(invalid(
            "num_hidden_layers",
            n,
            format!("must be at most {MAX_LAYERS}"),
        ));
    }
    Ok(n)
}

/// Compression rates: an explicit dict replaces HF's default wholesale, then the legacy
/// scalars override single entries.
struct CompressRates<'a> {
    dict: Option<Fields<'a>>,
    csa: Option<usize>,
    hca: Option<usize>,
}

impl<'a> CompressRates<'a> {
    fn read(f: &Fields<'a>) -> Result<Self, ConfigError> {
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

        Ok(Self {
            dict: rates_dict,
            csa: csa_rate,
            hca: hca_rate,
        })
    }

    /// A dict that leaves out the rate of a kind the model uses would crash HF; refuse it.
    fn check_used(&self, layer_types: &[AttnKind]) -> Result<(), ConfigError> {
        for (kind, rate, name) in [
            (AttnKind::Csa, self.csa, CSA_NAME),
            (AttnKind::Hca, self.hca, HCA_NAME),
        ] {
            if self.dict.is_some() && rate.is_none() && layer_types.contains(&kind) {
                return Err(ConfigError::Missing {
                    field: format!("compress_rates.{name}"),
                });
            }
        }
        Ok(())
    }
}

/// V4.1's per-layer `compress_ratios` (required, one per layer; trailing entries cut).
fn v41_ratios(f: &Fields, n: usize) -> Result<Vec<usize>, ConfigError> {
    let r = f
        .usize_list("compress_ratios")?
        .ok_or_else(|| ConfigError::Missing {
            field: f.name("compress_ratios"),
        })?;
    if r.len() < n {
        return Err(invalid(
            f.name("compress_ratios"),
            format!("{} entries", r.len()),
            format!("needs one entry per layer (num_hidden_layers = {n})"),
        ));
    }
    Ok(r[..n].to_vec())
}

/// Layer kinds: V4.1's from its ratios; else explicit `layer_types` > legacy per-layer
/// `compress_ratios` (which may carry trailing MTP entries) > HF's default (the V4-Pro
/// schedule). Lists are cut to the layer count as HF does; a short list fails validation.
fn attn_kinds(
    f: &Fields,
    n: usize,
    v41_ratios: Option<&[usize]>,
    rates: &mut CompressRates,
) -> Result<Vec<AttnKind>, ConfigError> {
    Ok(if let Some(r) = v41_ratios {
        r.iter()
            .map(|&m| {
                if m == 0 {
                    AttnKind::Sliding
                } else {
                    AttnKind::Shared
                }
            })
            .collect()
    } else if let Some(list) = f.str_list("layer_types")? {
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
        legacy_ratios_to_kinds(&ratios, n, &mut rates.csa, &mut rates.hca)?
    } else {
        (0..n)
            .map(|i| match i {
                0 | 1 => AttnKind::Hca,
                _ if i % 2 == 1 => AttnKind::Hca,
                _ => AttnKind::Csa,
            })
            .collect()
    })
}

/// The MoE kinds: explicit `mlp_layer_types`, else the first `num_hash_layers` hash-routed.
fn mlp_kinds(f: &Fields, n: usize, v41: bool) -> Result<Vec<MlpKind>, ConfigError> {
    Ok(if let Some(list) = f.str_list("mlp_layer_types")? {
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
        // V4.1 routes every layer by score (docs/MODEL.md §8.7).
        let n_hash = f.usize_or("num_hash_layers", if v41 { 0 } else { 3 })?;
        if v41 && n_hash > 0 {
            return Err(invalid(
                f.name("num_hash_layers"),
                n_hash,
                "V4.1 has no hash-routed layers",
            ));
        }
        (0..n)
            .map(|i| {
                if i < n_hash {
                    MlpKind::Hash
                } else {
                    MlpKind::Scored
                }
            })
            .collect()
    })
}

/// RoPE tables. `rope_scaling` (legacy) wins over `rope_parameters`, as in HF. Only a dict
/// with both `main` and `compress` entries is "nested"; anything else is a flat YaRN spec
/// for the compress table, whose theta is always `compress_rope_theta`.
struct RopeTables<'a> {
    main: RopeParams,
    compress: RopeParams,
    nested: Option<(Fields<'a>, Fields<'a>)>,
}

impl<'a> RopeTables<'a> {
    fn read(f: &Fields<'a>, max_pos: usize) -> Result<Self, ConfigError> {
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

        Ok(Self {
            main: rope_main,
            compress: rope_compress,
            nested,
        })
    }

    /// Rotary width: HF derives it from `partial_rotary_factor` (default 64/512), folding in
    /// a legacy `qk_rope_head_dim`. When both are present they must agree; nested rope
    /// entries size the actual tables, so they must agree as well.
    fn rotary_width(&self, f: &Fields, head_dim: usize) -> Result<usize, ConfigError> {
        let nested = &self.nested;
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
                        format!(
                            "disagrees with partial_rotary_factor {p} × head_dim {head_dim} = {d}"
                        ),
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

        Ok(qk_rope_head_dim)
    }
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
