//! DSpark's draft block (docs/MODEL.md §7.2; tools/make_dspark_golden.py for V4.1 and
//! tools/make_dspark_v4_golden.py for V4 are the references and state the computation step
//! by step): the target's streams around its last layers, averaged and projected (`main_x`),
//! give every stage a window of context keys; a block of `[anchor, noise, …]` rows runs
//! through three window-only stages whose rows all see each other and the context, and the
//! head's logits become sequential drafts through the Markov head, each with a confidence.
//! The stages are the target's kind of block: V4.1's (shifted mHC, no per-head q norm,
//! collapsed with the last `pre`) or V4's (own mHC, q norm, the drafter's own hyper head).
//! The engine drafts with it under `--speculative-config '{"method": "dspark"}'`
//! (`engine/src/spec/dspark.rs`).

mod attention;
mod context;

use super::embed::embed_streams;
use super::hyper::{hc_head, hc_mix, hc_post};
use super::moe::moe;
use super::rows::Angles;
use super::tensor_parallel::split_head;
use super::workspace::Workspace;
use crate::checkpoint::{Checkpoint, CheckpointError};
pub use crate::config::DsparkConfig;
use crate::config::ModelConfig;
use crate::experts::ExpertError;
use crate::linear::Linear;
use crate::parallel::Placement;
use crate::v4::block::LayerWeights;
use crate::v4::head::HeadWeights;
use crate::v4::hyper::HcHead;
use attention::block_attention;
pub use context::DraftContext;
use deepinfer_kernels::matrix::QMatrix;
use deepinfer_kernels::norm::rms_norm_rows;
use deepinfer_kernels::rope::Rope;
use deepinfer_kernels::topk::argmax;
use deepinfer_kernels::vector::{axpy, dot};

/// The drafter's weights (`mtp.0..` in the checkpoint; the embedding and head are the
/// target's).
#[derive(Debug)]
pub struct DsparkWeights {
    pub config: DsparkConfig,
    /// The target's config with the stages' expert counts.
    stage_config: ModelConfig,
    main_proj: Linear,
    main_norm: Vec<f32>,
    stages: Vec<LayerWeights>,
    /// V4's collapse of the last stage's streams; V4.1 collapses with the last `pre`.
    hc_head: Option<HcHead>,
    norm: Vec<f32>,
    /// `[vocab, rank]`: the previous token's Markov embedding…
    markov_embed: QMatrix,
    /// …and `[vocab, rank]`: its bias on the next token's logits.
    markov_head: Linear,
    /// `[D + rank]`.
    confidence: Vec<f32>,
}

/// One draft block, and the buffers a block reuses: hand the same `Draft` to
/// [`DsparkWeights::draft_into`] block after block and, with a workspace, drafting allocates
/// nothing in steady state.
#[derive(Debug, Default)]
pub struct Draft {
    /// `[block, vocab]`: the head's logits before the Markov bias.
    pub base_logits: Vec<f32>,
    pub tokens: Vec<u32>,
    pub confidence: Vec<f32>,
    /// The block's positions.
    positions: Vec<usize>,
    /// The block's input ids: the anchor, then noise.
    ids: Vec<u32>,
    scores: Vec<f32>,
    key_at: Vec<usize>,
}

/// What a draft reads of its target: the config, the token embedding, the vocabulary head
/// and the main RoPE table.
pub struct DraftTarget<'a> {
    pub config: &'a ModelConfig,
    pub embed: &'a QMatrix,
    pub head: &'a HeadWeights,
    pub rope: &'a Rope,
}

/// The drafter `ck` ships for a model of config `c`, when it ships one.
pub(crate) fn shipped(ck: &Checkpoint, c: &ModelConfig) -> Option<DsparkConfig> {
    c.dspark
        .clone()
        .filter(|_| ck.contains("mtp.0.main_proj.weight"))
}

/// The config the drafter's stages compute with: the target's, with the stages' experts.
pub(crate) fn stage_config(c: &ModelConfig, dc: &DsparkConfig) -> ModelConfig {
    let mut sc = c.clone();
    sc.n_routed_experts = dc.n_routed_experts;
    sc.num_experts_per_tok = dc.num_experts_per_tok;
    sc
}

/// The checkpoint prefix of stage `i`; its layer index, after the target's, is how the
/// ranks holding its experts name it.
pub(crate) fn stage_prefix(i: usize) -> String {
    format!("mtp.{i}")
}

impl DsparkWeights {
    /// The drafter of `ck`; split over ranks (`placement`, this is rank 0), each stage's
    /// routed experts are split by id like a target layer's whole experts, the rest of the
    /// drafter staying here.
    pub fn load(
        ck: &Checkpoint,
        c: &ModelConfig,
        dc: DsparkConfig,
        placement: Option<&Placement>,
    ) -> Result<Self, CheckpointError> {
        let (d, v, r) = (c.hidden_size, c.vocab_size, dc.markov_rank);
        let sc = stage_config(c, &dc);
        let stages = (0..dc.stages)
            .map(|i| {
                let index = c.num_hidden_layers + i;
                LayerWeights::draft_stage(ck, &sc, &stage_prefix(i), index, placement)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let last = format!("mtp.{}", dc.stages.saturating_sub(1));
        let width = dc.aux_layers.len() * d;
        let hc_head = match c.v41 {
            Some(_) => None,
            None => Some(HcHead::load(ck, &format!("{last}.hc_head_"), c)?),
        };
        // vLLM's V4 loader maps `markov_head.*` onto the head's own names, V4.1's renames
        // `embed`/`head` to them: checkpoints spell the factors either way.
        let markov = |ours: &str, theirs: &str| {
            let name = format!("{last}.markov_head.{ours}.weight");
            match ck.contains(&name) {
                true => name,
                false => format!("{last}.markov_head.{theirs}.weight"),
            }
        };
        Ok(Self {
            main_proj: Linear {
                w: ck.matrix("mtp.0.main_proj.weight", &[d, width])?,
            },
            main_norm: ck.tensor_f32("mtp.0.main_norm.weight", &[d])?,
            stages,
            hc_head,
            norm: ck.tensor_f32(&format!("{last}.norm.weight"), &[d])?,
            markov_embed: ck.matrix(&markov("embed", "markov_w1"), &[v, r])?,
            markov_head: Linear {
                w: ck.matrix(&markov("head", "markov_w2"), &[v, r])?,
            },
            confidence: ck
                .tensor_f32(&format!("{last}.confidence_head.proj.weight"), &[1, d + r])?,
            stage_config: sc,
            config: dc,
        })
    }

    /// The stages' blocks (split over ranks, each holding this rank's share of the
    /// routed experts).
    pub fn stage_weights(&self) -> &[LayerWeights] {
        &self.stages
    }

    /// The block after the committed positions `0..p0` (`p0` = the end of `context`'s
    /// positions) into a reused `out`; `anchor` is the token at `p0`.
    pub fn draft_into(
        &self,
        m: &DraftTarget,
        context: &DraftContext,
        anchor: u32,
        out: &mut Draft,
        ws: &mut Workspace,
    ) -> Result<(), ExpertError> {
        let (c, b) = (&self.stage_config, self.config.block_size);
        let (d, hc) = (c.hidden_size, c.hc_mult);
        let p0 = context.positions.end;
        out.positions.clear();
        out.positions.extend(p0..p0 + b);
        let angles = Angles::new(m.rope, &out.positions, ws);
        out.ids.clear();
        out.ids.push(anchor);
        out.ids
            .extend(std::iter::repeat_n(self.config.noise_token_id, b - 1));
        let mut x = ws.take(b * hc * d);
        embed_streams(m.embed, &out.ids, hc, d, &mut x);
        let pre = self.stages(m.config, &mut x, context, &angles, out, ws)?;
        let h = self.head_hidden(&x, &pre, ws);
        self.head(m, &h, anchor, out, ws);
        for v in [x, pre, h] {
            ws.give(v);
        }
        angles.recycle(ws);
        Ok(())
    }

    /// The block's streams `x` through every stage; returns the last sublayer's `pre`.
    fn stages(
        &self,
        target: &ModelConfig,
        x: &mut [f32],
        context: &DraftContext,
        angles: &Angles,
        out: &mut Draft,
        ws: &mut Workspace,
    ) -> Result<Vec<f32>, ExpertError> {
        let (c, b) = (&self.stage_config, self.config.block_size);
        let d = c.hidden_size;
        let mut pre: Option<Vec<f32>> = None;
        for (s, st) in self.stages.iter().enumerate() {
            let ctx_kv = context.keys(target, s, ws);
            let collapse = st.mixing.collapse(pre.as_deref());
            let mut mix = hc_mix(x, b, &st.hc_attn, c, collapse, ws);
            rms_norm_rows(&mut mix.collapsed, &st.attn_norm, c.rms_norm_eps);
            let o = block_attention(st, c, &mix.collapsed, &ctx_kv, angles, out, ws);
            hc_post(x, &o, &mix, b, d, ws);
            for v in [o, ctx_kv] {
                ws.give(v);
            }
            let collapse = st.mixing.collapse(Some(&mix.pre));
            let mut ffn = hc_mix(x, b, &st.hc_ffn, c, collapse, ws);
            rms_norm_rows(&mut ffn.collapsed, &st.ffn_norm, c.rms_norm_eps);
            let f = moe(&st.ffn, c, &ffn.collapsed, &out.ids, ws)?;
            hc_post(x, &f, &ffn, b, d, ws);
            ws.give(f);
            if let Some(old) = pre.replace(std::mem::take(&mut ffn.pre)) {
                ws.give(old);
            }
            mix.recycle(ws);
            ffn.recycle(ws);
        }
        Ok(pre.expect("a drafter has stages"))
    }

    /// The block's streams collapsed for the head, `[block, D]` before the norm: by V4's
    /// hyper head, or with V4.1's last `pre`.
    fn head_hidden(&self, x: &[f32], pre: &[f32], ws: &mut Workspace) -> Vec<f32> {
        let c = &self.stage_config;
        let (d, hc, b) = (c.hidden_size, c.hc_mult, self.config.block_size);
        if let Some(hh) = &self.hc_head {
            return hc_head(x, b, &hh.fn_, &hh.base, hh.scale, c, ws);
        }
        let mut h = ws.take(b * d);
        for (i, out) in h.chunks_exact_mut(d).enumerate() {
            for (s, stream) in x[i * hc * d..(i + 1) * hc * d].chunks_exact(d).enumerate() {
                axpy(out, pre[i * hc + s], stream);
            }
        }
        h
    }

    /// The head on the collapsed block `h`, the Markov chain and the confidences.
    fn head(&self, m: &DraftTarget, h: &[f32], anchor: u32, out: &mut Draft, ws: &mut Workspace) {
        let c = &self.stage_config;
        let (d, v, b) = (c.hidden_size, c.vocab_size, self.config.block_size);
        let mut normed = ws.take(b * d);
        normed.copy_from_slice(h);
        rms_norm_rows(&mut normed, &self.norm, c.rms_norm_eps);
        out.base_logits.clear();
        out.base_logits.resize(b * v, 0.0);
        match m.head {
            HeadWeights::Whole(head) => head.forward_into(&normed, b, &mut out.base_logits),
            // The target's head split by tensor parallelism: every rank projects its rows
            // (of activations as they are, as the whole head's `forward_into` reads them).
            HeadWeights::Split { part, comm } => {
                let shape = (v, deepinfer_kernels::linear::Inputs::F32);
                split_head(
                    &**comm,
                    part,
                    shape,
                    &mut normed,
                    b,
                    &mut out.base_logits,
                    ws,
                )
            }
        }
        let r = self.config.markov_rank;
        let (mut e, mut logits) = (ws.take(r), ws.take(v));
        let mut prev = anchor;
        out.tokens.clear();
        out.confidence.clear();
        for j in 0..b {
            self.markov_embed.dequantize_row(prev as usize, &mut e);
            self.markov_head.forward_into(&e, 1, &mut logits);
            for (l, base) in logits.iter_mut().zip(&out.base_logits[j * v..(j + 1) * v]) {
                *l += base;
            }
            let z =
                dot(&self.confidence[..d], &h[j * d..(j + 1) * d]) + dot(&self.confidence[d..], &e);
            out.confidence.push(1.0 / (1.0 + (-z).exp()));
            prev = argmax(&logits) as u32;
            out.tokens.push(prev);
        }
        for v in [normed, e, logits] {
            ws.give(v);
        }
    }
}
