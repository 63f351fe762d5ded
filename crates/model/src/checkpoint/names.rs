//! Official tensor names → HF `DeepseekV4ForCausalLM` names (docs/MODEL.md §4.2).
//!
//! The engine speaks official names only; HF checkpoints are translated at lookup time. The
//! routed experts are the one non-rename: HF stacks them into 3-D tensors, so an official
//! expert name resolves to a slice of a stacked tensor.

/// Which slice of HF's stacked expert tensors an official expert matrix is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ExpertPart {
    /// `w1`: rows `[0, I)` of `gate_up_proj[E]` (`[E, 2I, D]`).
    Gate,
    /// `w3`: rows `[I, 2I)` of `gate_up_proj[E]`.
    Up,
    /// `w2`: all of `down_proj[E]` (`[E, D, I]`).
    Down,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum HfName {
    Plain(String),
    /// `stacked` is the stacked weight's name; for `scale`, the stacked block scale is
    /// `{stacked}_scale_inv` (HF's FP8 experts naming).
    Expert {
        stacked: String,
        expert: usize,
        part: ExpertPart,
        scale: bool,
    },
}

/// `None` for names HF has no counterpart for (e.g. `mtp.*`, which HF drops).
pub(super) fn official_to_hf(name: &str) -> Option<HfName> {
    let top = match name {
        "embed.weight" => Some("model.embed_tokens.weight"),
        "head.weight" => Some("lm_head.weight"),
        "norm.weight" => Some("model.norm.weight"),
        "hc_head_fn" => Some("model.hc_head.hc_fn"),
        "hc_head_base" => Some("model.hc_head.hc_base"),
        "hc_head_scale" => Some("model.hc_head.hc_scale"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(HfName::Plain(t.to_string()));
    }
    let rest = name.strip_prefix("layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let prefix = format!("model.layers.{layer}.");
    if let Some(e) = rest.strip_prefix("ffn.experts.") {
        let (expert, rest) = e.split_once('.')?;
        let expert: usize = expert.parse().ok()?;
        let (w, leaf) = rest.split_once('.')?;
        let (stacked, part) = match w {
            "w1" => ("gate_up_proj", ExpertPart::Gate),
            "w3" => ("gate_up_proj", ExpertPart::Up),
            "w2" => ("down_proj", ExpertPart::Down),
            _ => return None,
        };
        let scale = match leaf {
            "weight" => false,
            "scale" => true,
            _ => return None,
        };
        return Some(HfName::Expert {
            stacked: format!("{prefix}mlp.experts.{stacked}"),
            expert,
            part,
            scale,
        });
    }
    layer_param(rest).map(|p| HfName::Plain(format!("{prefix}{p}")))
}

/// Parameters of one decoder layer, relative to `layers.N.`.
fn layer_param(rest: &str) -> Option<String> {
    let whole = match rest {
        "hc_attn_fn" => Some("attn_hc.fn"),
        "hc_attn_base" => Some("attn_hc.base"),
        "hc_attn_scale" => Some("attn_hc.scale"),
        "hc_ffn_fn" => Some("ffn_hc.fn"),
        "hc_ffn_base" => Some("ffn_hc.base"),
        "hc_ffn_scale" => Some("ffn_hc.scale"),
        "attn.attn_sink" => Some("self_attn.sinks"),
        "attn.compressor.ape" => Some("self_attn.compressor.position_bias"),
        "attn.indexer.compressor.ape" => Some("self_attn.compressor.indexer.position_bias"),
        "ffn.gate.weight" => Some("mlp.gate.weight"),
        "ffn.gate.bias" => Some("mlp.gate.e_score_correction_bias"),
        "ffn.gate.tid2eid" => Some("mlp.gate.tid2eid"),
        _ => None,
    };
    if let Some(w) = whole {
        return Some(w.to_string());
    }
    let (module, leaf) = rest.rsplit_once('.')?;
    let leaf = match leaf {
        "weight" => "weight",
        // HF's FP8 quantizer renames the block scale.
        "scale" => "weight_scale_inv",
        _ => return None,
    };
    let module = match module {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn.wq_a" => "self_attn.q_a_proj",
        "attn.q_norm" => "self_attn.q_a_norm",
        "attn.wq_b" => "self_attn.q_b_proj",
        "attn.wkv" => "self_attn.kv_proj",
        "attn.kv_norm" => "self_attn.kv_norm",
        "attn.wo_a" => "self_attn.o_a_proj",
        "attn.wo_b" => "self_attn.o_b_proj",
        "attn.compressor.wkv" => "self_attn.compressor.kv_proj",
        "attn.compressor.wgate" => "self_attn.compressor.gate_proj",
        "attn.compressor.norm" => "self_attn.compressor.kv_norm",
        "attn.indexer.compressor.wkv" => "self_attn.compressor.indexer.kv_proj",
        "attn.indexer.compressor.wgate" => "self_attn.compressor.indexer.gate_proj",
        "attn.indexer.compressor.norm" => "self_attn.compressor.indexer.kv_norm",
        "attn.indexer.wq_b" => "self_attn.compressor.indexer.q_b_proj",
        "attn.indexer.weights_proj" => "self_attn.compressor.indexer.scorer.weights_proj",
        "ffn.shared_experts.w1" => "mlp.shared_experts.gate_proj",
        "ffn.shared_experts.w2" => "mlp.shared_experts.down_proj",
        "ffn.shared_experts.w3" => "mlp.shared_experts.up_proj",
        _ => return None,
    };
    Some(format!("{module}.{leaf}"))
}

/// The second name an official-layout checkpoint may use for a tensor: HF's `save_pretrained`
/// writes `attn.kv_norm` back as `attn.norm`.
pub(super) fn official_alias(name: &str) -> Option<String> {
    let stem = name.strip_suffix("attn.kv_norm.weight")?;
    (stem.is_empty() || stem.ends_with('.')).then(|| format!("{stem}attn.norm.weight"))
}

/// The second name an HF-layout checkpoint may use: `save_pretrained` reverses the conversion
/// mapping's `.norm.` → `.kv_norm.` rename, so every `kv_norm` comes back as `norm`.
pub(super) fn hf_alias(name: &str) -> Option<String> {
    let stem = name.strip_suffix(".kv_norm.weight")?;
    Some(format!("{stem}.norm.weight"))
}

/// The name transformers' `save_pretrained` writes for an official tensor when the model it
/// saves was loaded from DeepSeek's layout with its FP8/FP4 weights kept as stored (the
/// conversion mapping run backwards): DeepSeek's names under `model.`, except `head.weight`
/// and the top-level tensors HF names its own way. Tensors HF does not know (`mtp.*`) keep
/// their official names.
pub(super) fn official_to_saved(name: &str) -> String {
    let top = match name {
        "embed.weight" => "model.embed_tokens.weight",
        "norm.weight" => "model.norm.weight",
        "hc_head_fn" => "model.hc_head.hc_fn",
        "hc_head_base" => "model.hc_head.hc_base",
        "hc_head_scale" => "model.hc_head.hc_scale",
        _ if name.starts_with("layers.") => return format!("model.{name}"),
        _ => name,
    };
    top.to_string()
}

/// Whether a stored name is a main layer's tensor under DeepSeek's inner names with HF's
/// `model.` prefix ([`official_to_saved`]'s layout).
pub(super) fn is_saved_official(stored: &str) -> bool {
    let Some(rest) = stored.strip_prefix("model.layers.") else {
        return false;
    };
    let inner = rest.split_once('.').map_or("", |(_, inner)| inner);
    inner.starts_with("attn.") || inner.starts_with("ffn.")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of `tests/fixtures/golden/tiny-c/saved-f32` (tools/make_saved_fixtures.py).
    #[test]
    fn transformers_saved_names_of_deepseeks_layout() {
        let table = [
            ("embed.weight", "model.embed_tokens.weight"),
            ("head.weight", "head.weight"),
            ("norm.weight", "model.norm.weight"),
            ("hc_head_fn", "model.hc_head.hc_fn"),
            ("hc_head_scale", "model.hc_head.hc_scale"),
            (
                "layers.0.attn.wq_a.weight",
                "model.layers.0.attn.wq_a.weight",
            ),
            ("layers.0.attn.wq_a.scale", "model.layers.0.attn.wq_a.scale"),
            ("layers.1.hc_ffn_base", "model.layers.1.hc_ffn_base"),
            (
                "layers.1.ffn.experts.3.w2.weight",
                "model.layers.1.ffn.experts.3.w2.weight",
            ),
            ("mtp.0.e_proj.weight", "mtp.0.e_proj.weight"),
        ];
        for (official, saved) in table {
            assert_eq!(official_to_saved(official), saved);
        }
        let kv = official_to_saved("layers.0.attn.kv_norm.weight");
        assert_eq!(
            official_alias(&kv).unwrap(),
            "model.layers.0.attn.norm.weight"
        );
        assert!(is_saved_official("model.layers.0.attn.wq_a.weight"));
        assert!(is_saved_official("model.layers.12.ffn.gate.tid2eid"));
        assert!(!is_saved_official(
            "model.layers.0.self_attn.q_a_proj.weight"
        ));
        assert!(!is_saved_official("model.layers.0.mlp.gate.weight"));
        assert!(!is_saved_official("layers.0.attn.wq_a.weight"));
        assert_eq!(
            hf_alias("model.layers.0.self_attn.compressor.indexer.kv_norm.weight").unwrap(),
            "model.layers.0.self_attn.compressor.indexer.norm.weight"
        );
        assert_eq!(hf_alias("model.layers.0.self_attn.q_a_norm.weight"), None);
    }

    fn plain(official: &str) -> String {
        match official_to_hf(official) {
            Some(HfName::Plain(s)) => s,
            other => panic!("{official}: {other:?}"),
        }
    }

    #[test]
    fn every_plain_rename_of_spec_4_2() {
        let table = [
            ("embed.weight", "model.embed_tokens.weight"),
            ("head.weight", "lm_head.weight"),
            ("norm.weight", "model.norm.weight"),
            ("hc_head_fn", "model.hc_head.hc_fn"),
            ("hc_head_base", "model.hc_head.hc_base"),
            ("hc_head_scale", "model.hc_head.hc_scale"),
            (
                "layers.0.attn_norm.weight",
                "model.layers.0.input_layernorm.weight",
            ),
            (
                "layers.0.ffn_norm.weight",
                "model.layers.0.post_attention_layernorm.weight",
            ),
            ("layers.1.hc_attn_fn", "model.layers.1.attn_hc.fn"),
            ("layers.1.hc_attn_base", "model.layers.1.attn_hc.base"),
            ("layers.1.hc_attn_scale", "model.layers.1.attn_hc.scale"),
            ("layers.1.hc_ffn_fn", "model.layers.1.ffn_hc.fn"),
            ("layers.1.hc_ffn_base", "model.layers.1.ffn_hc.base"),
            ("layers.1.hc_ffn_scale", "model.layers.1.ffn_hc.scale"),
            (
                "layers.2.attn.wq_a.weight",
                "model.layers.2.self_attn.q_a_proj.weight",
            ),
            (
                "layers.2.attn.wq_a.scale",
                "model.layers.2.self_attn.q_a_proj.weight_scale_inv",
            ),
            (
                "layers.2.attn.q_norm.weight",
                "model.layers.2.self_attn.q_a_norm.weight",
            ),
            (
                "layers.2.attn.wq_b.weight",
                "model.layers.2.self_attn.q_b_proj.weight",
            ),
            (
                "layers.2.attn.wkv.weight",
                "model.layers.2.self_attn.kv_proj.weight",
            ),
            (
                "layers.2.attn.kv_norm.weight",
                "model.layers.2.self_attn.kv_norm.weight",
            ),
            (
                "layers.2.attn.wo_a.weight",
                "model.layers.2.self_attn.o_a_proj.weight",
            ),
            (
                "layers.2.attn.wo_b.scale",
                "model.layers.2.self_attn.o_b_proj.weight_scale_inv",
            ),
            ("layers.2.attn.attn_sink", "model.layers.2.self_attn.sinks"),
            (
                "layers.2.attn.compressor.wkv.weight",
                "model.layers.2.self_attn.compressor.kv_proj.weight",
            ),
            (
                "layers.2.attn.compressor.wgate.weight",
                "model.layers.2.self_attn.compressor.gate_proj.weight",
            ),
            (
                "layers.2.attn.compressor.ape",
                "model.layers.2.self_attn.compressor.position_bias",
            ),
            (
                "layers.2.attn.compressor.norm.weight",
                "model.layers.2.self_attn.compressor.kv_norm.weight",
            ),
            (
                "layers.2.attn.indexer.compressor.wkv.weight",
                "model.layers.2.self_attn.compressor.indexer.kv_proj.weight",
            ),
            (
                "layers.2.attn.indexer.compressor.wgate.weight",
                "model.layers.2.self_attn.compressor.indexer.gate_proj.weight",
            ),
            (
                "layers.2.attn.indexer.compressor.ape",
                "model.layers.2.self_attn.compressor.indexer.position_bias",
            ),
            (
                "layers.2.attn.indexer.compressor.norm.weight",
                "model.layers.2.self_attn.compressor.indexer.kv_norm.weight",
            ),
            (
                "layers.2.attn.indexer.wq_b.weight",
                "model.layers.2.self_attn.compressor.indexer.q_b_proj.weight",
            ),
            (
                "layers.2.attn.indexer.wq_b.scale",
                "model.layers.2.self_attn.compressor.indexer.q_b_proj.weight_scale_inv",
            ),
            (
                "layers.2.attn.indexer.weights_proj.weight",
                "model.layers.2.self_attn.compressor.indexer.scorer.weights_proj.weight",
            ),
            ("layers.3.ffn.gate.weight", "model.layers.3.mlp.gate.weight"),
            (
                "layers.3.ffn.gate.bias",
                "model.layers.3.mlp.gate.e_score_correction_bias",
            ),
            (
                "layers.0.ffn.gate.tid2eid",
                "model.layers.0.mlp.gate.tid2eid",
            ),
            (
                "layers.3.ffn.shared_experts.w1.weight",
                "model.layers.3.mlp.shared_experts.gate_proj.weight",
            ),
            (
                "layers.3.ffn.shared_experts.w2.weight",
                "model.layers.3.mlp.shared_experts.down_proj.weight",
            ),
            (
                "layers.3.ffn.shared_experts.w3.weight",
                "model.layers.3.mlp.shared_experts.up_proj.weight",
            ),
            (
                "layers.3.ffn.shared_experts.w3.scale",
                "model.layers.3.mlp.shared_experts.up_proj.weight_scale_inv",
            ),
            (
                "layers.42.attn.wkv.weight",
                "model.layers.42.self_attn.kv_proj.weight",
            ),
        ];
        for (official, hf) in table {
            assert_eq!(plain(official), hf, "{official}");
        }
    }

    #[test]
    fn experts_map_to_stacked_slices() {
        let cases = [
            (
                "layers.4.ffn.experts.7.w1.weight",
                "gate_up_proj",
                7,
                ExpertPart::Gate,
                false,
            ),
            (
                "layers.4.ffn.experts.0.w3.weight",
                "gate_up_proj",
                0,
                ExpertPart::Up,
                false,
            ),
            (
                "layers.4.ffn.experts.255.w2.weight",
                "down_proj",
                255,
                ExpertPart::Down,
                false,
            ),
            (
                "layers.4.ffn.experts.3.w1.scale",
                "gate_up_proj",
                3,
                ExpertPart::Gate,
                true,
            ),
        ];
        for (official, stacked, expert, part, scale) in cases {
            let want = HfName::Expert {
                stacked: format!("model.layers.4.mlp.experts.{stacked}"),
                expert,
                part,
                scale,
            };
            assert_eq!(official_to_hf(official), Some(want), "{official}");
        }
    }

    #[test]
    fn unmappable_names() {
        for name in [
            "mtp.0.e_proj.weight",
            "layers.x.attn.wkv.weight",
            "layers.0.attn.bogus.weight",
            "layers.0.ffn.experts.1.w4.weight",
            "layers.0.ffn.experts.one.w1.weight",
            "layers.0",
            "something",
        ] {
            assert_eq!(official_to_hf(name), None, "{name}");
        }
    }

    #[test]
    fn kv_norm_alias() {
        assert_eq!(
            official_alias("layers.3.attn.kv_norm.weight").as_deref(),
            Some("layers.3.attn.norm.weight")
        );
        assert_eq!(
            official_alias("mtp.0.attn.kv_norm.weight").as_deref(),
            Some("mtp.0.attn.norm.weight")
        );
        assert_eq!(official_alias("layers.3.attn.compressor.norm.weight"), None);
        assert_eq!(official_alias("layers.3.attn.kv_norm.scale"), None);
    }
}
