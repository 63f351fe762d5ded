//! One decoder block (docs/MODEL.md §3.2): mHC collapse → norm → attention → mHC write-back, then the
//! same around the MoE. V4.1 (docs/MODEL.md §8.1) collapses each sublayer's input with the previous
//! sublayer's weights, which the block takes from and leaves in the [`Carry`].

use super::attention::attention;
use super::attention::AttentionWeights;
use super::carry::Carry;
use super::hyper::HyperWeights;
use super::hyper::{hc_mix, hc_post, HyperMix, Mixing};
use super::moe::moe;
use super::moe::MoeWeights;
use super::pass::{BlockCtx, LayerSpec};
use super::workspace::Workspace;
use crate::cache::CacheView;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use crate::config::{AttnKind, MlpKind};
use crate::experts::ExpertError;
use crate::experts::{resident_experts, RoutedExperts};
use crate::parallel::Placement;
use crate::profile::{scope, Op};
use deepinfer_kernels::norm::rms_norm_rows;

/// Runs one block on the streams `x: [N, hc, D]` of a flat batch, in place; fails only
/// where a streamed expert cannot be read.
pub fn block_forward(
    w: &LayerWeights,
    ctx: &BlockCtx,
    x: &mut [f32],
    cache: &mut dyn CacheView,
    carry: &mut Carry,
    ws: &mut Workspace,
) -> Result<(), ExpertError> {
    let c = ctx.c;
    let (d, n, eps) = (c.hidden_size, ctx.token_ids.len(), c.rms_norm_eps);
    let mixing = w.mixing;

    let mut mix = hc_mix(
        x,
        n,
        &w.hc_attn,
        c,
        mixing.collapse(carry.pre.as_deref()),
        ws,
    );
    {
        let _p = scope(Op::NormRope);
        rms_norm_rows(&mut mix.collapsed, &w.attn_norm, eps);
    }
    let o = attention(&w.attn, ctx, &mix.collapsed, cache, carry, ws);
    hc_post(x, &o, &mix, n, d, ws);
    ws.give(o);
    hand_on(mix, mixing, carry, ws);

    let mut mix = hc_mix(
        x,
        n,
        &w.hc_ffn,
        c,
        mixing.collapse(carry.pre.as_deref()),
        ws,
    );
    {
        let _p = scope(Op::NormRope);
        rms_norm_rows(&mut mix.collapsed, &w.ffn_norm, eps);
    }
    let m = moe(&w.ffn, c, &mix.collapsed, ctx.token_ids, ws)?;
    hc_post(x, &m, &mix, n, d, ws);
    ws.give(m);
    hand_on(mix, mixing, carry, ws);
    Ok(())
}

/// Recycles a sublayer's mixing weights, keeping its `pre` for the next one when shifted.
fn hand_on(mut mix: HyperMix, mixing: Mixing, carry: &mut Carry, ws: &mut Workspace) {
    if mixing == Mixing::Shifted {
        carry.shift(std::mem::take(&mut mix.pre), ws);
    }
    mix.recycle(ws);
}

#[derive(Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    pub hc_attn: HyperWeights,
    pub hc_ffn: HyperWeights,
    pub attn: AttentionWeights,
    pub ffn: MoeWeights,
    /// V4.1's n-gram memory on the layers that have it.
    pub engram: Option<crate::v4::engram::EngramWeights>,
    pub mixing: Mixing,
}

impl LayerWeights {
    /// One decoder block: a main layer (`layers.N`) or the MTP block (`mtp.0`); `experts` as
    /// [`MoeWeights::load`] takes them.
    pub(crate) fn load(
        ck: &Checkpoint,
        c: &ModelConfig,
        s: &LayerSpec,
        experts: Option<RoutedExperts>,
    ) -> Result<LayerWeights, CheckpointError> {
        let (p, d) = (s.prefix, c.hidden_size);
        Ok(LayerWeights {
            attn_norm: ck.vector(&format!("{p}.attn_norm.weight"), d)?,
            ffn_norm: ck.vector(&format!("{p}.ffn_norm.weight"), d)?,
            hc_attn: HyperWeights::load(ck, &format!("{p}.hc_attn"), c)?,
            hc_ffn: HyperWeights::load(ck, &format!("{p}.hc_ffn"), c)?,
            attn: AttentionWeights::load(ck, c, s)?,
            ffn: MoeWeights::load(ck, c, s, experts)?,
            engram: match c.v41.as_ref().and_then(|v| v.engram_index(s.index)) {
                Some(k) if s.prefix.starts_with("layers.") => {
                    Some(crate::v4::engram::EngramWeights::load(ck, c, p, k)?)
                }
                _ => None,
            },
            mixing: Mixing::of(c),
        })
    }
}

impl LayerWeights {
    /// A drafter's decoder block under `prefix` (DSpark's `mtp.N` stages): window-only,
    /// score-routed, at layer id `index`, with `c`'s expert counts.
    pub(crate) fn draft_stage(
        ck: &Checkpoint,
        c: &ModelConfig,
        prefix: &str,
        index: usize,
        placement: Option<&Placement>,
    ) -> Result<LayerWeights, CheckpointError> {
        let spec = LayerSpec {
            prefix,
            kind: AttnKind::Sliding,
            mlp: MlpKind::Scored,
            ratio: 0,
            placement: None,
            index,
        };
        // Split over ranks, this rank's share of the routed experts by id; the
        // attention and the shared expert stay whole here.
        let experts = placement
            .map(|pl| resident_experts(ck, c, prefix, pl.share(c.n_routed_experts)))
            .transpose()?;
        let mut w = LayerWeights::load(ck, c, &spec, experts)?;
        w.ffn.split = placement.map(|pl| pl.link(index));
        Ok(w)
    }
}
