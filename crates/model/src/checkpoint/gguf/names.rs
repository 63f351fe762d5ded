//! Official tensor names → the names llama.cpp's converter gives them in a `deepseek4` GGUF
//! (`LLM_ARCH_DEEPSEEK4` in `src/llama-arch.cpp`, `conversion/deepseek.py` of llama.cpp
//! 0c1e570). The converter renames and retypes; it does not transpose: ggml's dimensions
//! list the innermost first, so a GGUF `[in, out]` is the official row-major `[out, in]`.
//! Block scales (`*.scale`) have no name of their own: they live inside the blocks.

/// Where an official name lives in a GGUF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::checkpoint) enum GgufName {
    Plain(String),
    /// Expert `expert` of a stacked `[E, rows, cols]` tensor (gate, up and down each have
    /// their own).
    Expert {
        stacked: String,
        expert: usize,
    },
}

/// `None` for names the file format has no place for (block scales, and the MTP block, which
/// llama.cpp ships in a sidecar file).
pub(in crate::checkpoint) fn official_to_gguf(name: &str) -> Option<GgufName> {
    let top = match name {
        "embed.weight" => Some("token_embd.weight"),
        "head.weight" => Some("output.weight"),
        "norm.weight" => Some("output_norm.weight"),
        "hc_head_fn" => Some("output_hc_fn.weight"),
        "hc_head_base" => Some("output_hc_base.weight"),
        "hc_head_scale" => Some("output_hc_scale.weight"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(GgufName::Plain(t.to_string()));
    }
    let rest = name.strip_prefix("layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if let Some(e) = rest.strip_prefix("ffn.experts.") {
        let (expert, w) = e.split_once('.')?;
        let stacked = match w {
            "w1.weight" => "ffn_gate_exps",
            "w3.weight" => "ffn_up_exps",
            "w2.weight" => "ffn_down_exps",
            _ => return None,
        };
        return Some(GgufName::Expert {
            stacked: format!("blk.{layer}.{stacked}.weight"),
            expert: expert.parse().ok()?,
        });
    }
    let leaf = layer_param(rest)?;
    Some(GgufName::Plain(format!("blk.{layer}.{leaf}")))
}

/// Parameters of one decoder layer, relative to `layers.N.`.
fn layer_param(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "attn_norm.weight" => "attn_norm.weight",
        "ffn_norm.weight" => "ffn_norm.weight",
        "hc_attn_fn" => "hc_attn_fn.weight",
        "hc_attn_base" => "hc_attn_base.weight",
        "hc_attn_scale" => "hc_attn_scale.weight",
        "hc_ffn_fn" => "hc_ffn_fn.weight",
        "hc_ffn_base" => "hc_ffn_base.weight",
        "hc_ffn_scale" => "hc_ffn_scale.weight",
        "attn.attn_sink" => "attn_sinks.weight",
        "attn.wq_a.weight" => "attn_q_a.weight",
        "attn.q_norm.weight" => "attn_q_a_norm.weight",
        "attn.wq_b.weight" => "attn_q_b.weight",
        "attn.wkv.weight" => "attn_kv.weight",
        "attn.kv_norm.weight" => "attn_kv_a_norm.weight",
        "attn.wo_a.weight" => "attn_output_a.weight",
        "attn.wo_b.weight" => "attn_output_b.weight",
        "attn.compressor.ape" => "attn_compressor_ape.weight",
        "attn.compressor.norm.weight" => "attn_compressor_norm.weight",
        "attn.compressor.wgate.weight" => "attn_compressor_gate.weight",
        "attn.compressor.wkv.weight" => "attn_compressor_kv.weight",
        "attn.indexer.compressor.ape" => "indexer_compressor_ape.weight",
        "attn.indexer.compressor.norm.weight" => "indexer_compressor_norm.weight",
        "attn.indexer.compressor.wgate.weight" => "indexer_compressor_gate.weight",
        "attn.indexer.compressor.wkv.weight" => "indexer_compressor_kv.weight",
        "attn.indexer.weights_proj.weight" => "indexer.proj.weight",
        "attn.indexer.wq_b.weight" => "indexer.attn_q_b.weight",
        "ffn.gate.weight" => "ffn_gate_inp.weight",
        "ffn.gate.bias" => "exp_probs_b.bias",
        "ffn.gate.tid2eid" => "ffn_gate_tid2eid.weight",
        "ffn.shared_experts.w1.weight" => "ffn_gate_shexp.weight",
        "ffn.shared_experts.w3.weight" => "ffn_up_shexp.weight",
        "ffn.shared_experts.w2.weight" => "ffn_down_shexp.weight",
        _ => return None,
    })
}

/// The highest `blk.N.` layer index among `names`, with one such name.
pub(in crate::checkpoint) fn last_block<'a>(
    names: impl Iterator<Item = &'a String>,
) -> Option<(usize, &'a str)> {
    names
        .filter_map(|n| {
            let rest = n.strip_prefix("blk.")?;
            Some((rest.split('.').next()?.parse().ok()?, n.as_str()))
        })
        .max()
}

/// Whether `files` (sorted) are the shards of one split GGUF, as llama.cpp's `gguf-split`
/// names them: `PREFIX-00001-of-0000N.gguf` … `PREFIX-0000N-of-0000N.gguf`.
pub(in crate::checkpoint) fn split_shards(files: &[std::path::PathBuf]) -> bool {
    let parts: Option<Vec<(String, usize, usize)>> = files
        .iter()
        .map(|p| {
            let name = p.file_name()?.to_str()?.strip_suffix(".gguf")?;
            let (rest, of) = name.rsplit_once("-of-")?;
            let (prefix, no) = rest.rsplit_once('-')?;
            Some((prefix.to_string(), no.parse().ok()?, of.parse().ok()?))
        })
        .collect();
    parts.is_some_and(|p| {
        p.iter()
            .enumerate()
            .all(|(i, (prefix, no, of))| *prefix == p[0].0 && *no == i + 1 && *of == files.len())
    })
}

/// The files a GGUF path stands for: the first shard of a split file
/// (`PREFIX-00001-of-0000N.gguf`) stands for all N, in order; any other file for itself.
pub(in crate::checkpoint) fn shard_set(path: &std::path::Path) -> Vec<std::path::PathBuf> {
    let split = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".gguf"))
        .and_then(|n| n.rsplit_once("-of-"))
        .and_then(|(rest, of)| Some((rest.strip_suffix("-00001")?, of.parse::<usize>().ok()?)));
    match split {
        Some((prefix, n)) if n > 1 => (1..=n)
            .map(|i| path.with_file_name(format!("{prefix}-{i:05}-of-{n:05}.gguf")))
            .collect(),
        _ => vec![path.to_path_buf()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_as_the_converter_writes_them() {
        let plain = |s: &str| Some(GgufName::Plain(s.to_string()));
        assert_eq!(official_to_gguf("embed.weight"), plain("token_embd.weight"));
        assert_eq!(
            official_to_gguf("layers.7.attn.wo_a.weight"),
            plain("blk.7.attn_output_a.weight")
        );
        assert_eq!(
            official_to_gguf("layers.2.attn.indexer.compressor.ape"),
            plain("blk.2.indexer_compressor_ape.weight")
        );
        assert_eq!(
            official_to_gguf("layers.3.ffn.experts.11.w3.weight"),
            Some(GgufName::Expert {
                stacked: "blk.3.ffn_up_exps.weight".into(),
                expert: 11
            })
        );
        let paths = |names: &[&str]| -> Vec<std::path::PathBuf> {
            names.iter().map(std::path::PathBuf::from).collect()
        };
        assert!(split_shards(&paths(&[
            "m-00001-of-00002.gguf",
            "m-00002-of-00002.gguf"
        ])));
        assert!(!split_shards(&paths(&["m-00001-of-00002.gguf"])));
        assert!(!split_shards(&paths(&[
            "V4-Flash.gguf",
            "mtp-V4-Flash.gguf"
        ])));
        let set = shard_set(std::path::Path::new("/m/V4-00001-of-00003.gguf"));
        assert_eq!(
            set,
            paths(&[
                "/m/V4-00001-of-00003.gguf",
                "/m/V4-00002-of-00003.gguf",
                "/m/V4-00003-of-00003.gguf"
            ])
        );
        assert_eq!(
            shard_set(std::path::Path::new("a.gguf")),
            paths(&["a.gguf"])
        );
        for none in [
            "layers.0.attn.wq_a.scale",
            "layers.0.ffn.experts.1.w1.scale",
            "mtp.0.e_proj.weight",
        ] {
            assert_eq!(official_to_gguf(none), None, "{none}");
        }
    }
}
