//! One layer's cache state over some positions, as one rank hands it to another: window
//! rows, the compressors' pending rows and the compressed entries (with indexer keys) of the
//! compressors the layer owns, in that order, as the cache holds them.

use crate::cache::layout::CacheLayout;
use deepinfer_model::cache::{CacheView, Stream};
use deepinfer_model::config::AttnKind;
use deepinfer_model::parallel::Collectives;
use std::ops::Range;

/// Which positions' state a message carries.
#[derive(Clone, Debug)]
pub(crate) enum Part {
    /// What a range starting at this position reads of earlier ones: the last window rows,
    /// the rows of the compressors' open groups, every entry.
    Before(usize),
    /// Everything these positions wrote (every row, for the owner's prefix snapshots).
    Range(Range<usize>),
}

#[derive(Clone, Debug)]
enum Piece {
    /// Window rows of these positions.
    Window(Range<usize>),
    /// Pending rows of these positions.
    Pending(Stream, Range<usize>),
    /// These entries.
    Entries(Stream, Range<usize>),
}

pub(crate) struct StateMessage {
    layer: usize,
    /// Each piece with its row width in floats.
    pieces: Vec<(Piece, usize)>,
    floats: usize,
}

impl StateMessage {
    /// Layer `layer`'s `part` in a cache of `layout`; `window`: the model's sliding window.
    pub(crate) fn new(layout: &CacheLayout, layer: usize, part: Part, window: usize) -> Self {
        let l = &layout.layers[layer];
        let mut pieces = Vec::new();
        let rows = match &part {
            Part::Before(p) => p.saturating_sub(window)..*p,
            Part::Range(r) => r.clone(),
        };
        pieces.push((Piece::Window(rows), l.window.width));
        // A layer with a place in a pool writes those entries (V4.1's kv sources keep their
        // keys without a ring of their own: the attention's compressor makes them).
        for stream in [Stream::Attn, Stream::Indexer] {
            let Some(place) = l.entries(stream) else {
                continue;
            };
            let r = l.ratio;
            let (pending, entries) = match &part {
                Part::Before(p) => {
                    // An overlapping compressor (CSA) pools the group before the open one.
                    let coff = if l.kind == AttnKind::Csa { 2 } else { 1 };
                    ((p / r).saturating_sub(coff - 1) * r..*p, 0..p / r)
                }
                Part::Range(g) => (g.clone(), g.start / r..g.end / r),
            };
            if let Some(ring) = l.pending(stream) {
                pieces.push((Piece::Pending(stream, pending), ring.width));
            }
            let width = layout.pools[place.pool].width;
            pieces.push((Piece::Entries(stream, entries), width));
        }
        let floats = pieces.iter().map(|(p, w)| p.len() * w).sum();
        Self {
            layer,
            pieces,
            floats,
        }
    }

    /// The window rows of positions `rows` of layer `layer` alone: a drafter's context ring
    /// (its layers follow the main ones).
    pub(crate) fn window_rows(layout: &CacheLayout, layer: usize, rows: Range<usize>) -> Self {
        let width = layout.layers[layer].window.width;
        Self {
            layer,
            floats: rows.len() * width,
            pieces: vec![(Piece::Window(rows), width)],
        }
    }

    /// Sends the state from `cache` (sequence 0) to rank `to`.
    pub(crate) fn send(&self, comm: &dyn Collectives, to: usize, cache: &dyn CacheView) {
        let mut buf = Vec::with_capacity(self.floats);
        let l = self.layer;
        for (piece, _) in &self.pieces {
            match piece {
                Piece::Window(r) => {
                    let slots = cache.window_slots();
                    r.clone()
                        .for_each(|p| buf.extend_from_slice(cache.window(0, l, p % slots)));
                }
                Piece::Pending(s, r) => {
                    let slots = cache.pending_slots(l);
                    r.clone()
                        .for_each(|p| buf.extend_from_slice(cache.pending(0, l, *s, p % slots)));
                }
                Piece::Entries(s, r) => r
                    .clone()
                    .for_each(|w| buf.extend_from_slice(cache.entry(0, l, *s, w))),
            }
        }
        comm.send_f32(to, &buf);
    }

    /// Receives the state from rank `from` into `cache` (sequence 0), telling the cache of
    /// every row as a step that computed them would.
    pub(crate) fn receive(&self, comm: &dyn Collectives, from: usize, cache: &mut dyn CacheView) {
        let mut buf = vec![0.0; self.floats];
        comm.recv_f32(from, &mut buf);
        let l = self.layer;
        let mut at = 0;
        for (piece, width) in &self.pieces {
            let rows = &buf[at..at + piece.len() * width];
            at += rows.len();
            let chunks = rows.chunks_exact(*width);
            match piece {
                Piece::Window(r) => {
                    let slots = cache.window_slots();
                    for (p, row) in r.clone().zip(chunks) {
                        cache.window_mut(0, l, p % slots).copy_from_slice(row);
                    }
                    cache.keep_window(0, l, r.start, rows);
                }
                Piece::Pending(s, r) => {
                    let slots = cache.pending_slots(l);
                    for (p, row) in r.clone().zip(chunks) {
                        cache.pending_mut(0, l, *s, p % slots).copy_from_slice(row);
                    }
                    cache.keep_pending(0, l, *s, r.start, rows);
                }
                Piece::Entries(s, r) => {
                    for (w, row) in r.clone().zip(chunks) {
                        cache.entry_mut(0, l, *s, w).copy_from_slice(row);
                    }
                }
            }
        }
    }
}

impl Piece {
    fn len(&self) -> usize {
        match self {
            Piece::Window(r) | Piece::Pending(_, r) | Piece::Entries(_, r) => r.len(),
        }
    }
}
