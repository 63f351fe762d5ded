//! Token-level compression (docs/MODEL.md §3.6): every `m` tokens become one entry, a per-channel
//! softmax-gated pool of the tokens' projections. CSA windows overlap (each entry pools the
//! previous window's A-half and its own window's B-half); HCA windows do not.
//!
//! Each token's projections `[K | Z]` (Z with `ape` added) go into the cache's pending-row
//! ring at `pos mod slots`; when a token closes its window the entry is pooled from the ring,
//! normed, rotated at the window's first position and stored as entry `pos div m`. Entries
//! are a pure function of their window's rows, so re-running a truncated span rewrites them.
//!
//! V4.1's compressors (docs/MODEL.md §8.3) pool non-overlapping windows of 1 or 2 without `ape`, and
//! a kv source that indexes also turns each entry's normed latent, before its RoPE, into the
//! indexer's key for that entry (`k_norm(wk · latent)`, rotated like the entry).

use crate::cache::{CacheView, Stream};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use crate::linear::Linear;
use crate::record;
use deepinfer_kernels::norm::rms_norm;
use deepinfer_kernels::rope::Rope;
use deepinfer_kernels::vector::exp_in_place;

/// Writes `[K | Z + ape]` rows (`2·coff·c` wide) for every token into `rows`, from the
/// projections `k, z: [N, coff·c]`.
pub fn pending_rows(
    w: &CompressorWeights,
    k: &[f32],
    z: &[f32],
    positions: &[usize],
    rows: &mut [f32],
) {
    let width = w.wkv.out_dim();
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
}

/// Scratch floats [`absorb`] needs for compressor `w`.
pub fn scratch_len(w: &CompressorWeights) -> usize {
    4 * w.dim + w.keys.as_ref().map_or(0, |k| k.wk.out_dim())
}

/// One compressor as a layer applies it: its weights, the layer whose pools hold its rows
/// and entries, which stream they are (attention entries or indexer keys), and the model's
/// rounding and RoPE.
pub struct Compression<'a> {
    pub w: &'a CompressorWeights,
    pub c: &'a ModelConfig,
    pub rope: &'a Rope,
    pub layer: usize,
    pub stream: Stream,
}

impl Compression<'_> {
    /// Stores the rows of sequence `seq`'s chunk (positions `p0..p0+n`, rows in order) and
    /// emits every entry whose window closes inside the chunk, rounded as `c.numerics` keeps
    /// KV (attention entries) or indexer keys.
    pub fn absorb(
        &self,
        cache: &mut dyn CacheView,
        seq: usize,
        p0: usize,
        rows: &[f32],
        scratch: &mut [f32],
    ) {
        let Compression {
            w,
            c,
            rope,
            layer,
            stream,
        } = *self;
        let width = 2 * w.wkv.out_dim();
        let slots = cache.pending_slots(layer);
        let (entry, temps) = scratch.split_at_mut(w.dim);
        let (temps, key) = temps.split_at_mut(3 * w.dim);
        cache.keep_pending(seq, layer, stream, p0, rows);
        for (i, row) in rows.chunks_exact(width).enumerate() {
            let pos = p0 + i;
            cache
                .pending_mut(seq, layer, stream, pos % slots)
                .copy_from_slice(row);
            if (pos + 1).is_multiple_of(w.ratio) {
                let win = pos / w.ratio;
                self.pool(&*cache, seq, win, entry, temps);
                rms_norm(entry, &w.norm, c.rms_norm_eps);
                if let Some(k) = &w.keys {
                    // `wk` is BF16: it reads the latent as a dense product's input.
                    let latent = c.numerics.dense_view(entry, &mut temps[..w.dim]);
                    k.wk.forward_dense(latent, 1, key, c.numerics);
                    rms_norm(key, &k.k_norm, c.rms_norm_eps);
                    rope.apply(key, win * w.ratio, false);
                    c.numerics.indexer(key, key.len());
                    record::store_key(c, key, cache.entry_mut(seq, layer, Stream::Indexer, win));
                }
                rope.apply(entry, win * w.ratio, false);
                let rec = cache.entry_mut(seq, layer, stream, win);
                match stream {
                    Stream::Attn => {
                        c.numerics.kv(entry, w.dim, c.qk_rope_head_dim);
                        record::store_kv(c, entry, rec);
                    }
                    Stream::Indexer => {
                        c.numerics.indexer(entry, w.dim);
                        record::store_key(c, entry, rec);
                    }
                }
            }
        }
    }

    /// Per channel, a softmax over the window's slots of the gate logits, weighting the
    /// values; vectorised across channels (`temps`: three scratch rows of `c`).
    fn pool(
        &self,
        cache: &dyn CacheView,
        seq: usize,
        win: usize,
        out: &mut [f32],
        temps: &mut [f32],
    ) {
        let (w, layer, stream) = (self.w, self.layer, self.stream);
        let (m, c) = (w.ratio, w.dim);
        let slots = cache.pending_slots(layer);
        let half = w.wkv.out_dim(); // coff·c: offset of Z in a row
                                    // (row, channel offset) of every slot feeding this entry: for CSA the previous window
                                    // through half A (none for the first window), then this window through half B.
        let sources = || {
            let prev = if w.overlap && win > 0 {
                (win - 1) * m..win * m
            } else {
                0..0
            };
            let own_off = if w.overlap { c } else { 0 };
            prev.map(|p| (p, 0))
                .chain((win * m..(win + 1) * m).map(move |p| (p, own_off)))
                .map(|(p, off)| (cache.pending(seq, layer, stream, p % slots), off))
        };
        let (mx, rest) = temps.split_at_mut(c);
        let (den, e) = rest.split_at_mut(c);
        mx.fill(f32::NEG_INFINITY);
        for (r, off) in sources() {
            for (a, &z) in mx.iter_mut().zip(&r[half + off..half + off + c]) {
                *a = a.max(z);
            }
        }
        den.fill(0.0);
        out.fill(0.0);
        for (r, off) in sources() {
            for ((v, &z), &a) in e
                .iter_mut()
                .zip(&r[half + off..half + off + c])
                .zip(mx.iter())
            {
                *v = z - a;
            }
            exp_in_place(&mut e[..c]);
            for (((o, d), &p), &k) in out
                .iter_mut()
                .zip(den.iter_mut())
                .zip(&e[..c])
                .zip(&r[off..off + c])
            {
                *d += p;
                *o += p * k;
            }
        }
        for (o, d) in out.iter_mut().zip(den.iter()) {
            *o /= d;
        }
    }
}

#[derive(Debug)]
pub struct CompressorWeights {
    /// Window length `m` and whether windows overlap (CSA).
    pub ratio: usize,
    pub overlap: bool,
    /// Output width `c` of one entry.
    pub dim: usize,
    pub wkv: Linear,
    /// The gate logits' projection; V4.1's ratio-1 compressor pools single tokens and has
    /// none (its logits are zero: the pool is the token's own row).
    pub wgate: Option<Linear>,
    /// `[m, coff·c]`, added to the gate logits of slot `pos mod m` (zeros for V4.1, which
    /// has no `ape`).
    pub ape: Vec<f32>,
    pub norm: Vec<f32>,
    /// V4.1's indexer keys, made from each entry's latent before its RoPE (docs/MODEL.md §8.5): the
    /// kv source's indexer owns them.
    pub keys: Option<IndexKeyWeights>,
}

/// `key = k_norm(wk · latent)`, then RoPE like the entry.
#[derive(Debug)]
pub struct IndexKeyWeights {
    pub wk: Linear,
    pub k_norm: Vec<f32>,
}

impl CompressorWeights {
    pub(crate) fn load(
        ck: &Checkpoint,
        p: &str,
        c: &ModelConfig,
        ratio: usize,
        overlap: bool,
        dim: usize,
    ) -> Result<CompressorWeights, CheckpointError> {
        let width = if overlap { 2 * dim } else { dim };
        Ok(CompressorWeights {
            ratio,
            overlap,
            dim,
            wkv: Linear::load(ck, &format!("{p}.wkv"), width, c.hidden_size)?,
            wgate: Some(Linear::load(
                ck,
                &format!("{p}.wgate"),
                width,
                c.hidden_size,
            )?),
            ape: ck.tensor_f32(&format!("{p}.ape"), &[ratio, width])?,
            norm: ck.vector(&format!("{p}.norm.weight"), dim)?,
            keys: None,
        })
    }
}

impl CompressorWeights {
    /// V4.1's compressor on a kv source (docs/MODEL.md §8.3): no overlap, no `ape`, a gate only for
    /// ratio 2, and the indexer's key projection when the layer indexes.
    pub(crate) fn load_shared(
        ck: &Checkpoint,
        p: &str,
        c: &ModelConfig,
        ratio: usize,
        indexes: bool,
    ) -> Result<CompressorWeights, CheckpointError> {
        let (hd, d) = (c.head_dim, c.hidden_size);
        let keys = match indexes {
            true => Some(IndexKeyWeights {
                wk: Linear::load(ck, &format!("{p}.attn.indexer.wk"), c.index_head_dim, hd)?,
                k_norm: ck.vector(&format!("{p}.attn.indexer.k_norm.weight"), c.index_head_dim)?,
            }),
            false => None,
        };
        let comp = format!("{p}.attn.compressor");
        Ok(CompressorWeights {
            ratio,
            overlap: false,
            dim: hd,
            wkv: Linear::load(ck, &format!("{comp}.wkv"), hd, d)?,
            wgate: match ratio > 1 {
                true => Some(Linear::load(ck, &format!("{comp}.wgate"), hd, d)?),
                false => None,
            },
            ape: vec![0.0; ratio * hd],
            norm: ck.vector(&format!("{comp}.norm.weight"), hd)?,
            keys,
        })
    }
}
