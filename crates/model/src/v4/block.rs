//! One decoder block (spec §3.2): mHC collapse → norm → attention → mHC write-back, then the
//! same around the MoE.

use super::attention::attention;
use super::hyper::{hc_mix, hc_post};
use super::moe::moe;
use crate::config::ModelConfig;
use crate::weights::LayerWeights;
use deepinfer_kernels::norm::rms_norm_rows;
use deepinfer_kernels::rope::Rope;

/// Runs layer `w` on the streams `x: [T, hc, D]` of one whole sequence, in place.
pub fn block_forward(
    w: &LayerWeights,
    c: &ModelConfig,
    x: &mut [f32],
    token_ids: &[u32],
    rope: &Rope,
) {
    let d = c.hidden_size;
    let t = token_ids.len();
    let eps = c.rms_norm_eps;

    let mut mix = hc_mix(x, t, &w.hc_attn, c);
    rms_norm_rows(&mut mix.collapsed, &w.attn_norm, eps);
    let o = attention(&w.attn, c, &mix.collapsed, rope);
    hc_post(x, &o, &mix, t, d);

    let mut mix = hc_mix(x, t, &w.hc_ffn, c);
    rms_norm_rows(&mut mix.collapsed, &w.ffn_norm, eps);
    let m = moe(&w.ffn, c, &mix.collapsed, token_ids);
    hc_post(x, &m, &mix, t, d);
}
