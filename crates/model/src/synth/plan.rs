//! The tensor inventory of a synthetic checkpoint: official names, dtypes and shapes
//! (docs/MODEL.md §4.1), plus how each tensor's values are drawn.

use safetensors::Dtype;

use crate::config::{AttnKind, DsparkConfig, MlpKind, ModelConfig, VisionFamily};

/// How a tensor's values are drawn before they are rounded onto its storage format.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    Normal {
        mean: f32,
        std: f32,
    },
    Uniform {
        lo: f32,
        hi: f32,
    },
    /// `tid2eid`: each row holds distinct expert ids below `n_experts`.
    ExpertIds {
        n_experts: usize,
    },
    /// The E8M0 block scales of the FP8/FP4 weight planned just before this tensor; they are
    /// derived from that weight's values, which is why the pair is always written together.
    Scale,
}

/// One stored tensor. FP4 weights have their packed `I8` shape `[out, in/2]`.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub init: Init,
    /// `[rows, cols]` of an FP8 weight's scale blocks (128×128 for V4, 32×32 for V4.1, 1×32
    /// for V4.1's Engram tables); unused otherwise.
    pub block: [usize; 2],
}

impl PlannedTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn byte_len(&self) -> u64 {
        (self.numel() * self.dtype.bitsize() / 8) as u64
    }

    /// `[rows, logical columns]` of the values drawn for it: the last dimension is unpacked
    /// for FP4, and vectors are one row.
    pub fn logical_rows_cols(&self) -> (usize, usize) {
        let last = self.shape.last().copied().unwrap_or(1);
        let rows = self.numel().checked_div(last).unwrap_or(0);
        let cols = if self.dtype == Dtype::I8 {
            2 * last
        } else {
            last
        };
        (rows, cols)
    }
}

/// Std of a projection's weights: keeps `W·x` at unit scale for unit-RMS `x`, which every
/// projection input is (they follow an RMSNorm or a normalised mixture).
fn fan_in(n: usize) -> Init {
    Init::Normal {
        mean: 0.0,
        std: 1.0 / (n as f32).sqrt(),
    }
}

const NORM: Init = Init::Normal {
    mean: 1.0,
    std: 0.1,
};

struct Planner {
    out: Vec<PlannedTensor>,
    dense: super::DenseFormat,
    /// The dense projections' FP8 scale blocks (square).
    fp8_block: usize,
}

impl Planner {
    fn push(&mut self, name: String, dtype: Dtype, shape: &[usize], init: Init) {
        self.out.push(PlannedTensor {
            name,
            dtype,
            shape: shape.to_vec(),
            init,
            block: [self.fp8_block; 2],
        });
    }

    fn bf16(&mut self, name: String, shape: &[usize], init: Init) {
        self.push(name, Dtype::BF16, shape, init);
    }

    fn f32(&mut self, name: String, shape: &[usize], init: Init) {
        self.push(name, Dtype::F32, shape, init);
    }

    /// A dense projection: FP8 e4m3 weight `[out, in]` + E8M0 scale
    /// `[ceil(out/b), ceil(in/b)]` for the spec's block `b`, or BF16 for
    /// [`super::DenseFormat::Bf16`] specs.
    fn fp8(&mut self, stem: &str, out: usize, inp: usize) {
        if self.dense == super::DenseFormat::Bf16 {
            self.bf16(format!("{stem}.weight"), &[out, inp], fan_in(inp));
            return;
        }
        let b = self.fp8_block;
        self.fp8_blocks(stem, [out, inp], [b, b], fan_in(inp));
    }

    /// An FP8 weight with `block`-sized scale blocks, whatever the spec's dense format.
    fn fp8_blocks(&mut self, stem: &str, shape: [usize; 2], block: [usize; 2], init: Init) {
        self.push(format!("{stem}.weight"), Dtype::F8_E4M3, &shape, init);
        self.out.last_mut().expect("just pushed").block = block;
        let scale = [shape[0].div_ceil(block[0]), shape[1].div_ceil(block[1])];
        self.push(format!("{stem}.scale"), Dtype::F8_E8M0, &scale, Init::Scale);
    }

    /// V4.1's Engram on layer `l` (docs/MODEL.md §8.6): the n-gram table (FP8 rows with a scale per
    /// 32 columns, as shipped), the key/value projection and the gate's two weights.
    fn engram(&mut self, s: &ModelConfig, l: usize) {
        let Some(e) = s.v41.as_ref().and_then(|v| v.engram.as_ref()) else {
            return;
        };
        let Some(k) = e.layer_ids.iter().position(|&x| x == l) else {
            return;
        };
        let (hc, d) = (s.hc_mult, s.hidden_size);
        let p = format!("layers.{l}.engram");
        let unit = Init::Normal {
            mean: 0.0,
            std: 1.0,
        };
        self.fp8_blocks(
            &format!("{p}.embed"),
            [e.num_embeddings[k], e.head_dim],
            [1, 32],
            unit,
        );
        let cols = (e.max_ngram_size - 1) * e.n_heads * e.head_dim;
        self.fp8(&format!("{p}.wkv"), (hc + 1) * d, cols);
        self.bf16(format!("{p}.q_weight"), &[hc, d], NORM);
        self.bf16(format!("{p}.k_weight"), &[hc, d], NORM);
    }

    /// FP4 e2m1 weight packed as I8 `[out, in/2]` + E8M0 scale `[out, in/32]`.
    fn fp4(&mut self, stem: &str, out: usize, inp: usize) {
        self.push(
            format!("{stem}.weight"),
            Dtype::I8,
            &[out, inp / 2],
            fan_in(inp),
        );
        self.push(
            format!("{stem}.scale"),
            Dtype::F8_E8M0,
            &[out, inp / 32],
            Init::Scale,
        );
    }

    /// mHC parameters: `fn [(2+hc)·hc, hc·D]`, `base`, `scale [3]` (or `[1]` for the head).
    fn hyper(&mut self, p: &str, rows: usize, s: &ModelConfig, scales: usize) {
        let hc_d = s.hc_mult * s.hidden_size;
        self.f32(format!("{p}_fn"), &[rows, hc_d], fan_in(hc_d));
        let base = Init::Normal {
            mean: 0.0,
            std: 0.1,
        };
        self.f32(format!("{p}_base"), &[rows], base);
        let scale = Init::Uniform { lo: 0.8, hi: 1.2 };
        self.f32(format!("{p}_scale"), &[scales], scale);
    }

    /// A compressor of `ratio` producing `dim`-wide entries; overlapping (CSA) ones project
    /// to twice the width.
    fn compressor(&mut self, p: &str, s: &ModelConfig, ratio: usize, dim: usize, overlap: bool) {
        let d = s.hidden_size;
        let width = if overlap { 2 * dim } else { dim };
        self.bf16(format!("{p}.wkv.weight"), &[width, d], fan_in(d));
        self.bf16(format!("{p}.wgate.weight"), &[width, d], fan_in(d));
        let ape = Init::Normal {
            mean: 0.0,
            std: 0.1,
        };
        self.f32(format!("{p}.ape"), &[ratio, width], ape);
        self.bf16(format!("{p}.norm.weight"), &[dim], NORM);
    }

    /// What a V4.1 layer adds by its role (docs/MODEL.md §8.3-5): a kv source's compressor (a gate for
    /// ratio 2 only, no `ape`) and, as it indexes, the key projection; an index source's
    /// query projection and head weights.
    fn v41_attention(&mut self, s: &ModelConfig, l: usize) {
        let Some(v) = &s.v41 else { return };
        let (d, hd, ihd) = (s.hidden_size, s.head_dim, s.index_head_dim);
        let a = format!("layers.{l}.attn");
        if v.kv_source(l) == Some(l) {
            let c = format!("{a}.compressor");
            self.bf16(format!("{c}.wkv.weight"), &[hd, d], fan_in(d));
            if v.compress_ratios[l] > 1 {
                self.bf16(format!("{c}.wgate.weight"), &[hd, d], fan_in(d));
            }
            self.bf16(format!("{c}.norm.weight"), &[hd], NORM);
            self.bf16(format!("{a}.indexer.wk.weight"), &[ihd, hd], fan_in(hd));
            self.bf16(format!("{a}.indexer.k_norm.weight"), &[ihd], NORM);
        }
        if v.index_source(l) == Some(l) {
            let ix = format!("{a}.indexer");
            self.fp8(&format!("{ix}.wq_b"), s.index_n_heads * ihd, s.q_lora_rank);
            self.bf16(
                format!("{ix}.weights_proj.weight"),
                &[s.index_n_heads, d],
                fan_in(d),
            );
        }
    }

    /// The MTP draft block (docs/MODEL.md §7.1): input projections and norms, a full block, its own
    /// hyper head and norm (the embedding and head are the main ones).
    fn mtp(&mut self, s: &ModelConfig) {
        let d = s.hidden_size;
        self.fp8("mtp.0.e_proj", d, d);
        self.fp8("mtp.0.h_proj", d, d);
        for n in ["enorm", "hnorm", "norm"] {
            self.bf16(format!("mtp.0.{n}.weight"), &[d], NORM);
        }
        self.hyper("mtp.0.hc_head", s.hc_mult, s, 1);
        self.layer(s, "mtp.0", AttnKind::Sliding, MlpKind::Scored);
    }

    /// The DSpark drafter (docs/MODEL.md §7.2): `main_proj`/`main_norm` under `mtp.0`, window-only
    /// stages with their own expert counts, and the head stack under the last stage (V4's
    /// hyper head; the Markov factors; the confidence projection).
    fn dspark(&mut self, s: &ModelConfig, dc: &DsparkConfig) {
        let (d, v, r) = (s.hidden_size, s.vocab_size, dc.markov_rank);
        self.fp8("mtp.0.main_proj", d, dc.aux_layers.len() * d);
        self.bf16("mtp.0.main_norm.weight".into(), &[d], NORM);
        let mut stage = s.clone();
        stage.n_routed_experts = dc.n_routed_experts;
        stage.num_experts_per_tok = dc.num_experts_per_tok;
        for i in 0..dc.stages {
            self.layer(
                &stage,
                &format!("mtp.{i}"),
                AttnKind::Sliding,
                MlpKind::Scored,
            );
        }
        let last = format!("mtp.{}", dc.stages - 1);
        self.bf16(format!("{last}.norm.weight"), &[d], NORM);
        if s.v41.is_none() {
            self.hyper(&format!("{last}.hc_head"), s.hc_mult, s, 1);
        }
        let unit = Init::Normal {
            mean: 0.0,
            std: 1.0,
        };
        self.bf16(format!("{last}.markov_head.embed.weight"), &[v, r], unit);
        self.bf16(
            format!("{last}.markov_head.head.weight"),
            &[v, r],
            fan_in(r),
        );
        let proj = fan_in(d + r);
        self.f32(
            format!("{last}.confidence_head.proj.weight"),
            &[1, d + r],
            proj,
        );
    }

    /// A decoder block under `p` (`layers.N`, or `mtp.N` for a drafter's block, which is
    /// sliding-window and score-routed).
    fn layer(&mut self, s: &ModelConfig, p: &str, kind: AttnKind, mlp: MlpKind) {
        let (d, h, hd) = (s.hidden_size, s.num_attention_heads, s.head_dim);
        let hc_rows = (2 + s.hc_mult) * s.hc_mult;
        self.bf16(format!("{p}.attn_norm.weight"), &[d], NORM);
        self.bf16(format!("{p}.ffn_norm.weight"), &[d], NORM);
        self.hyper(&format!("{p}.hc_attn"), hc_rows, s, 3);
        self.hyper(&format!("{p}.hc_ffn"), hc_rows, s, 3);

        let a = format!("{p}.attn");
        self.fp8(&format!("{a}.wq_a"), s.q_lora_rank, d);
        self.bf16(format!("{a}.q_norm.weight"), &[s.q_lora_rank], NORM);
        self.fp8(&format!("{a}.wq_b"), h * hd, s.q_lora_rank);
        self.fp8(&format!("{a}.wkv"), hd, d);
        self.bf16(format!("{a}.kv_norm.weight"), &[hd], NORM);
        let sink = Init::Normal {
            mean: 0.0,
            std: 1.0,
        };
        self.f32(format!("{a}.attn_sink"), &[h], sink);
        let o = s.o_groups * s.o_lora_rank;
        self.fp8(&format!("{a}.wo_a"), o, h * hd / s.o_groups);
        self.fp8(&format!("{a}.wo_b"), d, o);
        match kind {
            AttnKind::Sliding => {}
            AttnKind::Csa => {
                let m = s.compress_rate_csa;
                self.compressor(&format!("{a}.compressor"), s, m, hd, true);
                let ix = format!("{a}.indexer");
                let ihd = s.index_head_dim;
                self.fp8(&format!("{ix}.wq_b"), s.index_n_heads * ihd, s.q_lora_rank);
                self.bf16(
                    format!("{ix}.weights_proj.weight"),
                    &[s.index_n_heads, d],
                    fan_in(d),
                );
                self.compressor(&format!("{ix}.compressor"), s, m, ihd, true);
            }
            AttnKind::Hca => {
                let m = s.compress_rate_hca;
                self.compressor(&format!("{a}.compressor"), s, m, hd, false);
            }
            // Depends on the layer's place among the sources: `v41_attention`.
            AttnKind::Shared => {}
        }

        let f = format!("{p}.ffn");
        let (e, inter) = (s.n_routed_experts, s.moe_intermediate_size);
        self.bf16(format!("{f}.gate.weight"), &[e, d], fan_in(d));
        if mlp == MlpKind::Hash {
            let ids = Init::ExpertIds { n_experts: e };
            let shape = [s.vocab_size, s.num_experts_per_tok];
            self.push(format!("{f}.gate.tid2eid"), Dtype::I64, &shape, ids);
        } else {
            let bias = Init::Normal {
                mean: 0.0,
                std: 0.1,
            };
            self.f32(format!("{f}.gate.bias"), &[e], bias);
        }
        // V4-Flash-Vision-Exp routes its image positions by their own bias, on every layer.
        if s.vision
            .as_ref()
            .is_some_and(|v| v.family == VisionFamily::V4)
        {
            let bias = Init::Normal {
                mean: 0.0,
                std: 0.5,
            };
            self.f32(format!("{f}.gate.bias_vl"), &[e], bias);
        }
        for i in 0..e {
            let x = format!("{f}.experts.{i}");
            self.fp4(&format!("{x}.w1"), inter, d);
            self.fp4(&format!("{x}.w2"), d, inter);
            self.fp4(&format!("{x}.w3"), inter, d);
        }
        if s.n_shared_experts > 0 {
            let si = inter * s.n_shared_experts;
            let x = format!("{f}.shared_experts");
            self.fp8(&format!("{x}.w1"), si, d);
            self.fp8(&format!("{x}.w2"), d, si);
            self.fp8(&format!("{x}.w3"), si, d);
        }
    }
}

/// Every tensor the checkpoint holds, in file order (scales right after their weights).
/// The embedding is drawn at unit scale like a trained one; every stream is RMS-normalised
/// before use, so only relative scales matter for the forward pass.
pub fn tensor_plan(spec: &super::SynthSpec) -> Vec<PlannedTensor> {
    let s = &spec.config;
    let mut p = Planner {
        out: Vec::new(),
        dense: spec.dense,
        // V4.1 quantises with 32×32 blocks (docs/MODEL.md §8.8), V4 with 128×128.
        fp8_block: if s.v41.is_some() { 32 } else { 128 },
    };
    let (v, d) = (s.vocab_size, s.hidden_size);
    let unit = Init::Normal {
        mean: 0.0,
        std: 1.0,
    };
    p.bf16("embed.weight".into(), &[v, d], unit);
    for l in 0..s.num_hidden_layers {
        p.layer(
            s,
            &format!("layers.{l}"),
            s.layer_types[l],
            s.mlp_layer_types[l],
        );
        p.v41_attention(s, l);
        p.engram(s, l);
    }
    p.bf16("norm.weight".into(), &[d], NORM);
    if s.v41.is_none() {
        p.hyper("hc_head", s.hc_mult, s, 1);
    }
    p.bf16("head.weight".into(), &[v, d], fan_in(d));
    // The `mtp.*` names hold one drafter: DSpark's stages where the config announces them.
    match &s.dspark {
        Some(dc) => p.dspark(s, dc),
        None if s.num_nextn_predict_layers > 0 => p.mtp(s),
        None => {}
    }
    if let Some(vc) = &s.vision {
        p.vision(vc, d);
    }
    p.out
}

/// A bias or another small additive vector.
const SMALL: Init = Init::Normal {
    mean: 0.0,
    std: 0.02,
};

impl Planner {
    /// The vision tower as the checkpoints name it (BF16; the delimiter vectors F32):
    /// ViT, aligner to the decoder's width `d`, and the span's learned vectors.
    fn vision(&mut self, vc: &crate::config::VisionConfig, d: usize) {
        let (w, i, r2) = (vc.dim, vc.inter_dim, vc.downsample_ratio.pow(2));
        let patch = vc.patch_values();
        self.bf16(
            "vision.patch_embed.proj.weight".into(),
            &[w, patch],
            fan_in(patch),
        );
        self.bf16("vision.patch_embed.proj.bias".into(), &[w], SMALL);
        for b in 0..vc.n_layers {
            let n = |x: &str| format!("vision.blocks.{b}.{x}");
            self.bf16(n("norm1.weight"), &[w], NORM);
            self.bf16(n("attn.wqkv.weight"), &[3 * w, w], fan_in(w));
            self.bf16(n("attn.wqkv.bias"), &[3 * w], SMALL);
            self.bf16(n("attn.wo.weight"), &[w, w], fan_in(w));
            self.bf16(n("attn.wo.bias"), &[w], SMALL);
            self.bf16(n("norm2.weight"), &[w], NORM);
            self.bf16(n("mlp.w1.weight"), &[2 * i, w], fan_in(w));
            self.bf16(n("mlp.w2.weight"), &[w, i], fan_in(i));
        }
        self.bf16("vision.norm.weight".into(), &[w], NORM);
        self.bf16("aligner.w1.weight".into(), &[d, w * r2], fan_in(w * r2));
        self.bf16("aligner.w1.bias".into(), &[d], SMALL);
        self.bf16("aligner.w2.weight".into(), &[d, d], fan_in(d));
        self.bf16("aligner.w2.bias".into(), &[d], SMALL);
        let unit = Init::Normal {
            mean: 0.0,
            std: 1.0,
        };
        for v in ["image_start", "image_end", "image_newline"] {
            self.f32(v.into(), &[d], unit);
        }
        if vc.family == crate::config::VisionFamily::V4 {
            self.f32("image_pad".into(), &[d], unit);
        }
    }
}
