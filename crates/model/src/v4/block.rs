//! One decoder block (spec §3.2): mHC collapse → norm → attention → mHC write-back, then the
//! same around the MoE.

use super::attention::attention;
use super::hyper::{hc_mix, hc_post};
use super::model::{Angles, BatchRows};
use super::moe::moe;
use super::workspace::Workspace;
use crate::cache::CacheView;
use crate::config::ModelConfig;
use crate::profile::{scope, Op};
use crate::weights::LayerWeights;
use deepinfer_kernels::norm::rms_norm_rows;
use deepinfer_kernels::rope::Rope;

/// Runs layer `layer` on the streams `x: [N, hc, D]` of a flat batch, in place.
#[allow(clippy::too_many_arguments)]
pub fn block_forward(
    w: &LayerWeights,
    c: &ModelConfig,
    layer: usize,
    x: &mut [f32],
    token_ids: &[u32],
    rows: &BatchRows,
    cache: &mut dyn CacheView,
    rope: &Rope,
    angles: &Angles,
    ws: &mut Workspace,
) {
    let (d, n, eps) = (c.hidden_size, token_ids.len(), c.rms_norm_eps);

    let mut mix = hc_mix(x, n, &w.hc_attn, c, ws);
    {
        let _p = scope(Op::NormRope);
        rms_norm_rows(&mut mix.collapsed, &w.attn_norm, eps);
    }
    let o = attention(
        &w.attn,
        c,
        layer,
        &mix.collapsed,
        rows,
        cache,
        rope,
        angles,
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
    let m = moe(&w.ffn, c, &mix.collapsed, token_ids, ws);
    hc_post(x, &m, &mix, n, d, ws);
    ws.give(m);
    mix.recycle(ws);
}
