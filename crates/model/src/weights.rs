//! The model's weights, gathered from a checkpoint by their official names and shapes.
//!
//! Matrices stay in their stored format ([`QMatrix`]: FP8 blocks, FP4 groups, BF16, F32) and
//! the kernels compute on them directly; only small vectors (norm gains, biases, sinks, `ape`)
//! are widened to f32.

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{AttnKind, MlpKind, ModelConfig};
use deepinfer_kernels::matrix::QMatrix;

/// A projection `y = x · Wᵀ` with `W: [out, in]`.
#[derive(Debug)]
pub struct Linear {
    pub w: QMatrix,
}

impl Linear {
    fn load(
        ck: &Checkpoint,
        name: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Self, CheckpointError> {
        Ok(Self {
            w: ck.matrix(&format!("{name}.weight"), &[out_dim, in_dim])?,
        })
    }

    pub fn out_dim(&self) -> usize {
        self.w.rows
    }

    pub fn in_dim(&self) -> usize {
        self.w.cols
    }

    /// `x: [m, in]` → `[m, out]`.
    pub fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut y = vec![0.0f32; m * self.out_dim()];
        self.forward_into(x, m, &mut y);
        y
    }

    /// `x: [m, in]` → `y: [m, out]`.
    pub fn forward_into(&self, x: &[f32], m: usize, y: &mut [f32]) {
        crate::profile::matmul(&self.w, x, m, y);
    }
}

/// mHC parameters of one use site: `fn [(2+hc)·hc, hc·D]`, `base`, `scale [3]`.
#[derive(Debug)]
pub struct HyperWeights {
    pub fn_: Linear,
    pub base: Vec<f32>,
    pub scale: Vec<f32>,
}

#[derive(Debug)]
pub struct CompressorWeights {
    /// Window length `m` and whether windows overlap (CSA).
    pub ratio: usize,
    pub overlap: bool,
    /// Output width `c` of one entry.
    pub dim: usize,
    pub wkv: Linear,
    pub wgate: Linear,
    /// `[m, coff·c]`, added to the gate logits of slot `pos mod m`.
    pub ape: Vec<f32>,
    pub norm: Vec<f32>,
}

#[derive(Debug)]
pub struct IndexerWeights {
    pub wq_b: Linear,
    pub weights_proj: Linear,
    pub compressor: CompressorWeights,
}

#[derive(Debug)]
pub struct AttentionWeights {
    pub kind: AttnKind,
    pub wq_a: Linear,
    pub q_norm: Vec<f32>,
    pub wq_b: Linear,
    pub wkv: Linear,
    pub kv_norm: Vec<f32>,
    pub sink: Vec<f32>,
    pub wo_a: Linear,
    pub wo_b: Linear,
    pub compressor: Option<CompressorWeights>,
    pub indexer: Option<IndexerWeights>,
}

/// A SwiGLU expert: `w2 · (silu(min(w1·x, L)) ⊙ clamp(w3·x, ±L))`.
#[derive(Debug)]
pub struct ExpertWeights {
    pub w1: Linear,
    pub w2: Linear,
    pub w3: Linear,
}

#[derive(Debug)]
pub enum Routing {
    /// Frozen token → experts table, `[vocab, k]`.
    Hash(Vec<u32>),
    /// Learned top-k with a selection-only bias.
    Scored { bias: Vec<f32> },
}

#[derive(Debug)]
pub struct MoeWeights {
    pub gate: Linear,
    pub routing: Routing,
    pub experts: Vec<ExpertWeights>,
    pub shared: Option<ExpertWeights>,
}

#[derive(Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    pub hc_attn: HyperWeights,
    pub hc_ffn: HyperWeights,
    pub attn: AttentionWeights,
    pub ffn: MoeWeights,
}

#[derive(Debug)]
pub struct ModelWeights {
    /// `[vocab, D]`, rows looked up (and widened) per token.
    pub embed: QMatrix,
    pub head: Linear,
    pub norm: Vec<f32>,
    pub hc_head_fn: Linear,
    pub hc_head_base: Vec<f32>,
    pub hc_head_scale: Vec<f32>,
    pub layers: Vec<LayerWeights>,
}

fn vec1(ck: &Checkpoint, name: &str, n: usize) -> Result<Vec<f32>, CheckpointError> {
    ck.tensor_f32(name, &[n])
}

fn hyper(ck: &Checkpoint, p: &str, c: &ModelConfig) -> Result<HyperWeights, CheckpointError> {
    let hc = c.hc_mult;
    let mix = (2 + hc) * hc;
    Ok(HyperWeights {
        fn_: Linear {
            w: ck.matrix(&format!("{p}_fn"), &[mix, hc * c.hidden_size])?,
        },
        base: vec1(ck, &format!("{p}_base"), mix)?,
        scale: vec1(ck, &format!("{p}_scale"), 3)?,
    })
}

fn compressor(
    ck: &Checkpoint,
    p: &str,
    c: &ModelConfig,
    ratio: usize,
    overlap: bool,
    dim: usize,
) -> Result<CompressorWeights, CheckpointError> {
    let width = if overlap { 2 * dim } else { dim };
    Ok(CompressorWeights {
        ratio,
        overlap,
        dim,
        wkv: Linear::load(ck, &format!("{p}.wkv"), width, c.hidden_size)?,
        wgate: Linear::load(ck, &format!("{p}.wgate"), width, c.hidden_size)?,
        ape: ck.tensor_f32(&format!("{p}.ape"), &[ratio, width])?,
        norm: vec1(ck, &format!("{p}.norm.weight"), dim)?,
    })
}

fn expert(
    ck: &Checkpoint,
    p: &str,
    d: usize,
    inter: usize,
) -> Result<ExpertWeights, CheckpointError> {
    Ok(ExpertWeights {
        w1: Linear::load(ck, &format!("{p}.w1"), inter, d)?,
        w2: Linear::load(ck, &format!("{p}.w2"), d, inter)?,
        w3: Linear::load(ck, &format!("{p}.w3"), inter, d)?,
    })
}

impl ModelWeights {
    /// Loads every tensor the forward pass needs, checking each shape against `c`.
    pub fn load(ck: &Checkpoint, c: &ModelConfig) -> Result<Self, CheckpointError> {
        Self::load_with_progress(ck, c, |_, _| {})
    }

    /// Like [`Self::load`], calling `progress(done, total)` after each of the `total` steps
    /// (one per layer, then the embedding and head): a real checkpoint takes minutes to
    /// load, and a progress bar tells an operator it is moving.
    pub fn load_with_progress(
        ck: &Checkpoint,
        c: &ModelConfig,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Self, CheckpointError> {
        let total = c.num_hidden_layers + 1;
        let d = c.hidden_size;
        let hc = c.hc_mult;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let p = format!("layers.{l}");
            let kind = c.layer_types[l];
            let (h, hd) = (c.num_attention_heads, c.head_dim);
            let ratio = c.compress_ratio(l);
            let compressor_w = match kind {
                AttnKind::Sliding => None,
                AttnKind::Csa => Some(compressor(
                    ck,
                    &format!("{p}.attn.compressor"),
                    c,
                    ratio,
                    true,
                    hd,
                )?),
                AttnKind::Hca => Some(compressor(
                    ck,
                    &format!("{p}.attn.compressor"),
                    c,
                    ratio,
                    false,
                    hd,
                )?),
            };
            let indexer = match kind {
                AttnKind::Csa => Some(IndexerWeights {
                    wq_b: Linear::load(
                        ck,
                        &format!("{p}.attn.indexer.wq_b"),
                        c.index_n_heads * c.index_head_dim,
                        c.q_lora_rank,
                    )?,
                    weights_proj: Linear::load(
                        ck,
                        &format!("{p}.attn.indexer.weights_proj"),
                        c.index_n_heads,
                        d,
                    )?,
                    compressor: compressor(
                        ck,
                        &format!("{p}.attn.indexer.compressor"),
                        c,
                        ratio,
                        true,
                        c.index_head_dim,
                    )?,
                }),
                _ => None,
            };
            let kv_norm_name = if ck.contains(&format!("{p}.attn.kv_norm.weight"))
                || !ck.contains(&format!("{p}.attn.norm.weight"))
            {
                format!("{p}.attn.kv_norm.weight")
            } else {
                format!("{p}.attn.norm.weight")
            };
            let attn = AttentionWeights {
                kind,
                wq_a: Linear::load(ck, &format!("{p}.attn.wq_a"), c.q_lora_rank, d)?,
                q_norm: vec1(ck, &format!("{p}.attn.q_norm.weight"), c.q_lora_rank)?,
                wq_b: Linear::load(ck, &format!("{p}.attn.wq_b"), h * hd, c.q_lora_rank)?,
                wkv: Linear::load(ck, &format!("{p}.attn.wkv"), hd, d)?,
                kv_norm: vec1(ck, &kv_norm_name, hd)?,
                sink: vec1(ck, &format!("{p}.attn.attn_sink"), h)?,
                wo_a: Linear::load(
                    ck,
                    &format!("{p}.attn.wo_a"),
                    c.o_groups * c.o_lora_rank,
                    h * hd / c.o_groups,
                )?,
                wo_b: Linear::load(ck, &format!("{p}.attn.wo_b"), d, c.o_groups * c.o_lora_rank)?,
                compressor: compressor_w,
                indexer,
            };
            let e = c.n_routed_experts;
            let routing = match c.mlp_layer_types[l] {
                MlpKind::Hash => {
                    let ids = ck.tensor_i64(
                        &format!("{p}.ffn.gate.tid2eid"),
                        &[c.vocab_size, c.num_experts_per_tok],
                    )?;
                    let mut table = Vec::with_capacity(ids.len());
                    for v in ids {
                        if v < 0 || v as usize >= e {
                            return Err(CheckpointError::InvalidValue {
                                name: format!("{p}.ffn.gate.tid2eid"),
                                reason: format!("expert id {v} outside 0..{e}"),
                            });
                        }
                        table.push(v as u32);
                    }
                    Routing::Hash(table)
                }
                MlpKind::Scored => Routing::Scored {
                    bias: vec1(ck, &format!("{p}.ffn.gate.bias"), e)?,
                },
            };
            let inter = c.moe_intermediate_size;
            let experts = (0..e)
                .map(|i| expert(ck, &format!("{p}.ffn.experts.{i}"), d, inter))
                .collect::<Result<Vec<_>, _>>()?;
            let shared = if c.n_shared_experts > 0 {
                Some(expert(
                    ck,
                    &format!("{p}.ffn.shared_experts"),
                    d,
                    inter * c.n_shared_experts,
                )?)
            } else {
                None
            };
            layers.push(LayerWeights {
                attn_norm: vec1(ck, &format!("{p}.attn_norm.weight"), d)?,
                ffn_norm: vec1(ck, &format!("{p}.ffn_norm.weight"), d)?,
                hc_attn: hyper(ck, &format!("{p}.hc_attn"), c)?,
                hc_ffn: hyper(ck, &format!("{p}.hc_ffn"), c)?,
                attn,
                ffn: MoeWeights {
                    gate: Linear::load(ck, &format!("{p}.ffn.gate"), e, d)?,
                    routing,
                    experts,
                    shared,
                },
            });
            progress(l + 1, total);
        }
        let weights = Self {
            embed: ck.matrix("embed.weight", &[c.vocab_size, d])?,
            head: Linear::load(ck, "head", c.vocab_size, d)?,
            norm: vec1(ck, "norm.weight", d)?,
            hc_head_fn: Linear {
                w: ck.matrix("hc_head_fn", &[hc, hc * d])?,
            },
            hc_head_base: vec1(ck, "hc_head_base", hc)?,
            hc_head_scale: vec1(ck, "hc_head_scale", 1)?,
            layers,
        };
        progress(total, total);
        Ok(weights)
    }
}
