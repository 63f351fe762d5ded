//! V4 attention (docs/MODEL.md §3.4–3.8): single-latent MQA where one normed vector per token is both
//! key and value, partial interleaved RoPE on the trailing dims, a learned sink logit per
//! head, a sliding window, plus compressed entries (all of them for HCA, the indexer's
//! top-k for CSA), and a grouped low-rank output projection.
//!
//! V4.1's layers (docs/MODEL.md §8.2-5) differ in small ways handled here: no per-head q norm; only
//! kv sources compress (into their own cache rows, which later layers read) and make the
//! indexer's keys; only index sources score, and the layers after them attend to their
//! picks (the [`Carry`]); later index sources pick inside the candidate source's blocks.

mod weights;
pub use weights::{AttentionWeights, HeadProjections};

use super::carry::Carry;
use super::compressor::{pending_rows, scratch_len, Compression};
use super::indexer::{candidate_blocks, IndexerQueries, IndexerWeights, Scope};
use super::output_groups::grouped_output;
use super::pass::BlockCtx;
use super::rows::{Angles, BatchRows};
use super::tensor_parallel::{gather_q, q_part, split_out};
use super::workspace::Workspace;
use crate::cache::{CacheView, Stream};
use crate::config::ModelConfig;
use crate::parallel;
use crate::profile::{self, scope, Op};
use crate::record;
use deepinfer_kernels::attention::{sink_attention, SinkHeads};
use deepinfer_kernels::linear::Matmul;
use deepinfer_kernels::norm::{rms_norm_rows, rms_norm_unweighted};
use deepinfer_kernels::rope::Rope;
use rayon::prelude::*;
use smallvec::SmallVec;
use std::cell::RefCell;

thread_local! {
    /// Per-thread scratch of the parallel loops (scores, picked entries, keys decoded from
    /// packed cache records): reserved up front on every compute thread
    /// ([`reserve_scratch`]) so that no task, whichever thread it lands on, grows it during
    /// a step.
    static SCRATCH: RefCell<(Vec<f32>, Vec<usize>, Vec<f32>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Reserves this thread's attention scratch for the largest index set `c` allows: the
/// indexer scores every compressed entry of the longest sequence, attention scores every
/// key (window plus all HCA entries, or the indexer's top-k) for every head.
pub fn reserve_scratch(c: &ModelConfig) {
    let max_pos = c.max_position_embeddings;
    let indexed = max_pos / c.compress_rate_csa.max(1);
    let keys = c.sliding_window + (max_pos / c.compress_rate_hca.max(1)).max(c.index_topk);
    SCRATCH.with(|cell| {
        if let Ok(mut s) = cell.try_borrow_mut() {
            let (scores, picked, decoded) = &mut *s;
            let floats = (c.num_attention_heads * keys).max(indexed);
            scores.reserve(floats.saturating_sub(scores.len()));
            let indices = indexed.max(keys);
            picked.reserve(indices.saturating_sub(picked.len()));
            if c.numerics.packs_cache() {
                let floats = (keys * c.head_dim).max(c.index_head_dim);
                decoded.resize(floats.max(decoded.len()), 0.0);
            }
        }
    });
}

/// Attention of the block `ctx` places for every token of the batch; `a`: the normed
/// sublayer input `[N, D]`. Reads earlier positions from `cache`, leaves this batch's state
/// in it, and returns `[N, D]` (a workspace buffer).
pub fn attention(
    w: &AttentionWeights,
    ctx: &BlockCtx,
    a: &[f32],
    cache: &mut dyn CacheView,
    carry: &mut Carry,
    ws: &mut Workspace,
) -> Vec<f32> {
    let st = Step {
        w,
        c: ctx.c,
        layer: ctx.layer,
        rows: ctx.rows,
        angles: ctx.angles,
    };
    let rope = ctx.rope;
    let mut p = project(&st, a, ws);
    norm_and_rotate(&st, &mut p);
    // Compressed state first: entries closed by this batch's tokens are visible to them.
    compress(&st, &p, cache, rope, ws);
    select(&st, &mut p, &*cache, carry, ws);
    let mut out = attend_rows(&st, &p, (&carry.picks, &carry.n_picks), &*cache, ws);
    // Only now overwrite the ring: earlier queries of a long chunk still read old slots.
    store_window(&st, &p.kv, cache, ws);
    let res = output(&st, &mut out, ws);
    p.give(ws);
    ws.give(out);
    res
}

/// What every step of one layer's attention reads: its weights, the layer, the batch.
struct Step<'a> {
    w: &'a AttentionWeights,
    c: &'a ModelConfig,
    layer: usize,
    rows: &'a BatchRows<'a>,
    angles: &'a Angles,
}

impl Step<'_> {
    fn n(&self) -> usize {
        self.rows.positions.len()
    }

    /// Tokens per compressed entry (0 for a sliding layer).
    fn ratio(&self) -> usize {
        self.w.plan.ratio
    }

    /// The layer whose cache rows hold this layer's compressed entries and indexer keys.
    fn kv_layer(&self) -> usize {
        self.w.plan.kv_layer
    }

    /// Whether the compressed entries attended to are index picks rather than all of them.
    fn picks(&self) -> bool {
        self.w.plan.picks
    }
}

/// The projections of one step's input (workspace buffers; [`Projected::give`] returns
/// them): `q` `[N, H·hd]`, the latent `kv` `[N, hd]`, the q-LoRA `qr`, the compressors'
/// `[K | Z]` halves (`ck`/`cz`, the indexer's `ik`/`iz`), the indexer's queries `iq` and
/// head weights `iwt`, and `aq`, the input rounded for the projections that take it so.
struct Projected {
    aq: Vec<f32>,
    qr: Vec<f32>,
    kv: Vec<f32>,
    ck: Vec<f32>,
    cz: Vec<f32>,
    ik: Vec<f32>,
    iz: Vec<f32>,
    iwt: Vec<f32>,
    q: Vec<f32>,
    iq: Vec<f32>,
}

impl Projected {
    fn give(self, ws: &mut Workspace) {
        let p = self;
        for v in [p.aq, p.qr, p.kv, p.ck, p.cz, p.ik, p.iz, p.iwt, p.q, p.iq] {
            ws.give(v);
        }
    }
}

/// Every projection of `a` in one parallel pass, the q-LoRA norm, then every projection of
/// the q-LoRA activations (split over ranks, the heads' part here and the rest gathered).
fn project(st: &Step, a: &[f32], ws: &mut Workspace) -> Projected {
    let (w, c, n) = (st.w, st.c, st.n());
    let hd = c.head_dim;
    // `wq_a` and `wkv` read `a` as a projection input; the BF16 compressor and indexer-weight
    // projections as a dense product's input.
    let mut aq = ws.take(c.numerics.copy_len(a.len()));
    let a_proj = c.numerics.projection_view(a, c.hidden_size, &mut aq);
    let mut ad = ws.take(c.numerics.copy_len(a.len()));
    let a_dense = c.numerics.dense_view(a, &mut ad);
    let mut qr = ws.take(n * w.wq_a.out_dim());
    let mut kv = ws.take(n * hd);
    let comp = w.compressor.as_ref();
    let icomp = w.indexer.as_ref().and_then(|iw| iw.compressor.as_ref());
    let width =
        |cw: Option<&crate::v4::compressor::CompressorWeights>| cw.map_or(0, |cw| cw.wkv.out_dim());
    let (mut ck, mut cz) = (ws.take(n * width(comp)), ws.take(n * width(comp)));
    let (mut ik, mut iz) = (ws.take(n * width(icomp)), ws.take(n * width(icomp)));
    let mut iwt = ws.take(n * w.indexer.as_ref().map_or(0, |iw| iw.weights_proj.out_dim()));
    {
        let mut jobs: SmallVec<[Matmul; 8]> = SmallVec::new();
        let inputs = c.numerics.inputs();
        jobs.push(Matmul::new(&w.wq_a.w, a_proj, n, &mut qr).with_inputs(inputs));
        jobs.push(Matmul::new(&w.wkv.w, a_proj, n, &mut kv).with_inputs(inputs));
        // Without a gate (V4.1's ratio 1) the logits stay zero: each entry is its token.
        for (cw, k, z) in [(comp, &mut ck, &mut cz), (icomp, &mut ik, &mut iz)] {
            if let Some(cw) = cw {
                jobs.push(Matmul::new(&cw.wkv.w, a_dense, n, k).with_inputs(inputs));
                if let Some(g) = &cw.wgate {
                    jobs.push(Matmul::new(&g.w, a_dense, n, z).with_inputs(inputs));
                }
            }
        }
        if let Some(iw) = &w.indexer {
            jobs.push(Matmul::new(&iw.weights_proj.w, a_dense, n, &mut iwt).with_inputs(inputs));
        }
        profile::matmuls(&mut jobs);
    }
    ws.give(ad);
    {
        let _p = scope(Op::NormRope);
        rms_norm_rows(&mut qr, &w.q_norm, c.rms_norm_eps);
        c.numerics.projection_input(&mut qr, c.q_lora_rank);
    }
    let mut q = ws.take(n * c.num_attention_heads * hd);
    let mut iq = ws.take(n * w.indexer.as_ref().map_or(0, |iw| iw.wq_b.out_dim()));
    match &w.heads {
        HeadProjections::Whole { wq_b, .. } => {
            let mut jobs: SmallVec<[Matmul; 2]> = SmallVec::new();
            let inputs = c.numerics.inputs();
            jobs.push(Matmul::new(&wq_b.w, &qr, n, &mut q).with_inputs(inputs));
            if let Some(iw) = &w.indexer {
                jobs.push(Matmul::new(&iw.wq_b.w, &qr, n, &mut iq).with_inputs(inputs));
            }
            profile::matmuls(&mut jobs);
        }
        HeadProjections::Split { part, link } => {
            let op = parallel::Op::AttnQ;
            parallel::announce(&*link.comm, op, link.layer, n, &mut qr);
            let also = w.indexer.as_ref().map(|iw| {
                Matmul::new(&iw.wq_b.w, &qr, n, &mut iq).with_inputs(c.numerics.inputs())
            });
            let mine = q_part(part, &qr, n, also, ws);
            gather_q(link, c, &mine, n, &mut q, ws);
            ws.give(mine);
        }
    }
    Projected {
        aq,
        qr,
        kv,
        ck,
        cz,
        ik,
        iz,
        iwt,
        q,
        iq,
    }
}

/// The per-head q RMS (V4 only) and RoPE, the latent's norm and RoPE, and its rounding as
/// the cache will keep it.
fn norm_and_rotate(st: &Step, p: &mut Projected) {
    let _p = scope(Op::NormRope);
    let (c, eps) = (st.c, st.c.rms_norm_eps);
    let (h, hd) = (c.num_attention_heads, c.head_dim);
    let q_norm = st.w.plan.q_head_norm;
    for (i, row) in p.q.chunks_exact_mut(h * hd).enumerate() {
        let (cos, sin) = st.angles.row(i);
        for head in row.chunks_exact_mut(hd) {
            if q_norm {
                rms_norm_unweighted(head, eps);
            }
            Rope::apply_with(head, cos, sin, false);
        }
    }
    rms_norm_rows(&mut p.kv, &st.w.kv_norm, eps);
    for (i, row) in p.kv.chunks_exact_mut(hd).enumerate() {
        let (cos, sin) = st.angles.row(i);
        Rope::apply_with(row, cos, sin, false);
    }
    c.numerics.kv(&mut p.kv, hd, c.qk_rope_head_dim);
}

/// Every sequence's pending rows into the cache, and every entry they close, for the
/// attention's compressor and the indexer's.
fn compress(st: &Step, p: &Projected, cache: &mut dyn CacheView, rope: &Rope, ws: &mut Workspace) {
    let _p = scope(Op::Compressor);
    let (w, rows, n) = (st.w, st.rows, st.n());
    let positions = rows.positions;
    let pairs = [
        (w.compressor.as_ref(), &p.ck, &p.cz, Stream::Attn),
        (
            w.indexer.as_ref().and_then(|iw| iw.compressor.as_ref()),
            &p.ik,
            &p.iz,
            Stream::Indexer,
        ),
    ];
    for (cw, k, z, stream) in pairs {
        let Some(cw) = cw else { continue };
        let width = 2 * cw.wkv.out_dim();
        let mut pending = ws.take(n * width);
        pending_rows(cw, k, z, positions, &mut pending);
        let mut scratch = ws.take(scratch_len(cw));
        for (s, span) in rows.spans.iter().enumerate() {
            let chunk = &pending[span.start * width..(span.start + span.len) * width];
            let p0 = positions[span.start];
            let comp = Compression {
                w: cw,
                c: st.c,
                rope,
                layer: st.layer,
                stream,
            };
            comp.absorb(cache, s, p0, chunk, &mut scratch);
        }
        ws.give(scratch);
        ws.give(pending);
    }
}

/// The index picks every compressed query attends to, `[N, topk]` with a count per row,
/// left in `carry`: this layer's own when it indexes, else (V4.1) the last index source's.
/// V4.1's candidate source also leaves its blocks there for the index sources after it.
fn select(
    st: &Step,
    p: &mut Projected,
    cache: &dyn CacheView,
    carry: &mut Carry,
    ws: &mut Workspace,
) {
    let (c, rows, n, ratio) = (st.c, st.rows, st.n(), st.ratio());
    let topk = c.index_topk;
    let Some(iw) = &st.w.indexer else {
        return;
    };
    let _p = scope(Op::Indexer);
    let (ih, ihd) = rotate_index_queries(st, iw, p);
    let queries = IndexerQueries {
        config: c,
        heads: ih,
        head_dim: ihd,
        q: &p.iq,
        weights: &p.iwt,
    };
    let uses = st.w.plan.candidates;
    let cand = uses.config;
    let publish = cand.filter(|_| uses.publishes);
    let within = cand.filter(|_| uses.within);
    let nb = cand.map_or(1, |cd| cd.topk_blocks.max(1));
    let mut picks = ws.take_idx(n * topk);
    let mut n_picks = ws.take_idx(n);
    let mut blocks = ws.take_idx(if publish.is_some() { n * nb } else { 0 });
    let mut n_blocks = ws.take_idx(if publish.is_some() { n } else { 0 });
    let positions = rows.positions;
    let key_layer = st.kv_layer();
    let most_visible = positions.iter().map(|p| (p + 1) / ratio).max().unwrap_or(0);
    let (held, held_n) = (&carry.blocks, &carry.n_blocks);
    let row = |i: usize,
               out: &mut [usize],
               count: &mut usize,
               published: Option<(&mut [usize], &mut usize)>| {
        let (s, _, _) = rows.row_seq[i];
        let scope = Scope {
            seq: s,
            layer: key_layer,
            visible: (positions[i] + 1) / ratio,
            within: within.map(|cd| (&held[i * nb..i * nb + held_n[i]], cd.block_size)),
        };
        SCRATCH.with(|cell| {
            let (scores, picked, key) = &mut *cell.borrow_mut();
            queries.select(i, cache, &scope, topk, (scores, key), picked);
            out[..picked.len()].copy_from_slice(picked);
            *count = picked.len();
            if let (Some(cd), Some((bout, bcount))) = (publish, published) {
                if !scores.is_empty() {
                    candidate_blocks(scores, cd.block_size, cd.topk_blocks, key, picked);
                    bout[..picked.len()].copy_from_slice(picked);
                    *bcount = picked.len();
                }
            }
        });
    };
    let min = min_len(most_visible * ih * ihd);
    if publish.is_some() {
        picks
            .par_chunks_mut(topk)
            .zip(n_picks.par_iter_mut())
            .zip(blocks.par_chunks_mut(nb).zip(n_blocks.par_iter_mut()))
            .with_min_len(min)
            .enumerate()
            .for_each(|(i, ((out, count), (b, bc)))| row(i, out, count, Some((b, bc))));
    } else {
        picks
            .par_chunks_mut(topk)
            .zip(n_picks.par_iter_mut())
            .with_min_len(min)
            .enumerate()
            .for_each(|(i, (out, count))| row(i, out, count, None));
    }
    ws.give_idx(std::mem::replace(&mut carry.picks, picks));
    ws.give_idx(std::mem::replace(&mut carry.n_picks, n_picks));
    if publish.is_some() {
        ws.give_idx(std::mem::replace(&mut carry.blocks, blocks));
        ws.give_idx(std::mem::replace(&mut carry.n_blocks, n_blocks));
    } else {
        ws.give_idx(blocks);
        ws.give_idx(n_blocks);
    }
}

/// The indexer's queries rotated and rounded as its keys are, its head weights scaled by
/// 1/√heads; returns `(heads, head_dim)`.
fn rotate_index_queries(st: &Step, iw: &IndexerWeights, p: &mut Projected) -> (usize, usize) {
    let c = st.c;
    let (ih, ihd) = (c.index_n_heads, iw.wq_b.out_dim() / c.index_n_heads);
    for (i, row) in p.iq.chunks_exact_mut(ih * ihd).enumerate() {
        let (cos, sin) = st.angles.row(i);
        for head in row.chunks_exact_mut(ihd) {
            Rope::apply_with(head, cos, sin, false);
        }
    }
    c.numerics.indexer(&mut p.iq, ihd);
    let wscale = (ih as f32).powf(-0.5);
    p.iwt.iter_mut().for_each(|v| *v *= wscale);
    (ih, ihd)
}

/// The attention core: every row's heads over its index set (its window, then its
/// compressed entries), de-rotated at the query's position; `[N, H·hd]`.
fn attend_rows(
    st: &Step,
    p: &Projected,
    (picks, n_picks): (&[usize], &[usize]),
    cache: &dyn CacheView,
    ws: &mut Workspace,
) -> Vec<f32> {
    let _p = scope(Op::Attention);
    let (w, c, rows, layer, n) = (st.w, st.c, st.rows, st.layer, st.n());
    let (h, hd, ratio, topk) = (c.num_attention_heads, c.head_dim, st.ratio(), c.index_topk);
    let (kv_layer, picked) = (st.kv_layer(), st.picks());
    let (window, ring) = (c.sliding_window, cache.window_slots());
    let positions = rows.positions;
    let softmax_scale = (hd as f32).powf(-0.5);
    let kv_words = record::kv_words(c);
    let mut out = ws.take(n * h * hd);
    // Small batches split each row's heads in two so both cores work on a decode step.
    let head_groups = if n < 4 && h.is_multiple_of(2) { 2 } else { 1 };
    let hg = h / head_groups;
    let (kv, q) = (&p.kv, &p.q);
    let most = positions.iter().max().map_or(0, |p| p + 1);
    // At most: the window and every visible entry (an upper bound for CSA, exact for HCA).
    let keys = window + most.checked_div(ratio).unwrap_or(0);
    let read: usize = out
        .par_chunks_mut(hg * hd)
        .with_min_len(min_len(2 * hg * keys * hd))
        .enumerate()
        .map(|(t, o)| {
            let (i, g) = (t / head_groups, t % head_groups);
            let (s, p0, start) = rows.row_seq[i];
            let p = positions[i];
            let (lo, hi) = rows.window(s, p, window);
            // A widened window sees no further than this batch's rows (the scheduler keeps
            // an image span in one chunk).
            let hi = hi.min(p0 + rows.spans[s].len - 1);
            let n_window = hi + 1 - lo;
            // Entry e is complete (and visible) once token (e+1)·m−1 has been seen.
            let n_comp = match (ratio, picked) {
                (0, _) => 0,
                (_, true) => n_picks[i],
                (m, false) => (p + 1) / m,
            };
            // The index set: the window (own token included) — this batch's rows for its
            // own chunk, the ring for earlier positions — then the compressed entries;
            // `true` for a cache record.
            let key = |j: usize| -> (bool, &[f32]) {
                if j < n_window {
                    let pos = lo + j;
                    if pos >= p0 {
                        let r = start + pos - p0;
                        (false, &kv[r * hd..(r + 1) * hd])
                    } else {
                        (true, cache.window(s, layer, pos % ring))
                    }
                } else {
                    let e = j - n_window;
                    let e = if picked { picks[i * topk + e] } else { e };
                    (true, cache.entry(s, kv_layer, Stream::Attn, e))
                }
            };
            let heads = g * hg..(g + 1) * hg;
            let n_keys = n_window + n_comp;
            let heads = SinkHeads {
                q: &q[(i * h + heads.start) * hd..(i * h + heads.end) * hd],
                sinks: &w.sink[heads],
                softmax_scale,
            };
            SCRATCH.with(|cell| attend(c, &heads, n_keys, key, &mut cell.borrow_mut(), o));
            let (cos, sin) = st.angles.row(i);
            for head in o.chunks_exact_mut(hd) {
                Rope::apply_with(head, cos, sin, true);
            }
            if g == 0 {
                n_keys * kv_words * 4
            } else {
                0
            }
        })
        .sum();
    profile::cache_read(read);
    out
}

/// This batch's latents into the window ring (the last `ring` of each sequence's rows), as
/// the cache stores them, and every row to the owner's snapshots.
fn store_window(st: &Step, kv: &[f32], cache: &mut dyn CacheView, ws: &mut Workspace) {
    let (c, rows, layer, n) = (st.c, st.rows, st.layer, st.n());
    let (hd, ring) = (c.head_dim, cache.window_slots());
    let (packed, kv_words) = (c.numerics.packs_cache(), record::kv_words(c));
    let mut packed_kv = ws.take(if packed { n * kv_words } else { 0 });
    let stored: &[f32] = if packed {
        for (row, rec) in kv
            .chunks_exact(hd)
            .zip(packed_kv.chunks_exact_mut(kv_words))
        {
            record::store_kv(c, row, rec);
        }
        &packed_kv
    } else {
        kv
    };
    for (s, span) in rows.spans.iter().enumerate() {
        let p0 = rows.positions[span.start];
        let recs = &stored[span.start * kv_words..(span.start + span.len) * kv_words];
        for j in span.len.saturating_sub(ring)..span.len {
            cache
                .window_mut(s, layer, (p0 + j) % ring)
                .copy_from_slice(&recs[j * kv_words..(j + 1) * kv_words]);
        }
        cache.keep_window(s, layer, p0, recs);
    }
    ws.give(packed_kv);
}

/// The grouped low-rank output projection of the heads' output `out`; `[N, D]` (split over
/// ranks: this rank's groups, reduced).
fn output(st: &Step, out: &mut [f32], ws: &mut Workspace) -> Vec<f32> {
    let (c, n) = (st.c, st.n());
    match &st.w.heads {
        HeadProjections::Whole { wo_a, wo_b, .. } => {
            let mut z = grouped_output(c, &wo_a.w, 0, 0..c.o_groups, out, n, ws);
            c.numerics.projection_input(&mut z, wo_b.in_dim());
            let mut res = ws.take(n * wo_b.out_dim());
            let inputs = c.numerics.inputs();
            profile::matmuls(&mut [Matmul::new(&wo_b.w, &z, n, &mut res).with_inputs(inputs)]);
            ws.give(z);
            res
        }
        HeadProjections::Split { part, link } => split_out(link, part, c, out, n, ws),
    }
}

/// Sink attention of `heads` over `n_keys` keys, `key(j)` giving key `j` as a row this step
/// computed (`false`, f32) or a cache record (`true`); records the cache packs are decoded
/// into the scratch's third buffer first, once per key.
fn attend<'k>(
    c: &ModelConfig,
    heads: &SinkHeads,
    n_keys: usize,
    key: impl Fn(usize) -> (bool, &'k [f32]),
    scratch: &mut (Vec<f32>, Vec<usize>, Vec<f32>),
    out: &mut [f32],
) {
    let (scores, key_at, decoded) = scratch;
    let hd = c.head_dim;
    if !c.numerics.packs_cache() {
        let key = |j| key(j).1;
        sink_attention(heads, hd, n_keys, key, scores, key_at, out);
        return;
    }
    if decoded.len() < n_keys * hd {
        decoded.resize(n_keys * hd, 0.0);
    }
    for (j, row) in decoded.chunks_exact_mut(hd).take(n_keys).enumerate() {
        match key(j) {
            (true, rec) => record::load_kv(c, rec, row),
            (false, computed) => row.copy_from_slice(computed),
        }
    }
    let decoded = &decoded[..];
    let key = |j: usize| &decoded[j * hd..(j + 1) * hd];
    sink_attention(heads, hd, n_keys, key, scores, key_at, out);
}

/// Tasks of about `work` multiply-adds each that one parallel task should at least take:
/// below ~64K a fork-join costs more than the second core gains (tiny models, short
/// contexts), and the loop then runs on the calling thread.
fn min_len(work: usize) -> usize {
    (1usize << 16).div_ceil(work.max(1))
}
