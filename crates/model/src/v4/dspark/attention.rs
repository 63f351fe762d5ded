//! A draft stage's attention (tools/make_dspark_golden.py step 6): every block row attends
//! to the context window and to every block row, later ones included.

use super::Draft;
use crate::config::ModelConfig;
use crate::v4::attention::HeadProjections;
use crate::v4::block::LayerWeights;
use crate::v4::output_groups::grouped_output;
use crate::v4::rows::Angles;
use crate::v4::workspace::Workspace;
use deepinfer_kernels::attention::{sink_attention, SinkHeads};
use deepinfer_kernels::norm::{rms_norm_rows, rms_norm_unweighted};
use deepinfer_kernels::rope::Rope;

/// A stage's keys for `x: [n, D]`: `kv_norm(wkv · x)`, row `i` rotated by `angle(i)`.
pub(super) fn latents<'a>(
    st: &LayerWeights,
    c: &ModelConfig,
    x: &[f32],
    angle: impl Fn(usize) -> (&'a [f32], &'a [f32]),
    ws: &mut Workspace,
) -> Vec<f32> {
    let hd = c.head_dim;
    let n = x.len() / c.hidden_size;
    let mut kv = ws.take(n * hd);
    st.attn.wkv.forward_into(x, n, &mut kv);
    rms_norm_rows(&mut kv, &st.attn.kv_norm, c.rms_norm_eps);
    for (i, row) in kv.chunks_exact_mut(hd).enumerate() {
        let (cos, sin) = angle(i);
        Rope::apply_with(row, cos, sin, false);
    }
    kv
}

/// The block's attention: every row over the context keys and every block row (non-causal),
/// with the sink; `[block, D]`.
pub(super) fn block_attention(
    st: &LayerWeights,
    c: &ModelConfig,
    a: &[f32],
    ctx_kv: &[f32],
    angles: &Angles,
    scratch: &mut Draft,
    ws: &mut Workspace,
) -> Vec<f32> {
    let HeadProjections::Whole { wq_b, wo_a, wo_b } = &st.attn.heads else {
        unreachable!("a drafter's stage attention loads whole");
    };
    let (h, hd, eps) = (c.num_attention_heads, c.head_dim, c.rms_norm_eps);
    let n = a.len() / c.hidden_size;
    let mut qr = ws.take(n * c.q_lora_rank);
    st.attn.wq_a.forward_into(a, n, &mut qr);
    rms_norm_rows(&mut qr, &st.attn.q_norm, eps);
    let mut q = ws.take(n * h * hd);
    wq_b.forward_into(&qr, n, &mut q);
    let q_norm = st.attn.plan.q_head_norm;
    for (i, row) in q.chunks_exact_mut(h * hd).enumerate() {
        let (cos, sin) = angles.row(i);
        for head in row.chunks_exact_mut(hd) {
            if q_norm {
                rms_norm_unweighted(head, eps);
            }
            Rope::apply_with(head, cos, sin, false);
        }
    }
    let kv = latents(st, c, a, |i| angles.row(i), ws);
    let n_ctx = ctx_kv.len() / hd;
    let key = |j: usize| {
        if j < n_ctx {
            &ctx_kv[j * hd..(j + 1) * hd]
        } else {
            &kv[(j - n_ctx) * hd..(j - n_ctx + 1) * hd]
        }
    };
    let mut out = ws.take(n * h * hd);
    let Draft { scores, key_at, .. } = scratch;
    for (i, o) in out.chunks_exact_mut(h * hd).enumerate() {
        let qi = &q[i * h * hd..(i + 1) * h * hd];
        let scale = (hd as f32).powf(-0.5);
        let heads = SinkHeads {
            q: qi,
            sinks: &st.attn.sink,
            softmax_scale: scale,
        };
        sink_attention(&heads, hd, n_ctx + n, key, scores, key_at, o);
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
