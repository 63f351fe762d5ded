//! The token embedding into the residual streams.

use deepinfer_kernels::matrix::QMatrix;

use crate::batch::ForwardBatch;

/// Every token's embedding, widened, copied into each of its `hc` streams.
pub(crate) fn embed_streams(
    embed: &QMatrix,
    token_ids: &[u32],
    hc: usize,
    d: usize,
    x: &mut [f32],
) {
    crate::profile::weight_read(token_ids.len() * embed.stored_bytes() / embed.rows.max(1));
    for (i, &id) in token_ids.iter().enumerate() {
        let row = &mut x[i * hc * d..(i + 1) * hc * d];
        embed.dequantize_row(id as usize, &mut row[..d]);
        for s in 1..hc {
            row.copy_within(..d, s * d);
        }
    }
}

/// Rows whose input embedding the batch gives ([`ForwardBatch::embed_rows`]) get it in
/// every stream instead of their token's, as vLLM's `inputs_embeds` enter before the
/// hyper-connection expansion.
pub(crate) fn override_streams(batch: &ForwardBatch, hc: usize, d: usize, x: &mut [f32]) {
    for (i, &r) in batch.embed_rows.iter().enumerate() {
        let row = &mut x[r * hc * d..(r + 1) * hc * d];
        row[..d].copy_from_slice(&batch.embed_values[i * d..(i + 1) * d]);
        for s in 1..hc {
            row.copy_within(..d, s * d);
        }
    }
}
