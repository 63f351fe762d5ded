//! Token-level compression (spec §3.6): every `m` tokens become one entry, a per-channel
//! softmax-gated pool of the tokens' projections. CSA windows overlap (each entry pools the
//! previous window's A-half and its own window's B-half); HCA windows do not.
//!
//! Each token's projections `[K | Z]` (Z with `ape` added) go into the cache's pending-row
//! ring at `pos mod slots`; when a token closes its window the entry is pooled from the ring,
//! normed, rotated at the window's first position and stored as entry `pos div m`. Entries
//! are a pure function of their window's rows, so re-running a truncated span rewrites them.

use crate::cache::{CacheView, Stream};
use crate::weights::CompressorWeights;
use deepinfer_kernels::norm::rms_norm;
use deepinfer_kernels::rope::Rope;

/// `[K | Z]` rows (`2·coff·c` wide) for every token of the batch, `a: [N, D]`.
pub fn project(w: &CompressorWeights, a: &[f32], positions: &[usize]) -> Vec<f32> {
    let n = positions.len();
    let width = w.wkv.out_dim();
    let k = w.wkv.forward(a, n);
    let z = w.wgate.forward(a, n);
    let mut rows = vec![0.0f32; n * 2 * width];
    for (i, row) in rows.chunks_exact_mut(2 * width).enumerate() {
        let slot = positions[i] % w.ratio;
        row[..width].copy_from_slice(&k[i * width..(i + 1) * width]);
        let ape = &w.ape[slot * width..(slot + 1) * width];
        for ((o, z), b) in row[width..]
            .iter_mut()
            .zip(&z[i * width..(i + 1) * width])
            .zip(ape)
        {
            *o = z + b;
        }
    }
    rows
}

/// Stores the rows of one sequence's chunk (positions `p0..p0+n`, rows in order) and emits
/// every entry whose window closes inside the chunk.
#[allow(clippy::too_many_arguments)]
pub fn absorb(
    w: &CompressorWeights,
    rows: &[f32],
    p0: usize,
    cache: &mut dyn CacheView,
    seq: usize,
    layer: usize,
    stream: Stream,
    rope: &Rope,
    eps: f32,
) {
    let width = 2 * w.wkv.out_dim();
    let slots = cache.pending_slots(layer);
    let mut entry = vec![0.0f32; w.dim];
    for (i, row) in rows.chunks_exact(width).enumerate() {
        let pos = p0 + i;
        cache
            .pending_mut(seq, layer, stream, pos % slots)
            .copy_from_slice(row);
        if (pos + 1).is_multiple_of(w.ratio) {
            let win = pos / w.ratio;
            pool(w, &*cache, seq, layer, stream, win, &mut entry);
            rms_norm(&mut entry, &w.norm, eps);
            rope.apply(&mut entry, win * w.ratio, false);
            cache
                .entry_mut(seq, layer, stream, win)
                .copy_from_slice(&entry);
        }
    }
}

/// Per channel, a softmax over the window's slots of the gate logits, weighting the values.
#[allow(clippy::too_many_arguments)]
fn pool(
    w: &CompressorWeights,
    cache: &dyn CacheView,
    seq: usize,
    layer: usize,
    stream: Stream,
    win: usize,
    out: &mut [f32],
) {
    let (m, c) = (w.ratio, w.dim);
    let slots = cache.pending_slots(layer);
    let half = w.wkv.out_dim(); // coff·c: offset of Z in a row
                                // (row, channel offset) of every slot feeding this entry.
    let mut sources: Vec<(&[f32], usize)> = Vec::with_capacity(2 * m);
    if w.overlap {
        if win > 0 {
            for p in (win - 1) * m..win * m {
                sources.push((cache.pending(seq, layer, stream, p % slots), 0));
            }
        }
        for p in win * m..(win + 1) * m {
            sources.push((cache.pending(seq, layer, stream, p % slots), c));
        }
    } else {
        for p in win * m..(win + 1) * m {
            sources.push((cache.pending(seq, layer, stream, p % slots), 0));
        }
    }
    for (ch, o) in out.iter_mut().enumerate() {
        let mx = sources
            .iter()
            .map(|(r, off)| r[half + off + ch])
            .fold(f32::NEG_INFINITY, f32::max);
        let denom: f32 = sources
            .iter()
            .map(|(r, off)| (r[half + off + ch] - mx).exp())
            .sum();
        *o = sources
            .iter()
            .map(|(r, off)| r[off + ch] * ((r[half + off + ch] - mx).exp() / denom))
            .sum();
    }
}
