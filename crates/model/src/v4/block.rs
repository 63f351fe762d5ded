//! One decoder block (spec §3.2): mHC collapse → norm → attention → mHC write-back, then the
//! same around the MoE. V4.1 (spec §8.1) collapses each sublayer's input with the previous
//! sublayer's weights, which the block takes from and leaves in the [`Carry`].

use super::attention::attention;
use super::carry::Carry;
use super::hyper::{hc_mix, hc_post, Collapse, HyperMix};
use super::moe::moe;
use super::rows::{Angles, BatchRows};
use super::workspace::Workspace;
use crate::cache::CacheView;
use crate::config::ModelConfig;
use crate::experts::ExpertError;
use crate::profile::{scope, Op};
use crate::weights::LayerWeights;
use deepinfer_kernels::norm::rms_norm_rows;
use deepinfer_kernels::rope::Rope;

/// What a block needs to know about the batch and its place in the model.
pub struct BlockCtx<'a> {
    pub c: &'a ModelConfig,
    /// The block's layer id in the cache: `0..num_hidden_layers`, or `num_hidden_layers` for
    /// the MTP block.
    pub layer: usize,
    pub token_ids: &'a [u32],
    pub rows: &'a BatchRows<'a>,
    pub rope: &'a Rope,
    pub angles: &'a Angles,
}

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
    let shifted = c.v41.is_some();

    let mut mix = hc_mix(x, n, &w.hc_attn, c, collapse(shifted, carry), ws);
    {
        let _p = scope(Op::NormRope);
        rms_norm_rows(&mut mix.collapsed, &w.attn_norm, eps);
    }
    let o = attention(
        &w.attn,
        c,
        ctx.layer,
        &mix.collapsed,
        ctx.rows,
        cache,
        ctx.rope,
        ctx.angles,
        carry,
        ws,
    );
    hc_post(x, &o, &mix, n, d, ws);
    ws.give(o);
    hand_on(mix, shifted, carry, ws);

    let mut mix = hc_mix(x, n, &w.hc_ffn, c, collapse(shifted, carry), ws);
    {
        let _p = scope(Op::NormRope);
        rms_norm_rows(&mut mix.collapsed, &w.ffn_norm, eps);
    }
    let m = moe(&w.ffn, c, &mix.collapsed, ctx.token_ids, ws)?;
    hc_post(x, &m, &mix, n, d, ws);
    ws.give(m);
    hand_on(mix, shifted, carry, ws);
    Ok(())
}

/// How a sublayer collapses its input: V4 with its own weights, V4.1 with the previous
/// sublayer's (stream 0 at the model's entry).
fn collapse(shifted: bool, carry: &Carry) -> Collapse<'_> {
    match (shifted, &carry.pre) {
        (false, _) => Collapse::Own,
        (true, None) => Collapse::First,
        (true, Some(pre)) => Collapse::Carried(pre),
    }
}

/// Recycles a sublayer's mixing weights, keeping its `pre` for the next one when shifted.
fn hand_on(mut mix: HyperMix, shifted: bool, carry: &mut Carry, ws: &mut Workspace) {
    if shifted {
        carry.shift(std::mem::take(&mut mix.pre), ws);
    }
    mix.recycle(ws);
}
