//! The model's window onto the cache for one batch: [`CacheView`] over borrowed storage.

use std::fmt;
use std::ops::Range;

use deepinfer_model::cache::{CacheView, Stream};

use super::block_pool::{BlockPool, BlockTable};
use super::layout::{CacheLayout, LayerLayout, PoolLayout, RingKind, SnapshotLayout};

/// A snapshot a batch sequence is taking this step: the rows it keeps before `boundary` go
/// to snapshot record `record`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capture {
    pub seq: usize,
    pub boundary: usize,
    pub record: usize,
}

/// The snapshot store and this batch's captures.
type Snapshots<'a> = (&'a SnapshotLayout, &'a mut [f32], &'a [Capture]);

/// The cache state of the sequences of one batch, `seq` being the batch span index.
///
/// Accessors return exactly one row or entry. Asking for state a layer does not have (pending
/// rows or entries of a sliding layer, indexer state of an HCA layer), a ring slot out of
/// range, or an entry at or beyond `capacity_tokens / m` is a bug in the caller and panics
/// with a message naming the numbers.
pub struct BatchView<'a> {
    layout: &'a CacheLayout,
    states: &'a mut [f32],
    pools: &'a mut [BlockPool],
    /// Block tables by state slot, one per pool.
    tables: &'a [Vec<BlockTable>],
    /// `(state slot, capacity)` per batch sequence.
    seqs: &'a [(usize, usize)],
    snapshots: Option<Snapshots<'a>>,
}

impl<'a> BatchView<'a> {
    pub(super) fn new(
        layout: &'a CacheLayout,
        states: &'a mut [f32],
        pools: &'a mut [BlockPool],
        tables: &'a [Vec<BlockTable>],
        seqs: &'a [(usize, usize)],
        snapshots: Option<Snapshots<'a>>,
    ) -> Self {
        Self {
            layout,
            states,
            pools,
            tables,
            seqs,
            snapshots,
        }
    }

    /// Copies the rows of `rows` (positions `p0..`, one ring row each) that snapshots of
    /// `seq` keep for ring `what` of `layer`.
    fn keep(&mut self, seq: usize, layer: usize, what: RingKind, p0: usize, rows: &[f32]) {
        let Some((layout, data, captures)) = &mut self.snapshots else {
            return;
        };
        for c in captures.iter().filter(|c| c.seq == seq) {
            let Some(part) = layout
                .parts
                .iter()
                .find(|p| p.layer == layer && p.what == what)
            else {
                return;
            };
            let width = part.ring.width;
            let n = rows.len() / width;
            let first = c.boundary.saturating_sub(part.rows).max(p0);
            let last = c.boundary.min(p0 + n);
            if first >= last {
                continue;
            }
            let at = layout.row(part, c.boundary, first).expect("kept").start;
            let base = c.record * layout.floats + at;
            data[base..base + (last - first) * width]
                .copy_from_slice(&rows[(first - p0) * width..(last - p0) * width]);
        }
    }

    /// Sequences in the batch.
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    fn seq(&self, seq: usize) -> (usize, usize) {
        *self.seqs.get(seq).unwrap_or_else(|| {
            panic!(
                "cache view: sequence {seq} out of range: the batch has {}",
                self.seqs.len()
            )
        })
    }

    fn layer(&self, layer: usize) -> &LayerLayout {
        self.layout.layers.get(layer).unwrap_or_else(|| {
            panic!(
                "cache view: layer {layer} out of range: the cache has {} layers",
                self.layout.layers.len()
            )
        })
    }

    fn slot_base(&self, seq: usize) -> usize {
        self.seq(seq).0 * self.layout.slot_floats
    }

    fn window_range(&self, seq: usize, layer: usize, slot: usize) -> Range<usize> {
        let r = self.layer(layer).window.row(slot);
        let base = self.slot_base(seq);
        base + r.start..base + r.end
    }

    fn pending_range(&self, seq: usize, layer: usize, stream: Stream, slot: usize) -> Range<usize> {
        let l = self.layer(layer);
        let ring = l.pending(stream).unwrap_or_else(|| {
            panic!(
                "cache view: layer {layer} ({:?}) has no {stream:?} compressor",
                l.kind
            )
        });
        let r = ring.row(slot);
        let base = self.slot_base(seq);
        base + r.start..base + r.end
    }

    /// Pool index and float range of entry `w`.
    fn entry_range(
        &self,
        seq: usize,
        layer: usize,
        stream: Stream,
        w: usize,
    ) -> (usize, Range<usize>) {
        let l = self.layer(layer);
        let place = l.entries(stream).unwrap_or_else(|| {
            panic!(
                "cache view: layer {layer} ({:?}) has no {stream:?} entries",
                l.kind
            )
        });
        let pool: &PoolLayout = &self.layout.pools[place.pool];
        let (slot, capacity) = self.seq(seq);
        let n = pool.entries_for(capacity);
        assert!(
            w < n,
            "cache view: entry {w} of layer {layer} ({stream:?}) is beyond the capacity of \
             sequence {seq}: {capacity} tokens reserved = {n} entries"
        );
        (
            place.pool,
            pool.entry_range(self.tables[slot][place.pool].blocks(), place.member, w),
        )
    }
}

impl fmt::Debug for BatchView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchView")
            .field("seqs", &self.seqs)
            .finish_non_exhaustive()
    }
}

impl CacheView for BatchView<'_> {
    fn num_layers(&self) -> usize {
        self.layout.layers.len()
    }

    fn window_slots(&self) -> usize {
        self.layout.window_slots
    }

    fn pending_slots(&self, layer: usize) -> usize {
        self.layer(layer).pending_slots()
    }

    fn capacity_tokens(&self, seq: usize) -> usize {
        self.seq(seq).1
    }

    fn window(&self, seq: usize, layer: usize, slot: usize) -> &[f32] {
        &self.states[self.window_range(seq, layer, slot)]
    }

    fn window_mut(&mut self, seq: usize, layer: usize, slot: usize) -> &mut [f32] {
        let r = self.window_range(seq, layer, slot);
        &mut self.states[r]
    }

    fn pending(&self, seq: usize, layer: usize, stream: Stream, slot: usize) -> &[f32] {
        &self.states[self.pending_range(seq, layer, stream, slot)]
    }

    fn pending_mut(&mut self, seq: usize, layer: usize, stream: Stream, slot: usize) -> &mut [f32] {
        let r = self.pending_range(seq, layer, stream, slot);
        &mut self.states[r]
    }

    fn entry(&self, seq: usize, layer: usize, stream: Stream, w: usize) -> &[f32] {
        let (p, r) = self.entry_range(seq, layer, stream, w);
        &self.pools[p].data()[r]
    }

    fn entry_mut(&mut self, seq: usize, layer: usize, stream: Stream, w: usize) -> &mut [f32] {
        let (p, r) = self.entry_range(seq, layer, stream, w);
        &mut self.pools[p].data_mut()[r]
    }

    fn keep_window(&mut self, seq: usize, layer: usize, p0: usize, rows: &[f32]) {
        self.keep(seq, layer, RingKind::Window, p0, rows);
    }

    fn keep_pending(&mut self, seq: usize, layer: usize, stream: Stream, p0: usize, rows: &[f32]) {
        self.keep(seq, layer, RingKind::Pending(stream), p0, rows);
    }
}

#[cfg(test)]
mod tests {
    use crate::cache::tests::tiny_config;
    use crate::cache::{CacheBudget, CacheConfig, CacheManager};
    use deepinfer_model::cache::{CacheView, Stream};

    /// (kind: 0 window / 1 pending / 2 entry, seq, layer, stream, slot or entry index).
    type Addr = (u8, usize, usize, Stream, usize);

    /// Every row and entry the view can address (tiny-a layers).
    fn addresses(v: &dyn CacheView, seqs: usize) -> Vec<Addr> {
        let mut out = Vec::new();
        let streams = [
            (Stream::Attn, [false, true, true, true]),
            (Stream::Indexer, [false, true, false, true]),
        ];
        let ratios = [0, 4, 8, 4];
        for s in 0..seqs {
            for layer in 0..4 {
                for slot in 0..v.window_slots() {
                    out.push((0, s, layer, Stream::Attn, slot));
                }
                for (stream, has) in streams {
                    if !has[layer] {
                        continue;
                    }
                    for slot in 0..v.pending_slots(layer) {
                        out.push((1, s, layer, stream, slot));
                    }
                    for w in 0..v.capacity_tokens(s) / ratios[layer] {
                        out.push((2, s, layer, stream, w));
                    }
                }
            }
        }
        out
    }

    fn get_mut(v: &mut dyn CacheView, a: Addr) -> &mut [f32] {
        match a.0 {
            0 => v.window_mut(a.1, a.2, a.4),
            1 => v.pending_mut(a.1, a.2, a.3, a.4),
            _ => v.entry_mut(a.1, a.2, a.3, a.4),
        }
    }

    fn get(v: &dyn CacheView, a: Addr) -> &[f32] {
        match a.0 {
            0 => v.window(a.1, a.2, a.4),
            1 => v.pending(a.1, a.2, a.3, a.4),
            _ => v.entry(a.1, a.2, a.3, a.4),
        }
    }

    #[test]
    fn writes_read_back_and_never_alias() {
        let cfg = CacheConfig {
            budget: CacheBudget::Bytes(4 << 20),
            max_seqs: 3,
            rollback_slack: 1,
            block_tokens: 8,
            prefix_caching: false,
            ..CacheConfig::default()
        };
        let mut m = CacheManager::new(&tiny_config(), cfg).unwrap();
        let (a, b, c) = (
            m.add_seq().unwrap(),
            m.add_seq().unwrap(),
            m.add_seq().unwrap(),
        );
        // Interleave growth so that the two sequences' blocks are not contiguous.
        for t in [8, 16, 24, 40] {
            m.ensure_capacity(a, t).unwrap();
            m.ensure_capacity(c, t).unwrap();
            m.ensure_capacity(b, t + 3).unwrap();
        }
        m.free_seq(c).unwrap();
        let mut view = m.view(&[b, a]).unwrap();
        assert_eq!(
            (view.len(), view.capacity_tokens(0), view.capacity_tokens(1)),
            (2, 43, 40)
        );
        let addrs = addresses(&view, 2);
        let widths = |a: &Addr| match (a.0, a.2, a.3) {
            (0, ..) => 96,
            (1, 2, _) => 192,
            (1, _, Stream::Attn) => 384,
            (1, _, Stream::Indexer) => 256,
            (_, _, Stream::Attn) => 96,
            (_, _, Stream::Indexer) => 64,
        };
        for (i, &addr) in addrs.iter().enumerate() {
            let row = get_mut(&mut view, addr);
            assert_eq!(row.len(), widths(&addr), "{addr:?}");
            for (j, x) in row.iter_mut().enumerate() {
                *x = (i * 1000 + j) as f32;
            }
        }
        for (i, &addr) in addrs.iter().enumerate() {
            let row = get(&view, addr);
            assert!(
                row.iter()
                    .enumerate()
                    .all(|(j, &x)| x == (i * 1000 + j) as f32),
                "{addr:?} was overwritten"
            );
        }
        // The data stays with the sequence, whatever batch position it takes.
        let view = m.view(&[a]).unwrap();
        let first_a = addrs.iter().position(|a| a.1 == 1).unwrap();
        assert_eq!(view.window(0, 0, 0)[0], (first_a * 1000) as f32);
    }

    #[test]
    #[should_panic(expected = "beyond the capacity")]
    fn entry_beyond_capacity_panics() {
        let cfg = CacheConfig {
            budget: CacheBudget::Bytes(1 << 20),
            block_tokens: 32,
            prefix_caching: false,
            ..CacheConfig::default()
        };
        let mut m = CacheManager::new(&tiny_config(), cfg).unwrap();
        let a = m.add_seq().unwrap();
        m.ensure_capacity(a, 7).unwrap();
        let view = m.view(&[a]).unwrap();
        let _ = view.entry(0, 1, Stream::Attn, 1);
    }

    #[test]
    #[should_panic(expected = "has no Indexer compressor")]
    fn missing_state_panics() {
        let cfg = CacheConfig {
            budget: CacheBudget::Bytes(1 << 20),
            block_tokens: 32,
            prefix_caching: false,
            ..CacheConfig::default()
        };
        let mut m = CacheManager::new(&tiny_config(), cfg).unwrap();
        let a = m.add_seq().unwrap();
        let view = m.view(&[a]).unwrap();
        let _ = view.pending(0, 2, Stream::Indexer, 0);
    }
}
