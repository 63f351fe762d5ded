//! One decoder block (spec §3.2): mHC collapse → norm → attention → mHC write-back, then the
//! same around the MoE.

use super::attention::attention;
use super::hyper::{hc_mix, hc_post};
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
    ws: &mut Workspace,
) -> Result<(), ExpertError> {
    let c = ctx.c;
    let (d, n, eps) = (c.hidden_size, ctx.token_ids.len(), c.rms_norm_eps);

    let mut mix = hc_mix(x, n, &w.hc_attn, c, ws);
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
        ws,
    );
    hc_post(x, &o, &mix, n, d, ws);
    ws.give(o);
    mix.recycle(ws);

    let mut mix = hc_mix(x, n, &w.hc_ffn, c, ws);
    {
        let _p = scope(Op::NormRope);
        rms_norm_rows(&mut mix.collapsed, &w.ffn_norm, eps);
    }
    let m = moe(&w.ffn, c, &mix.collapsed, ctx.token_ids, ws)?;
    hc_post(x, &m, &mix, n, d, ws);
    ws.give(m);
    mix.recycle(ws);
    Ok(())
}
