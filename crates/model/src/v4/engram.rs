//! V4.1's Engram read (docs/MODEL.md §8.6): each token's n-gram hashes pick rows of a huge table; a
//! projection of those rows gives one key per residual stream and a shared value, and each
//! stream takes the value through a gate that measures how well the stream matches its key.
//! Applied to the streams before the layer's attention mHC. The tables stay in the
//! checkpoint's files ([`TableRows`]).

use super::workspace::Workspace;
use crate::batch::ForwardBatch;
use crate::checkpoint::{Checkpoint, CheckpointError, TableRows};
use crate::config::ModelConfig;
use crate::engram::{CompressedTokenMap, EngramError, EngramLayout, NgramHasher, TokenChunk};
use crate::linear::Linear;
use crate::profile::{self, scope, Op};
use deepinfer_kernels::linear::Matmul;
use deepinfer_kernels::norm::rms_factor;
use rayon::prelude::*;

/// The clamp under the gate's signed square root (vLLM's `clamp_value`).
const GATE_FLOOR: f32 = 1e-6;

thread_local! {
    /// A table row's stored bytes, per thread: kept from step to step, so reading rows
    /// allocates nothing once every thread has read one.
    static ROW_BYTES: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One Engram layer's weights.
#[derive(Debug)]
pub struct EngramWeights {
    /// `[rows, head_dim]`, read in place.
    pub table: TableRows,
    /// `[(hc + 1)·D, hash_cols·head_dim]`: the looked-up rows → hc keys and one value.
    pub wkv: Linear,
    /// `q_weight · k_weight`, `[hc, D]`: the gate only ever uses their product.
    pub qk: Vec<f32>,
    /// Which of the model's Engram layers this is (its hashes' index).
    pub index: usize,
    /// The image token, whose positions the gate keeps shut (docs/MODEL.md §8.6).
    pub image_token: Option<u32>,
}

impl EngramWeights {
    pub fn load(
        ck: &Checkpoint,
        c: &ModelConfig,
        prefix: &str,
        index: usize,
    ) -> Result<Self, CheckpointError> {
        let e = c
            .v41
            .as_ref()
            .and_then(|v| v.engram.as_ref())
            .expect("an Engram layer has an Engram config");
        let (hc, d) = (c.hc_mult, c.hidden_size);
        let cols = (e.max_ngram_size - 1) * e.n_heads * e.head_dim;
        let p = format!("{prefix}.engram");
        let q = ck.tensor_f32(&format!("{p}.q_weight"), &[hc, d])?;
        let k = ck.tensor_f32(&format!("{p}.k_weight"), &[hc, d])?;
        Ok(Self {
            table: ck.table_rows(
                &format!("{p}.embed.weight"),
                [e.num_embeddings[index], e.head_dim],
            )?,
            wkv: Linear {
                w: ck.matrix(&format!("{p}.wkv.weight"), &[(hc + 1) * d, cols])?,
            },
            qk: q.iter().zip(&k).map(|(q, k)| q * k).collect(),
            index,
            image_token: c.v41.as_ref().and_then(|v| v.image_token_id),
        })
    }
}

/// What hashing needs, built once at load from the checkpoint's tokenizer.
pub struct EngramHashing {
    pub layout: EngramLayout,
    pub map: CompressedTokenMap,
    pub image_token_id: Option<u32>,
}

impl EngramHashing {
    /// Every Engram layer's table rows for every batch row into `out`, `[layers][N ·
    /// hash_cols]` (its buffers reused from step to step). Spans that start past position 0
    /// read the tokens before them from `batch.lookback`.
    pub fn rows_into(
        &self,
        batch: &ForwardBatch,
        out: &mut Vec<Vec<u64>>,
    ) -> Result<(), EngramError> {
        let image = self.image_token_id;
        let hasher = NgramHasher::new(&self.layout, &self.map, |t| Some(t) == image)?;
        let cols = self.layout.n_hash_cols();
        let n = batch.num_tokens();
        out.resize_with(self.layout.layer_ids().len(), Vec::new);
        for rows in out.iter_mut() {
            rows.clear();
            rows.resize(n * cols, 0);
        }
        for (s, span) in batch.spans.iter().enumerate() {
            let chunk = TokenChunk {
                history: batch.lookback(s),
                tokens: &batch.token_ids[span.start..span.start + span.len],
                start: batch.positions[span.start],
            };
            for (layer, rows) in out.iter_mut().enumerate() {
                let r = &mut rows[span.start * cols..(span.start + span.len) * cols];
                hasher.hash_layer(layer, &chunk, r)?;
            }
        }
        Ok(())
    }
}

/// Adds the gated lookup to the streams `x: [N, hc, D]` in place; `rows`: the layer's table
/// rows, `[N, hash_cols]`. Image positions (`token_ids` equal to the image token) keep their
/// streams: their gate is shut. Fails only where the table cannot be read.
pub fn engram(
    w: &EngramWeights,
    c: &ModelConfig,
    x: &mut [f32],
    rows: &[u64],
    token_ids: &[u32],
    ws: &mut Workspace,
) -> Result<(), CheckpointError> {
    let _p = scope(Op::Other);
    let (hc, d, eps) = (c.hc_mult, c.hidden_size, c.rms_norm_eps);
    let dim = w.table.cols;
    let n = x.len() / (hc * d);
    let width = w.wkv.in_dim();
    let mut looked_up = ws.take(n * width);
    let read = looked_up
        .par_chunks_mut(width)
        .zip(rows.par_chunks(width / dim))
        .try_for_each(|(out, rows)| {
            ROW_BYTES.with(|cell| {
                let bytes = &mut cell.borrow_mut();
                out.chunks_exact_mut(dim)
                    .zip(rows)
                    .try_for_each(|(o, &r)| w.table.row_into(r as usize, o, bytes))
            })
        });
    if let Err(e) = read {
        ws.give(looked_up);
        return Err(e);
    }
    profile::weight_read(n * (width / dim) * (dim + dim.div_ceil(32)));
    // `wkv` is an FP8 projection; the rows of an FP8 table pass its rounding unchanged.
    c.numerics.projection_input(&mut looked_up, width);
    let mut kv = ws.take(n * (hc + 1) * d);
    let inputs = c.numerics.inputs();
    profile::matmuls(&mut [Matmul::new(&w.wkv.w, &looked_up, n, &mut kv).with_inputs(inputs)]);
    let image = w.image_token;
    x.par_chunks_mut(hc * d)
        .zip(kv.par_chunks(hc * d + d))
        .zip(token_ids.par_iter())
        .for_each(|((streams, kv), &tok)| {
            if Some(tok) == image {
                return;
            }
            let value = &kv[hc * d..];
            for (c, stream) in streams.chunks_exact_mut(d).enumerate() {
                let key = &kv[c * d..(c + 1) * d];
                let qk = &w.qk[c * d..(c + 1) * d];
                let dot: f32 = stream
                    .iter()
                    .zip(qk)
                    .zip(key)
                    .map(|((x, w), k)| x * w * k)
                    .sum();
                let z = dot * rms_factor(stream, eps) * rms_factor(key, eps) / (d as f32).sqrt();
                // The sign as vLLM's kernel takes it: zero counts as positive.
                let root = z.abs().max(GATE_FLOOR).sqrt();
                let g = if z < 0.0 { -root } else { root };
                let gate = 1.0 / (1.0 + (-g).exp());
                for (s, v) in stream.iter_mut().zip(value) {
                    *s += gate * v;
                }
            }
        });
    ws.give(looked_up);
    ws.give(kv);
    Ok(())
}
