//! The MTP draft block (docs/MODEL.md §7.1): from the main model's final streams at a position and
//! the token that follows it, one sliding-window decoder block predicts the token after
//! that. Its window ring is the cache's layer `num_hidden_layers`; the embedding and head are
//! the main model's unless the checkpoint ships different copies.

use super::block::block_forward;
use super::block::LayerWeights;
use super::carry::Carry;
use super::embed::embed_streams;
use super::head::{FinalCollapse, Head, HeadWeights};
use super::hyper::HcHead;
use super::model::{Model, ModelError};
use super::pass::BlockCtx;
use super::pass::LayerSpec;
use super::rows::Angles;
use super::workspace::Workspace;
use crate::batch::{ForwardBatch, Logits};
use crate::cache::CacheView;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use crate::config::{AttnKind, MlpKind};
use crate::linear::Linear;
use crate::profile::{scope, Op};
use deepinfer_kernels::linear::Matmul;
use deepinfer_kernels::matrix::QMatrix;
use deepinfer_kernels::norm::rms_norm_rows;
use smallvec::SmallVec;

impl Model {
    /// Whether the checkpoint carries the MTP draft block.
    pub fn has_mtp(&self) -> bool {
        self.weights.mtp.is_some()
    }

    /// The MTP draft block (docs/MODEL.md §7.1) over a flat batch: row `i` sits at position
    /// `positions[i]`, takes the main model's final streams at that position
    /// (`hidden_in[i]`, `[hc, D]`) and the token that follows it (`token_ids[i]`), and its
    /// logits predict the token after that. The block keeps its window ring in cache layer
    /// `num_hidden_layers`; `hidden_out` receives its output streams `[N, hc, D]` (the `h` of
    /// a chained draft step).
    pub fn forward_mtp(
        &mut self,
        batch: &ForwardBatch,
        hidden_in: &[f32],
        cache: &mut dyn CacheView,
        logits: &mut Logits,
        hidden_out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        deepinfer_kernels::awake::with_workers_awake(|| {
            self.mtp_pass(batch, hidden_in, cache, logits, hidden_out)
        })
    }

    fn mtp_pass(
        &mut self,
        batch: &ForwardBatch,
        hidden_in: &[f32],
        cache: &mut dyn CacheView,
        logits: &mut Logits,
        hidden_out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let _p = scope(Op::Other);
        let layer = self.config.num_hidden_layers;
        if self.weights.mtp.is_none() {
            return Err(ModelError::NoMtp);
        }
        if cache.num_layers() <= layer {
            return Err(ModelError::NoMtpCache {
                layers: cache.num_layers(),
            });
        }
        let (d, hc, n) = (
            self.config.hidden_size,
            self.config.hc_mult,
            batch.num_tokens(),
        );
        if hidden_in.len() != n * hc * d {
            return Err(ModelError::HiddenLength {
                floats: hidden_in.len(),
                expected: n * hc * d,
            });
        }
        self.reserve_thread_scratch();
        let row_seq = std::mem::take(&mut self.scratch.row_seq);
        let rows = self.rows(batch, &*cache, row_seq, false)?;
        let Self {
            config: c,
            weights: w,
            rope_main,
            scratch,
            ..
        } = self;
        let mtp = w.mtp.as_ref().expect("checked above");
        let ws = &mut scratch.ws;
        let angles = Angles::new(rope_main, rows.positions, ws);
        let mut x = mtp_input(mtp, &w.embed, c, &batch.token_ids, hidden_in, ws);
        let ctx = BlockCtx {
            c,
            layer,
            token_ids: &batch.token_ids,
            rows: &rows,
            rope: rope_main,
            angles: &angles,
        };
        let mut carry = Carry::default();
        block_forward(&mtp.block, &ctx, &mut x, cache, &mut carry, ws)?;
        carry.recycle(ws);
        let head = Head {
            collapse: FinalCollapse::Hyper(&mtp.hc_head),
            norm: &mtp.norm,
            head: mtp.head.as_ref().unwrap_or(&w.head),
        };
        head.logits(c, &x, &batch.logits_rows, logits, ws);
        std::mem::swap(hidden_out, &mut x);
        ws.give(x);
        angles.recycle(ws);
        scratch.row_seq = rows.row_seq;
        Ok(())
    }
}

/// The MTP block's input streams: `h_proj(hnorm(h))` per stream plus `e_proj(enorm(e))` of
/// the next token's embedding, broadcast to every stream (docs/MODEL.md §7.1).
fn mtp_input(
    mtp: &MtpWeights,
    main_embed: &QMatrix,
    c: &ModelConfig,
    token_ids: &[u32],
    hidden_in: &[f32],
    ws: &mut Workspace,
) -> Vec<f32> {
    let (d, hc, n) = (c.hidden_size, c.hc_mult, token_ids.len());
    let embed = mtp.embed.as_ref().unwrap_or(main_embed);
    let mut e = ws.take(n * d);
    embed_streams(embed, token_ids, 1, d, &mut e);
    let mut u = ws.take(n * hc * d);
    u.copy_from_slice(hidden_in);
    {
        let _p = scope(Op::NormRope);
        rms_norm_rows(&mut e, &mtp.enorm, c.rms_norm_eps);
        rms_norm_rows(&mut u, &mtp.hnorm, c.rms_norm_eps);
        c.numerics.projection_input(&mut e, d);
        c.numerics.projection_input(&mut u, d);
    }
    let mut x = ws.take(n * hc * d);
    let mut ep = ws.take(n * d);
    {
        let mut jobs: SmallVec<[Matmul; 2]> = SmallVec::new();
        let inputs = c.numerics.inputs();
        jobs.push(Matmul::new(&mtp.h_proj.w, &u, n * hc, &mut x).with_inputs(inputs));
        jobs.push(Matmul::new(&mtp.e_proj.w, &e, n, &mut ep).with_inputs(inputs));
        crate::profile::matmuls(&mut jobs);
    }
    for (row, add) in x.chunks_exact_mut(hc * d).zip(ep.chunks_exact(d)) {
        for stream in row.chunks_exact_mut(d) {
            stream.iter_mut().zip(add).for_each(|(s, a)| *s += a);
        }
    }
    for v in [e, u, ep] {
        ws.give(v);
    }
    x
}

/// The MTP draft block (docs/MODEL.md §7.1): the next token's embedding and the main model's final
/// streams projected into one set of streams, a full sliding-window decoder block, and its
/// own hyper head and norm in front of the (shared) head.
#[derive(Debug)]
pub struct MtpWeights {
    pub e_proj: Linear,
    pub h_proj: Linear,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    pub norm: Vec<f32>,
    pub hc_head: HcHead,
    pub block: LayerWeights,
    /// The checkpoint's own copy of the embedding when it differs from the main one
    /// (`mtp.0.emb.tok_emb.weight`); `None`: the main embedding is shared.
    pub embed: Option<QMatrix>,
    /// Likewise for the head (`mtp.0.head.weight`).
    pub head: Option<HeadWeights>,
}

impl MtpWeights {
    /// The MTP block when the config announces one and the checkpoint carries it; `None`
    /// otherwise (a checkpoint without `mtp.*` still serves, it just cannot draft).
    pub(crate) fn load(
        ck: &Checkpoint,
        c: &ModelConfig,
    ) -> Result<Option<MtpWeights>, CheckpointError> {
        const P: &str = "mtp.0";
        // V4.1's `mtp.*` stages are DSpark's, another drafter.
        if c.num_nextn_predict_layers == 0
            || c.v41.is_some()
            || !ck.contains(&format!("{P}.e_proj.weight"))
        {
            return Ok(None);
        }
        let d = c.hidden_size;
        let spec = LayerSpec {
            prefix: P,
            kind: AttnKind::Sliding,
            mlp: MlpKind::Scored,
            ratio: 0,
            placement: None,
            index: c.num_hidden_layers,
        };
        // Some checkpoints carry copies of the embedding and head under the MTP's prefix; the
        // reference shares the main ones, so a copy is only kept when it differs.
        let differs = |name: &str, main: &str| -> Result<bool, CheckpointError> {
            if !ck.contains(name) || ck.same_stored_tensor(name, main)? {
                return Ok(false);
            }
            tracing::info!("{name} differs from {main}: the MTP block uses its own copy");
            Ok(true)
        };
        const EMBED: &str = "mtp.0.emb.tok_emb.weight";
        let embed = match differs(EMBED, "embed.weight")? {
            true => Some(ck.matrix(EMBED, &[c.vocab_size, d])?),
            false => None,
        };
        let head = match differs("mtp.0.head.weight", "head.weight")? {
            true => Some(HeadWeights::Whole(Linear::load(
                ck,
                "mtp.0.head",
                c.vocab_size,
                d,
            )?)),
            false => None,
        };
        Ok(Some(MtpWeights {
            e_proj: Linear::load(ck, &format!("{P}.e_proj"), d, d)?,
            h_proj: Linear::load(ck, &format!("{P}.h_proj"), d, d)?,
            enorm: ck.vector(&format!("{P}.enorm.weight"), d)?,
            hnorm: ck.vector(&format!("{P}.hnorm.weight"), d)?,
            norm: ck.vector(&format!("{P}.norm.weight"), d)?,
            hc_head: HcHead::load(ck, &format!("{P}.hc_head_"), c)?,
            block: LayerWeights::load(ck, c, &spec, None)?,
            embed,
            head,
        }))
    }
}
