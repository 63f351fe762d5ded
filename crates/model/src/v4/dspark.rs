//! DSpark's draft block (spec §7.2; tools/make_dspark_golden.py for V4.1 and
//! tools/make_dspark_v4_golden.py for V4 are the references and state the computation step
//! by step): the target's streams around its last layers, averaged and projected (`main_x`),
//! give every stage a window of context keys; a block of `[anchor, noise, …]` rows runs
//! through three window-only stages whose rows all see each other and the context, and the
//! head's logits become sequential drafts through the Markov head, each with a confidence.
//! The stages are the target's kind of block: V4.1's (shifted mHC, no per-head q norm,
//! collapsed with the last `pre`) or V4's (own mHC, q norm, the drafter's own hyper head).
//! The engine drafts with it under `--speculative-config '{"method": "dspark"}'`
//! (`engine/src/spec/dspark.rs`).

use super::attention::grouped_output;
use super::hyper::{hc_head, hc_mix, hc_post, Collapse};
use super::model::{embed_streams, Model};
use super::moe::moe;
use super::rows::Angles;
use super::workspace::Workspace;
use crate::checkpoint::{Checkpoint, CheckpointError};
pub use crate::config::DsparkConfig;
use crate::config::ModelConfig;
use crate::experts::ExpertError;
use crate::weights::{draft_stage, HcHead, HeadProjections, HeadWeights, LayerWeights, Linear};
use deepinfer_kernels::attention::sink_attention;
use deepinfer_kernels::matrix::QMatrix;
use deepinfer_kernels::norm::{rms_norm_rows, rms_norm_unweighted};
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

/// One draft block.
#[derive(Debug)]
pub struct Draft {
    /// `[block, vocab]`: the head's logits before the Markov bias.
    pub base_logits: Vec<f32>,
    pub tokens: Vec<u32>,
    pub confidence: Vec<f32>,
}

impl DsparkWeights {
    pub fn load(
        ck: &Checkpoint,
        c: &ModelConfig,
        dc: DsparkConfig,
    ) -> Result<Self, CheckpointError> {
        let (d, v, r) = (c.hidden_size, c.vocab_size, dc.markov_rank);
        let mut sc = c.clone();
        sc.n_routed_experts = dc.n_routed_experts;
        sc.num_experts_per_tok = dc.num_experts_per_tok;
        let stages = (0..dc.stages)
            .map(|i| draft_stage(ck, &sc, &format!("mtp.{i}"), c.num_hidden_layers + i))
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

    /// The block after the committed positions `0..p0`: `aux` holds the mean input streams of
    /// the aux layers for the context rows `ctx0..p0` (`[p0 − ctx0, layers · D]`), `anchor`
    /// is the token at `p0`.
    pub fn draft(
        &self,
        m: &Model,
        aux: &[f32],
        ctx0: usize,
        p0: usize,
        anchor: u32,
        ws: &mut Workspace,
    ) -> Result<Draft, ExpertError> {
        let (c, b) = (&self.stage_config, self.config.block_size);
        let (d, hc) = (c.hidden_size, c.hc_mult);
        let n_ctx = p0 - ctx0;
        let mut main_x = ws.take(n_ctx * d);
        self.main_proj.forward_into(aux, n_ctx, &mut main_x);
        rms_norm_rows(&mut main_x, &self.main_norm, c.rms_norm_eps);
        let ctx_pos: Vec<usize> = (ctx0..p0).collect();
        let pos: Vec<usize> = (p0..p0 + b).collect();
        let ctx_angles = Angles::new(&m.rope_main, &ctx_pos, ws);
        let angles = Angles::new(&m.rope_main, &pos, ws);
        let ids: Vec<u32> = std::iter::once(anchor)
            .chain(std::iter::repeat_n(self.config.noise_token_id, b - 1))
            .collect();
        let mut x = ws.take(b * hc * d);
        embed_streams(&m.weights.embed, &ids, hc, d, &mut x);
        let shifted = c.v41.is_some();
        let mut pre: Option<Vec<f32>> = None;
        for st in &self.stages {
            let ctx_kv = latents(st, c, &main_x, n_ctx, &ctx_angles, ws);
            let collapse = match shifted {
                true => pre.as_deref().map_or(Collapse::First, Collapse::Carried),
                false => Collapse::Own,
            };
            let mut mix = hc_mix(&x, b, &st.hc_attn, c, collapse, ws);
            rms_norm_rows(&mut mix.collapsed, &st.attn_norm, c.rms_norm_eps);
            let o = block_attention(st, c, &mix.collapsed, &ctx_kv, &angles, ws);
            hc_post(&mut x, &o, &mix, b, d, ws);
            for v in [o, ctx_kv] {
                ws.give(v);
            }
            let collapse = match shifted {
                true => Collapse::Carried(&mix.pre),
                false => Collapse::Own,
            };
            let mut ffn = hc_mix(&x, b, &st.hc_ffn, c, collapse, ws);
            rms_norm_rows(&mut ffn.collapsed, &st.ffn_norm, c.rms_norm_eps);
            let f = moe(&st.ffn, c, &ffn.collapsed, &ids, ws)?;
            hc_post(&mut x, &f, &ffn, b, d, ws);
            ws.give(f);
            if let Some(old) = pre.replace(std::mem::take(&mut ffn.pre)) {
                ws.give(old);
            }
            mix.recycle(ws);
            ffn.recycle(ws);
        }
        let pre = pre.expect("a drafter has stages");
        let h = self.head_hidden(&x, &pre, ws);
        let draft = self.head(m, h, anchor, ws);
        for v in [main_x, x, pre] {
            ws.give(v);
        }
        ctx_angles.recycle(ws);
        angles.recycle(ws);
        Ok(draft)
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
    fn head(&self, m: &Model, h: Vec<f32>, anchor: u32, ws: &mut Workspace) -> Draft {
        let c = &self.stage_config;
        let (d, v, b) = (c.hidden_size, c.vocab_size, self.config.block_size);
        let mut normed = h.clone();
        rms_norm_rows(&mut normed, &self.norm, c.rms_norm_eps);
        let mut base_logits = vec![0.0; b * v];
        match &m.weights.head {
            HeadWeights::Whole(head) => head.forward_into(&normed, b, &mut base_logits),
            HeadWeights::Split { .. } => unreachable!("the drafter loads in one process only"),
        }
        let r = self.config.markov_rank;
        let (mut e, mut bias) = (vec![0.0; r], vec![0.0; v]);
        let (mut prev, mut tokens, mut confidence) = (anchor, Vec::new(), Vec::new());
        for j in 0..b {
            self.markov_embed.dequantize_row(prev as usize, &mut e);
            self.markov_head.forward_into(&e, 1, &mut bias);
            let logits: Vec<f32> = base_logits[j * v..(j + 1) * v]
                .iter()
                .zip(&bias)
                .map(|(l, b)| l + b)
                .collect();
            let z =
                dot(&self.confidence[..d], &h[j * d..(j + 1) * d]) + dot(&self.confidence[d..], &e);
            confidence.push(1.0 / (1.0 + (-z).exp()));
            prev = argmax(&logits) as u32;
            tokens.push(prev);
        }
        ws.give(h);
        Draft {
            base_logits,
            tokens,
            confidence,
        }
    }
}

/// A stage's keys for `x: [n, D]`: `kv_norm(wkv · x)`, rotated at each row's position.
fn latents(
    st: &LayerWeights,
    c: &ModelConfig,
    x: &[f32],
    n: usize,
    angles: &Angles,
    ws: &mut Workspace,
) -> Vec<f32> {
    let hd = c.head_dim;
    let mut kv = ws.take(n * hd);
    st.attn.wkv.forward_into(x, n, &mut kv);
    rms_norm_rows(&mut kv, &st.attn.kv_norm, c.rms_norm_eps);
    for (i, row) in kv.chunks_exact_mut(hd).enumerate() {
        let (cos, sin) = angles.row(i);
        Rope::apply_with(row, cos, sin, false);
    }
    kv
}

/// The block's attention: every row over the context keys and every block row (non-causal),
/// with the sink; `[block, D]`.
fn block_attention(
    st: &LayerWeights,
    c: &ModelConfig,
    a: &[f32],
    ctx_kv: &[f32],
    angles: &Angles,
    ws: &mut Workspace,
) -> Vec<f32> {
    let HeadProjections::Whole { wq_b, wo_a, wo_b } = &st.attn.heads else {
        unreachable!("a drafter's stages load whole");
    };
    let (h, hd, eps) = (c.num_attention_heads, c.head_dim, c.rms_norm_eps);
    let n = a.len() / c.hidden_size;
    let mut qr = ws.take(n * c.q_lora_rank);
    st.attn.wq_a.forward_into(a, n, &mut qr);
    rms_norm_rows(&mut qr, &st.attn.q_norm, eps);
    let mut q = ws.take(n * h * hd);
    wq_b.forward_into(&qr, n, &mut q);
    let q_norm = c.v41.is_none();
    for (i, row) in q.chunks_exact_mut(h * hd).enumerate() {
        let (cos, sin) = angles.row(i);
        for head in row.chunks_exact_mut(hd) {
            if q_norm {
                rms_norm_unweighted(head, eps);
            }
            Rope::apply_with(head, cos, sin, false);
        }
    }
    let kv = latents(st, c, a, n, angles, ws);
    let n_ctx = ctx_kv.len() / hd;
    let key = |j: usize| {
        if j < n_ctx {
            &ctx_kv[j * hd..(j + 1) * hd]
        } else {
            &kv[(j - n_ctx) * hd..(j - n_ctx + 1) * hd]
        }
    };
    let mut out = ws.take(n * h * hd);
    let (mut scores, mut key_at) = (Vec::new(), Vec::new());
    for (i, o) in out.chunks_exact_mut(h * hd).enumerate() {
        let qi = &q[i * h * hd..(i + 1) * h * hd];
        let scale = (hd as f32).powf(-0.5);
        sink_attention(
            qi,
            hd,
            n_ctx + n,
            key,
            &st.attn.sink,
            scale,
            &mut scores,
            &mut key_at,
            o,
        );
        let (cos, sin) = angles.row(i);
        o.chunks_exact_mut(hd)
            .for_each(|head| Rope::apply_with(head, cos, sin, true));
    }
    let z = grouped_output(c, &wo_a.w, 0, 0..c.o_groups, &out, n, ws);
    let mut res = ws.take(n * c.hidden_size);
    wo_b.forward_into(&z, n, &mut res);
    for v in [qr, q, kv, out, z] {
        ws.give(v);
    }
    res
}
