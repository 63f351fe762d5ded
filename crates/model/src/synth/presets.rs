//! Named model shapes and the `config.json` each one ships with.

use serde_json::{json, Value};

use super::SynthError;
use crate::config::{
    AttnKind, Candidates, DsparkConfig, EngramConfig, MlpKind, ModelConfig, RopeParams,
    ScoringFunc, VisionConfig, VisionFamily, Yarn, V41, V4_SENTINEL_BASE,
};
use crate::engram::{EngramLayout, EngramParams};

/// Every preset [`preset`] knows, in the order error messages list them.
pub const PRESETS: &[&str] = &[
    "tiny",
    "tiny-gguf",
    "tiny-kquant",
    "bench",
    "bench-bf16",
    "big",
    "flash-slice",
    "tiny-v41",
    "bench-v41",
    "tiny-v41-vision",
    "tiny-v4-vision",
    "vision-v41",
];

/// A named model shape. The shape is a [`ModelConfig`], the same type a loaded checkpoint
/// gets, so presets cannot describe anything the engine would read differently.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    pub name: String,
    pub config: ModelConfig,
    /// How the dense projections are stored (the routed experts are always FP4).
    pub dense: DenseFormat,
}

/// The storage of the dense projections (attention, shared expert).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseFormat {
    /// FP8 e4m3 with 128×128 E8M0 block scales, as shipped.
    Fp8,
    /// BF16: what llama.cpp's converter takes next to FP4 experts, so both engines can run
    /// the very same numbers.
    Bf16,
}

/// The real tokenizer's vocabulary, so synthetic checkpoints run on real text.
const VOCAB: usize = 129_280;

/// Layer kinds from a shipped-style ratio list (0 = SWA, 4 = CSA, other = HCA).
fn kinds(ratios: &[usize]) -> Vec<AttnKind> {
    ratios
        .iter()
        .map(|&r| match r {
            0 => AttnKind::Sliding,
            4 => AttnKind::Csa,
            _ => AttnKind::Hca,
        })
        .collect()
}

/// The first `hash` of `layers` layers route by token id, the rest by score.
fn mlp_kinds(layers: usize, hash: usize) -> Vec<MlpKind> {
    (0..layers)
        .map(|l| {
            if l < hash {
                MlpKind::Hash
            } else {
                MlpKind::Scored
            }
        })
        .collect()
}

/// `tiny`'s widths (its layers aside), which `tiny-v41` shares.
fn tiny_widths() -> ModelConfig {
    ModelConfig {
        hidden_size: 128,
        num_attention_heads: 2,
        head_dim: 128,
        q_lora_rank: 128,
        o_groups: 2,
        o_lora_rank: 64,
        sliding_window: 16,
        index_n_heads: 16,
        // Strictly wider than the rope slice (docs/MODEL.md §10.1), unlike a 64-wide indexer head.
        index_head_dim: 128,
        index_topk: 4,
        n_routed_experts: 8,
        num_experts_per_tok: 2,
        moe_intermediate_size: 64,
        max_position_embeddings: 65536,
        ..flash_like()
    }
}

/// `bench`'s widths (its layers aside), which `bench-v41` shares: V4-Flash scaled to this
/// machine.
fn bench_widths() -> ModelConfig {
    ModelConfig {
        hidden_size: 2048,
        num_attention_heads: 16,
        q_lora_rank: 512,
        o_groups: 4,
        o_lora_rank: 512,
        index_n_heads: 16,
        n_routed_experts: 64,
        moe_intermediate_size: 768,
        ..flash_like()
    }
}

/// V4-Flash's settings; presets change only the shape.
fn flash_like() -> ModelConfig {
    let ratios: Vec<usize> = [0, 0]
        .into_iter()
        .chain((2..43).map(|l| if l % 2 == 0 { 4 } else { 128 }))
        .collect();
    ModelConfig {
        vocab_size: VOCAB,
        hidden_size: 4096,
        num_hidden_layers: ratios.len(),
        num_attention_heads: 64,
        head_dim: 512,
        qk_rope_head_dim: 64,
        q_lora_rank: 1024,
        o_groups: 8,
        o_lora_rank: 1024,
        sliding_window: 128,
        layer_types: kinds(&ratios),
        compress_rate_csa: 4,
        compress_rate_hca: 128,
        mlp_layer_types: mlp_kinds(ratios.len(), 3),
        index_n_heads: 64,
        index_head_dim: 128,
        index_topk: 512,
        n_routed_experts: 256,
        num_experts_per_tok: 6,
        n_shared_experts: 1,
        moe_intermediate_size: 2048,
        scoring_func: ScoringFunc::SqrtSoftplus,
        norm_topk_prob: true,
        routed_scaling_factor: 1.5,
        swiglu_limit: 10.0,
        hc_mult: 4,
        hc_sinkhorn_iters: 20,
        hc_eps: 1e-6,
        rms_norm_eps: 1e-6,
        rope_main: RopeParams {
            theta: 10000.0,
            yarn: None,
        },
        rope_compress: RopeParams {
            theta: 160000.0,
            yarn: Some(Yarn {
                factor: 16.0,
                original_max_position_embeddings: 65536.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
            }),
        },
        max_position_embeddings: 1_048_576,
        num_nextn_predict_layers: 1,
        bos_token_id: Some(0),
        eos_token_ids: vec![1],
        numerics: Default::default(),
        v41: None,
        dspark: None,
        vision: None,
    }
}

/// The real V4 tokenizer's compressed vocabulary (docs/MODEL.md §8.6): what the hash multipliers of
/// a synthetic V4.1 checkpoint, which ships that tokenizer, are drawn for.
const COMPRESSED_VOCAB: usize = 99_092;

/// V4.1-Flash's settings (docs/MODEL.md §1.1) over a schedule of `ratios` with the given sources, and
/// Engram on `engram_layers` with tables of about `24 · engram_vocab` rows.
fn v41_like(
    base: ModelConfig,
    ratios: &[usize],
    kv: &[usize],
    index: &[usize],
    candidates: Candidates,
    engram_layers: &[usize],
    engram_vocab: usize,
) -> ModelConfig {
    let (max_ngram, heads, head_dim) = (4, 8, 256.min(base.hidden_size / 4));
    let params = EngramParams {
        layer_ids: engram_layers.to_vec(),
        engram_vocab_size: engram_vocab as u64,
        compressed_vocab_size: COMPRESSED_VOCAB,
        max_ngram,
        n_heads: heads,
        pad_token_id: 2,
    };
    // The rows follow from the primes, which do not depend on the pad's id.
    let layout = EngramLayout::with_pad_id(&params, 0).expect("preset Engram layouts are valid");
    ModelConfig {
        num_hidden_layers: ratios.len(),
        layer_types: ratios
            .iter()
            .map(|&r| {
                if r == 0 {
                    AttnKind::Sliding
                } else {
                    AttnKind::Shared
                }
            })
            .collect(),
        mlp_layer_types: mlp_kinds(ratios.len(), 0),
        num_nextn_predict_layers: 0,
        v41: Some(V41 {
            compress_ratios: ratios.to_vec(),
            kv_source_layer_ids: kv.to_vec(),
            index_source_layer_ids: index.to_vec(),
            candidates: Some(candidates),
            engram: Some(EngramConfig {
                layer_ids: engram_layers.to_vec(),
                num_embeddings: layout
                    .rows_per_layer()
                    .iter()
                    .map(|&r| r as usize)
                    .collect(),
                max_ngram_size: max_ngram,
                vocab_size: engram_vocab,
                n_heads: heads,
                head_dim,
                compressed_vocab_size: COMPRESSED_VOCAB,
                pad_token_id: 2,
            }),
            image_token_id: Some(129_264),
        }),
        ..base
    }
}

/// Looks a preset up by name.
///
/// * `tiny`: every layer kind and both router kinds at toy width (SWA, CSA, HCA m=8, CSA; two
///   hash layers) with the real vocabulary; tens of MB, written in about a second.
/// * `tiny-gguf`: `tiny` with HCA at m=128, the ratios llama.cpp's GGUF converter takes.
/// * `tiny-kquant`: `tiny-gguf` with 256-wide rows (hidden, q-LoRA, output LoRA, experts):
///   every matrix whose shape allows it a whole number of K-quant super-blocks, so that
///   llama.cpp's quantizer writes K-quants rather than its 32-block fallbacks.
/// * `bench`: V4-Flash's architecture at a width this machine can run (hidden 2048, 12 layers,
///   64 experts) plus its MTP block, about 3.5 GB; the shape performance numbers are quoted
///   for, so keep it fixed.
/// * `bench-bf16`: `bench` with BF16 dense projections (experts still FP4), the layout the
///   side-by-side comparison with llama.cpp loads into both engines; without the MTP block
///   the others carry (llama.cpp's converter has no names for V4's `mtp.*`).
/// * `big`: `bench`'s width with V4-Flash's 256 experts over 16 layers, about 12.5 GB, of
///   which 10 GB routed experts: V4-Flash's proportions (the experts ~85 % of the bytes) at a
///   size this machine can hold on disk, for streaming experts from disk under a memory
///   budget smaller than the model.
/// * `flash-slice`: V4-Flash's exact per-layer shapes (hidden 4096, 64 heads × 512, q-LoRA
///   1024, 8 output groups × 1024, indexer 64 × 128, experts 2048 wide, the real vocabulary
///   and BF16 head) over 6 layers (SWA, SWA, CSA, HCA, CSA, HCA; the first three hash-routed)
///   with 16 experts each and the MTP block, about 4.7 GB: the real model's product shapes
///   and share of bytes per format, at a size this machine holds.
/// * `tiny-v41`: DeepSeek-V4.1 (docs/MODEL.md §8) at `tiny`'s width in docs/MODEL.md §10.3's shape: ratios
///   0, 2, 2, 1, 1, kv sources 1 and 3, index sources 1, 3, 4, the candidate source 3, Engram
///   on layers 1 and 3 (8 heads × 32, n-grams up to 4, ~1 MB tables), hc 2.
/// * `bench-v41`: V4.1-Flash's proportions at `bench`'s width over 12 layers (window-only,
///   window-only, four at ratio 2, six at ratio 1; kv sources 2 and 6, index sources 2, 6, 8,
///   10, candidates from 6), Engram on layers 1 and 5 with 8 heads × 256 and tables of 4.1 M
///   rows (~1.1 GB each: like the real ~100 GB tables, larger than the rest of a layer).
/// * `tiny-v41-vision`: `tiny-v41` with a tiny V4.1 vision tower (2 blocks of 64, patch 14,
///   3×3 aligner, 64 tokens an image): images through the server on the real vocabulary.
/// * `tiny-v4-vision`: `tiny` with the same tiny tower as V4-Flash-Vision-Exp's (flat
///   `vision_*` keys, sentinel ids, `gate.bias_vl` on every MoE layer, hash layers included).
/// * `vision-v41`: `tiny-v41` with V4.1-Flash's tower at its real widths (32 blocks of 1024,
///   16 heads, MLP 2816; ~0.85 GB): what `bench vision` times.
pub fn preset(name: &str) -> Result<SynthSpec, SynthError> {
    let dense = if name == "bench-bf16" {
        DenseFormat::Bf16
    } else {
        DenseFormat::Fp8
    };
    let mut config = match name {
        "tiny" => tiny(),
        "tiny-gguf" => tiny_gguf(),
        "tiny-kquant" => ModelConfig {
            hidden_size: 256,
            q_lora_rank: 256,
            o_lora_rank: 256,
            moe_intermediate_size: 256,
            ..tiny_gguf()
        },
        "bench" | "bench-bf16" | "big" => bench(name == "big"),
        "tiny-v41" => tiny_v41(),
        "tiny-v41-vision" => with_tower(tiny_v41(), tiny_tower()),
        "tiny-v4-vision" => with_tower(
            tiny(),
            VisionConfig {
                family: VisionFamily::V4,
                ..tiny_tower()
            },
        ),
        "vision-v41" => with_tower(tiny_v41(), v41_flash_tower()),
        "bench-v41" => bench_v41(),
        "flash-slice" => flash_slice(),
        other => {
            return Err(SynthError::UnknownPreset {
                name: other.to_string(),
                known: PRESETS.join(", "),
            })
        }
    };
    if dense == DenseFormat::Bf16 {
        config.num_nextn_predict_layers = 0;
    }
    Ok(SynthSpec {
        name: name.to_string(),
        config,
        dense,
    })
}

/// `tiny`: SWA, CSA, HCA, CSA at toy widths.
fn tiny() -> ModelConfig {
    let ratios = [0, 4, 8, 4];
    ModelConfig {
        num_hidden_layers: ratios.len(),
        layer_types: kinds(&ratios),
        compress_rate_hca: 8,
        mlp_layer_types: mlp_kinds(ratios.len(), 2),
        ..tiny_widths()
    }
}

/// `tiny` with the compress ratios llama.cpp's converter and `deepseek4` accept (0, 4 and
/// 128 only): what tools/gguf_e2e.sh converts to GGUF. Its indexer keeps 64 entries, so
/// prompts up to 256 tokens attend to every compressed entry (which entries a top-k picks
/// among near ties is compared apart from the arithmetic).
fn tiny_gguf() -> ModelConfig {
    let ratios = [0, 4, 128, 4];
    ModelConfig {
        index_topk: 64,
        num_hidden_layers: ratios.len(),
        layer_types: kinds(&ratios),
        compress_rate_hca: 128,
        mlp_layer_types: mlp_kinds(ratios.len(), 2),
        ..tiny_widths()
    }
}

/// `bench` (and its BF16 twin), or `big`: 2 SWA layers, then CSA/HCA alternating from CSA,
/// as in V4-Flash.
fn bench(big: bool) -> ModelConfig {
    let layers = if big { 16 } else { 12 };
    let ratios: Vec<usize> = [0, 0]
        .into_iter()
        .chain((2..layers).map(|l| if l % 2 == 0 { 4 } else { 128 }))
        .collect();
    ModelConfig {
        num_hidden_layers: ratios.len(),
        layer_types: kinds(&ratios),
        mlp_layer_types: mlp_kinds(ratios.len(), 3),
        n_routed_experts: if big { 256 } else { 64 },
        ..bench_widths()
    }
}

/// The tiny presets' tower: two blocks of 64 (4 heads), V4.1's patch and downsampling, a
/// budget of 64 tokens an image.
fn tiny_tower() -> VisionConfig {
    VisionConfig {
        n_layers: 2,
        dim: 64,
        n_heads: 4,
        inter_dim: 96,
        max_n_token: 64,
        min_pixels: 3136,
        ..v41_flash_tower()
    }
}

/// V4.1-Flash's `vision_config` (docs/MODEL.md §8.9).
fn v41_flash_tower() -> VisionConfig {
    VisionConfig {
        family: VisionFamily::V41,
        n_layers: 32,
        dim: 1024,
        n_heads: 16,
        inter_dim: 2816,
        patch_size: 14,
        rope_theta: 10_000.0,
        downsample_ratio: 3,
        max_n_token: 1024,
        min_pixels: 295_936,
        max_wh_ratio: None,
        sentinel_base: V4_SENTINEL_BASE,
    }
}

/// `c` with the vision tower `v` beside it.
fn with_tower(c: ModelConfig, v: VisionConfig) -> ModelConfig {
    ModelConfig {
        vision: Some(v),
        ..c
    }
}

/// `tiny-v41`: the tiny V4.1 topology (docs/MODEL.md §10.3).
fn tiny_v41() -> ModelConfig {
    let base = ModelConfig {
        hc_mult: 2,
        ..tiny_widths()
    };
    let cand = Candidates {
        source_layer: 3,
        topk_blocks: 4,
        block_size: 2,
    };
    v41_like(
        base,
        &[0, 2, 2, 1, 1],
        &[1, 3],
        &[1, 3, 4],
        cand,
        &[1, 3],
        600,
    )
}

/// `bench-v41`: V4.1-Flash's proportions at bench's width, with its DSpark drafter.
fn bench_v41() -> ModelConfig {
    let base = bench_widths();
    let cand = Candidates {
        source_layer: 6,
        topk_blocks: 256,
        block_size: 8,
    };
    let ratios = [0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1];
    let v41 = v41_like(
        base,
        &ratios,
        &[2, 6],
        &[2, 6, 8, 10],
        cand,
        &[1, 5],
        170_000,
    );
    // V4.1's drafter: the streams entering the last three layers, stages with a
    // third of the experts, top 3 (128 of 384 in V4.1-Flash).
    ModelConfig {
        num_nextn_predict_layers: 3,
        dspark: Some(DsparkConfig {
            target_layer_ids: vec![9, 10, 11],
            aux_layers: vec![9, 10, 11],
            block_size: 5,
            noise_token_id: 128_799,
            markov_rank: 256,
            stages: 3,
            n_routed_experts: 21,
            num_experts_per_tok: 3,
        }),
        ..v41
    }
}

/// `flash-slice`: V4-Flash's per-layer shapes, six layers.
fn flash_slice() -> ModelConfig {
    let ratios = [0, 0, 4, 128, 4, 128];
    ModelConfig {
        num_hidden_layers: ratios.len(),
        layer_types: kinds(&ratios),
        mlp_layer_types: mlp_kinds(ratios.len(), 3),
        n_routed_experts: 16,
        ..flash_like()
    }
}

/// The keys of a V4 HF `config.json` for `c` (V4.1's text config starts from them).
fn v4_pairs(c: &ModelConfig) -> Vec<(&'static str, Value)> {
    let ratios: Vec<usize> = (0..c.num_hidden_layers)
        .map(|l| c.compress_ratio(l))
        .collect();
    let n_hash = c
        .mlp_layer_types
        .iter()
        .take_while(|k| **k == MlpKind::Hash)
        .count();
    let scoring = match c.scoring_func {
        ScoringFunc::SqrtSoftplus => "sqrtsoftplus",
        ScoringFunc::Softmax => "softmax",
        ScoringFunc::Sigmoid => "sigmoid",
    };
    vec![
        ("architectures", json!(["DeepseekV4ForCausalLM"])),
        ("model_type", json!("deepseek_v4")),
        ("vocab_size", json!(c.vocab_size)),
        ("hidden_size", json!(c.hidden_size)),
        ("num_hidden_layers", json!(c.num_hidden_layers)),
        ("num_attention_heads", json!(c.num_attention_heads)),
        ("num_key_value_heads", json!(1)),
        ("head_dim", json!(c.head_dim)),
        ("qk_rope_head_dim", json!(c.qk_rope_head_dim)),
        ("q_lora_rank", json!(c.q_lora_rank)),
        ("o_groups", json!(c.o_groups)),
        ("o_lora_rank", json!(c.o_lora_rank)),
        ("sliding_window", json!(c.sliding_window)),
        ("compress_ratios", json!(ratios)),
        ("compress_rope_theta", json!(c.rope_compress.theta)),
        ("rope_theta", json!(c.rope_main.theta)),
        ("max_position_embeddings", json!(c.max_position_embeddings)),
        ("index_n_heads", json!(c.index_n_heads)),
        ("index_head_dim", json!(c.index_head_dim)),
        ("index_topk", json!(c.index_topk)),
        ("n_routed_experts", json!(c.n_routed_experts)),
        ("num_experts_per_tok", json!(c.num_experts_per_tok)),
        ("n_shared_experts", json!(c.n_shared_experts)),
        ("moe_intermediate_size", json!(c.moe_intermediate_size)),
        ("scoring_func", json!(scoring)),
        ("topk_method", json!("noaux_tc")),
        ("norm_topk_prob", json!(c.norm_topk_prob)),
        ("routed_scaling_factor", short(c.routed_scaling_factor)),
        ("num_hash_layers", json!(n_hash)),
        ("swiglu_limit", short(c.swiglu_limit)),
        ("hc_mult", json!(c.hc_mult)),
        ("hc_sinkhorn_iters", json!(c.hc_sinkhorn_iters)),
        ("hc_eps", short(c.hc_eps)),
        ("rms_norm_eps", short(c.rms_norm_eps)),
        (
            "num_nextn_predict_layers",
            json!(c.num_nextn_predict_layers),
        ),
        ("bos_token_id", json!(c.bos_token_id)),
        (
            "eos_token_id",
            match c.eos_token_ids.as_slice() {
                [one] => json!(one),
                many => json!(many),
            },
        ),
        ("tie_word_embeddings", json!(false)),
        ("hidden_act", json!("silu")),
        ("torch_dtype", json!("bfloat16")),
        ("expert_dtype", json!("fp4")),
    ]
}

/// A V4.1 `config.json` (docs/MODEL.md §1.1): the text model's keys under `text_config`, with
/// V4.1's own, and a top level that names the architecture and the 32×32 quantisation.
fn v41_config_json(v4_pairs: Vec<(&str, Value)>, c: &ModelConfig, v: &V41) -> Value {
    let mut text: serde_json::Map<String, Value> = v4_pairs
        .into_iter()
        .filter(|(k, _)| {
            !matches!(
                *k,
                "architectures" | "quantization_config" | "num_hash_layers"
            )
        })
        .map(|(k, val)| (k.to_string(), val))
        .collect();
    text.insert("model_type".into(), json!("deepseek_v41_text"));
    text.insert("compress_ratios".into(), json!(v.compress_ratios));
    text.insert("kv_source_layer_ids".into(), json!(v.kv_source_layer_ids));
    text.insert(
        "index_source_layer_ids".into(),
        json!(v.index_source_layer_ids),
    );
    if let Some(cd) = v.candidates {
        text.insert("candidate_source_layer_id".into(), json!(cd.source_layer));
        text.insert("candidate_topk_blocks".into(), json!(cd.topk_blocks));
        text.insert("candidate_block_size".into(), json!(cd.block_size));
    }
    if let Some(e) = &v.engram {
        for (k, val) in [
            ("engram_layer_ids", json!(e.layer_ids)),
            ("engram_num_embeddings", json!(e.num_embeddings)),
            ("engram_max_ngram_size", json!(e.max_ngram_size)),
            ("engram_vocab_size", json!(e.vocab_size)),
            ("engram_n_heads", json!(e.n_heads)),
            ("engram_head_dim", json!(e.head_dim)),
            (
                "engram_compressed_vocab_size",
                json!(e.compressed_vocab_size),
            ),
            ("engram_pad_token_id", json!(e.pad_token_id)),
        ] {
            text.insert(k.into(), val);
        }
    }
    if let Some(id) = v.image_token_id {
        text.insert("image_token_id".into(), json!(id));
    }
    if let Some(y) = &c.rope_compress.yarn {
        let scaling = json!({
            "type": "yarn",
            "factor": y.factor,
            "original_max_position_embeddings": y.original_max_position_embeddings as u64,
            "beta_fast": y.beta_fast,
            "beta_slow": y.beta_slow,
        });
        text.insert("rope_scaling".into(), scaling);
    }
    let mut top = json!({
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "text_config": Value::Object(text),
        "quantization_config": {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "scale_fmt": "ue8m0",
            "weight_block_size": [32, 32],
            "expert_dtype": "fp4",
        },
    });
    if let Some(vc) = &c.vision {
        top["vision_config"] = json!({
            "num_hidden_layers": vc.n_layers,
            "hidden_size": vc.dim,
            "num_attention_heads": vc.n_heads,
            "intermediate_size": vc.inter_dim,
            "patch_size": vc.patch_size,
            "rope_theta": vc.rope_theta,
            "downsample_ratio": vc.downsample_ratio,
            "max_image_tokens": vc.max_n_token,
            "min_pixels": vc.min_pixels,
            "max_wh_ratio": vc.max_wh_ratio,
        });
    }
    top
}

/// V4-Flash-Vision-Exp's tower keys, flat beside the text model's.
fn v4_vision_pairs(vc: &VisionConfig) -> Vec<(&'static str, Value)> {
    vec![
        ("vision_n_layers", json!(vc.n_layers)),
        ("vision_dim", json!(vc.dim)),
        ("vision_n_heads", json!(vc.n_heads)),
        ("vision_inter_dim", json!(vc.inter_dim)),
        ("vision_patch_size", json!(vc.patch_size)),
        ("vision_rope_theta", json!(vc.rope_theta)),
        ("vision_downsample_ratio", json!(vc.downsample_ratio)),
        ("vision_max_n_token", json!(vc.max_n_token)),
        ("vision_min_pixels", json!(vc.min_pixels)),
        ("vision_max_wh_ratio", json!(vc.max_wh_ratio)),
    ]
}

/// An f32 setting as the shortest decimal that reads back to it (1e-6, not 9.99e-7).
fn short(x: f32) -> Value {
    json!(x
        .to_string()
        .parse::<f64>()
        .expect("f32 Display is a valid f64"))
}

impl SynthSpec {
    pub fn num_hidden_layers(&self) -> usize {
        self.config.num_hidden_layers
    }

    /// Refuses a hand-made spec the writer could not turn into a loadable checkpoint: one whose
    /// config a loader would reject, or whose FP4 experts would not split into 32-input groups.
    pub fn validate(&self) -> Result<(), SynthError> {
        let invalid = |reason: String| SynthError::InvalidSpec {
            name: self.name.clone(),
            reason,
        };
        let c = &self.config;
        if c.mlp_layer_types
            .iter()
            .skip_while(|k| **k == MlpKind::Hash)
            .any(|k| *k == MlpKind::Hash)
        {
            return Err(invalid(
                "hash-routed layers must come first: shipped configs can only say how many".into(),
            ));
        }
        let reread = ModelConfig::from_json_str(&self.config_json().to_string())
            .map_err(|e| invalid(e.to_string()))?;
        if reread.layer_types != c.layer_types || reread.mlp_layer_types != c.mlp_layer_types {
            return Err(invalid(
                "the layer schedule does not survive config.json (a CSA ratio other than 4?)"
                    .into(),
            ));
        }
        if reread.vision != c.vision {
            return Err(invalid(
                "the vision tower does not survive config.json".into(),
            ));
        }
        if reread.dspark != c.dspark {
            return Err(invalid(
                "the DSpark drafter does not survive config.json".into(),
            ));
        }
        for (field, v) in [
            ("hidden_size", c.hidden_size),
            ("moe_intermediate_size", c.moe_intermediate_size),
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
        let c = &self.config;
        let mut pairs = v4_pairs(c);
        if let Some(dc) = &c.dspark {
            pairs.extend([
                ("dspark_target_layer_ids", json!(dc.target_layer_ids)),
                ("dspark_block_size", json!(dc.block_size)),
                ("dspark_noise_token_id", json!(dc.noise_token_id)),
                ("dspark_markov_rank", json!(dc.markov_rank)),
                ("dspark_n_routed_experts", json!(dc.n_routed_experts)),
                ("dspark_num_experts_per_tok", json!(dc.num_experts_per_tok)),
            ]);
        }
        if self.dense == DenseFormat::Fp8 {
            pairs.push((
                "quantization_config",
                json!({
                    "quant_method": "fp8",
                    "activation_scheme": "dynamic",
                    "fmt": "e4m3",
                    "scale_fmt": "ue8m0",
                    "weight_block_size": [128, 128],
                }),
            ));
        }
        if let Some(vc) = c.vision.as_ref().filter(|v| v.family == VisionFamily::V4) {
            pairs.extend(v4_vision_pairs(vc));
        }
        if let Some(v) = &c.v41 {
            return v41_config_json(pairs, c, v);
        }
        if let Some(y) = &c.rope_compress.yarn {
            let scaling = json!({
                "type": "yarn",
                "rope_type": "yarn",
                "factor": y.factor,
                // An integer, as shipped configs write it.
                "original_max_position_embeddings": y.original_max_position_embeddings as u64,
                "beta_fast": y.beta_fast,
                "beta_slow": y.beta_slow,
            });
            pairs.push(("rope_scaling", scaling));
        }
        Value::Object(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }
}
