//! Where every float of the cache lives, computed once from the model config.
//!
//! A sequence's fixed-size state (window rings and compressors' pending rings of every layer)
//! is one contiguous *state slot*. Compressed entries and indexer keys grow with length and
//! live in *paged pools*, one per group of layers that grow at the same rate, so that one
//! block table per pool serves all of its layers: a block holds the entries of
//! `block_tokens` tokens of every member layer, member-major (`[member][entry][width]`).
//! Every pool's block `b` thus covers the same tokens, `b·block_tokens..(b+1)·block_tokens`:
//! the unit the prefix cache shares.
//!
//! A *snapshot* holds what of the state slot a sequence resumed at a block boundary `P`
//! still reads: the window rows of `P − W..P` and, for the overlapping (CSA) compressors,
//! the pending rows of the window before `P` ([`SnapshotLayout`]).

use std::ops::Range;

use deepinfer_model::cache::Stream;
use deepinfer_model::config::{AttnKind, EntryPool, LayerState, ModelConfig};
use deepinfer_model::record;

use super::CacheError;

/// A ring of `slots` rows of `width` floats at `offset` inside a state slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ring {
    pub offset: usize,
    pub slots: usize,
    pub width: usize,
}

impl Ring {
    pub fn floats(&self) -> usize {
        self.slots * self.width
    }

    /// Floats of row `slot`, relative to the state slot's start.
    ///
    /// # Panics
    /// If `slot >= self.slots`.
    pub fn row(&self, slot: usize) -> Range<usize> {
        assert!(
            slot < self.slots,
            "ring slot {slot} out of range: the ring has {} slots",
            self.slots
        );
        let start = self.offset + slot * self.width;
        start..start + self.width
    }
}

/// Where one layer's entries of one stream live: pool index and the layer's index among that
/// pool's member layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryPlace {
    pub pool: usize,
    pub member: usize,
}

/// The state of one layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerLayout {
    pub kind: AttnKind,
    /// Tokens per compressed entry `m` (0 for sliding layers).
    pub ratio: usize,
    pub window: Ring,
    pub attn_pending: Option<Ring>,
    pub index_pending: Option<Ring>,
    pub attn_entries: Option<EntryPlace>,
    pub index_entries: Option<EntryPlace>,
}

impl LayerLayout {
    pub fn pending(&self, stream: Stream) -> Option<Ring> {
        match stream {
            Stream::Attn => self.attn_pending,
            Stream::Indexer => self.index_pending,
        }
    }

    pub fn entries(&self, stream: Stream) -> Option<EntryPlace> {
        match stream {
            Stream::Attn => self.attn_entries,
            Stream::Indexer => self.index_entries,
        }
    }

    /// Slots of the pending rings (0 for a layer without a compressor).
    pub fn pending_slots(&self) -> usize {
        self.attn_pending.map_or(0, |r| r.slots)
    }
}

/// One paged pool: the entries of `layers`, `width` floats each, one entry per `ratio` tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolLayout {
    pub name: &'static str,
    pub layers: Vec<usize>,
    pub width: usize,
    pub ratio: usize,
    pub block_entries: usize,
}

impl PoolLayout {
    pub fn block_floats(&self) -> usize {
        self.layers.len() * self.block_entries * self.width
    }

    pub fn block_bytes(&self) -> usize {
        self.block_floats() * size_of::<f32>()
    }

    /// Entries that exist once `tokens` tokens have been processed.
    pub fn entries_for(&self, tokens: usize) -> usize {
        tokens / self.ratio
    }

    /// Blocks needed to hold every entry of `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        self.entries_for(tokens).div_ceil(self.block_entries)
    }

    /// Floats the pool grows by per window of `ratio` tokens (bytes per token =
    /// `window_floats · 4 / ratio`).
    pub fn window_floats(&self) -> usize {
        self.layers.len() * self.width
    }

    /// Floats of entry `w` of member layer `member` in a block table, relative to the pool's
    /// storage.
    pub fn entry_range(&self, table: &[usize], member: usize, w: usize) -> Range<usize> {
        let block = table[w / self.block_entries];
        let start = block * self.block_floats()
            + (member * self.block_entries + w % self.block_entries) * self.width;
        start..start + self.width
    }
}

/// The block size an engine uses unless told: the smallest multiple of every compress ratio
/// that is at least 128 tokens (prefix reuse comes in whole blocks, and each block boundary
/// costs a snapshot of the window; see docs/SERVER.md, "Prefix caching").
pub fn default_block_tokens(cfg: &ModelConfig) -> usize {
    let lcm = [cfg.compress_rate_csa, cfg.compress_rate_hca]
        .into_iter()
        .filter(|&m| m > 0)
        .fold(1, |l, m| lcm(l, m as u128)) as usize;
    128usize.div_ceil(lcm) * lcm
}

/// The least common multiple (block sizes and budgets compare compress ratios in integers).
pub(super) fn lcm(a: u128, b: u128) -> u128 {
    fn gcd(a: u128, b: u128) -> u128 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}

/// The rows of one ring a snapshot keeps: those of the `rows` positions before the boundary,
/// at `offset` in the snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotPart {
    pub layer: usize,
    pub what: RingKind,
    pub ring: Ring,
    pub rows: usize,
    pub offset: usize,
}

/// Which ring of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingKind {
    Window,
    Pending(Stream),
}

/// What a snapshot holds: every main layer's window rows, and the pending rows the
/// overlapping compressors read after the boundary (draft layers keep none: the drafter
/// starts its window where a sequence resumed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotLayout {
    pub parts: Vec<SnapshotPart>,
    pub floats: usize,
}

impl SnapshotLayout {
    pub fn bytes(&self) -> usize {
        self.floats * size_of::<f32>()
    }

    /// Floats of position `pos`'s row of `part` in a snapshot taken at `boundary`, if the
    /// part keeps that position.
    pub fn row(&self, part: &SnapshotPart, boundary: usize, pos: usize) -> Option<Range<usize>> {
        let first = boundary.saturating_sub(part.rows);
        (first..boundary).contains(&pos).then(|| {
            let i = part.rows - (boundary - pos);
            let start = part.offset + i * part.ring.width;
            start..start + part.ring.width
        })
    }
}

/// The whole cache's geometry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheLayout {
    pub window_slots: usize,
    pub rollback_slack: usize,
    /// Tokens every paged block covers (in every pool), and between snapshot boundaries.
    pub block_tokens: usize,
    pub layers: Vec<LayerLayout>,
    pub pools: Vec<PoolLayout>,
    /// Floats of one sequence's state slot.
    pub slot_floats: usize,
    pub snapshot: SnapshotLayout,
}

/// Names of V4's paged pools, in allocation order (V4.1's are named by ratio).
pub use deepinfer_model::config::{CSA_ENTRIES, HCA_ENTRIES, INDEXER_KEYS};

impl CacheLayout {
    /// Layout for the decoder layers of `cfg` as its [`CachePlan`] says, then `draft_layers`
    /// sliding-window layers for a draft model (the MTP block), which keep only a window
    /// ring. Blocks cover `block_tokens` tokens, a multiple of every compression ratio.
    pub fn new(
        cfg: &ModelConfig,
        rollback_slack: usize,
        block_tokens: usize,
        draft_layers: usize,
    ) -> Result<Self, CacheError> {
        if block_tokens == 0 {
            return Err(bad_block(block_tokens, "a block covers at least one token"));
        }
        let plan = cfg.cache_plan();
        let draft = std::iter::repeat_n(LayerState::SLIDING, draft_layers);
        let states: Vec<LayerState> = plan.layers.iter().copied().chain(draft).collect();
        let mut slot = SlotBuilder {
            cfg,
            window_slots: cfg.sliding_window + rollback_slack,
            rollback_slack,
            floats: 0,
            members: vec![Vec::new(); plan.pools.len()],
        };
        let mut layers = Vec::with_capacity(states.len());
        for (layer, st) in states.iter().enumerate() {
            layers.push(slot.layer(layer, st)?);
        }
        let pools = paged_pools(cfg, &plan.pools, slot.members, block_tokens, &mut layers)?;
        let snapshot = snapshot_layout(&layers[..cfg.layer_types.len()], cfg.sliding_window);
        Ok(Self {
            window_slots: slot.window_slots,
            rollback_slack,
            block_tokens,
            layers,
            pools,
            slot_floats: slot.floats,
            snapshot,
        })
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_floats * size_of::<f32>()
    }
}

fn bad_block(block_tokens: usize, reason: &'static str) -> CacheError {
    CacheError::InvalidConfig {
        field: "block_size",
        value: block_tokens.to_string(),
        reason,
    }
}

/// Lays out one sequence's state slot ring by ring, layer by layer, and notes which layers
/// each entry pool serves.
struct SlotBuilder<'a> {
    cfg: &'a ModelConfig,
    window_slots: usize,
    rollback_slack: usize,
    /// Floats laid out so far.
    floats: usize,
    /// Every pool's member layers, in order.
    members: Vec<Vec<usize>>,
}

impl SlotBuilder<'_> {
    fn ring(&mut self, slots: usize, width: usize) -> Ring {
        let r = Ring {
            offset: self.floats,
            slots,
            width,
        };
        self.floats += r.floats();
        r
    }

    fn place(&mut self, pool: usize, layer: usize) -> EntryPlace {
        self.members[pool].push(layer);
        EntryPlace {
            pool,
            member: self.members[pool].len() - 1,
        }
    }

    /// Layer `layer`'s rings (its window, then the pending rows of what it compresses) and
    /// its places in the entry pools. KV vectors are as the numerics stores them (f32 or
    /// packed records); pending rows are always f32.
    fn layer(&mut self, layer: usize, st: &LayerState) -> Result<LayerLayout, CacheError> {
        if st.kind != AttnKind::Sliding && st.ratio == 0 {
            return Err(CacheError::InvalidConfig {
                field: "compress_rate",
                value: format!("0 (layer {layer})"),
                reason: "compressed layers need a ratio >= 1",
            });
        }
        let (hd, ihd) = (self.cfg.head_dim, self.cfg.index_head_dim);
        let window = self.ring(self.window_slots, record::kv_words(self.cfg));
        let slots = st.coff * st.ratio + self.rollback_slack;
        let attn_pending = st.entries.map(|_| self.ring(slots, 2 * st.coff * hd));
        let own_keys = st.keys.filter(|&(_, own)| own);
        let index_pending = own_keys.map(|_| self.ring(slots, 2 * st.coff * ihd));
        Ok(LayerLayout {
            kind: st.kind,
            ratio: st.ratio,
            window,
            attn_pending,
            index_pending,
            attn_entries: st.entries.map(|p| self.place(p, layer)),
            index_entries: st.keys.map(|(p, _)| self.place(p, layer)),
        })
    }
}

/// The pools some layer uses, numbered densely (the layers' places renumbered to match),
/// each with blocks of `block_tokens` tokens.
fn paged_pools(
    cfg: &ModelConfig,
    plan: &[EntryPool],
    members: Vec<Vec<usize>>,
    block_tokens: usize,
    layers: &mut [LayerLayout],
) -> Result<Vec<PoolLayout>, CacheError> {
    let (kv, key) = (record::kv_words(cfg), record::key_words(cfg));
    let mut index = vec![usize::MAX; plan.len()];
    let mut pools = Vec::new();
    for (g, (p, layers)) in plan.iter().zip(members).enumerate() {
        if layers.is_empty() {
            continue;
        }
        if !block_tokens.is_multiple_of(p.ratio) {
            return Err(bad_block(
                block_tokens,
                "a block covers whole compression windows: a multiple of every compress ratio",
            ));
        }
        index[g] = pools.len();
        pools.push(PoolLayout {
            name: p.name,
            layers,
            width: if p.keys { key } else { kv },
            ratio: p.ratio,
            block_entries: block_tokens / p.ratio,
        });
    }
    for l in layers {
        for p in [&mut l.attn_entries, &mut l.index_entries]
            .into_iter()
            .flatten()
        {
            p.pool = index[p.pool];
        }
    }
    Ok(pools)
}

/// The rings a sequence resumed at a block boundary reads before rewriting them: the window
/// (`window` rows) of every layer, and the window before the boundary (`m` rows) of each
/// overlapping compressor (a CSA entry pools the previous window too; an HCA one only its
/// own).
fn snapshot_layout(layers: &[LayerLayout], window: usize) -> SnapshotLayout {
    let mut out = SnapshotLayout::default();
    for (layer, l) in layers.iter().enumerate() {
        let mut part = |what, ring: Ring, rows: usize| {
            out.parts.push(SnapshotPart {
                layer,
                what,
                ring,
                rows,
                offset: out.floats,
            });
            out.floats += rows * ring.width;
        };
        part(RingKind::Window, l.window, window);
        if l.kind == AttnKind::Csa {
            for stream in [Stream::Attn, Stream::Indexer] {
                if let Some(ring) = l.pending(stream) {
                    part(RingKind::Pending(stream), ring, l.ratio);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::tests::tiny_config;

    #[test]
    fn tiny_sizes() {
        // tiny-a: [sliding, csa, hca, csa], csa m=4, hca m=8, head_dim 96, index_head_dim 64,
        // sliding_window 8.
        let l = CacheLayout::new(&tiny_config(), 2, 32, 0).unwrap();
        assert_eq!(l.window_slots, 10);
        let pend: Vec<usize> = l.layers.iter().map(LayerLayout::pending_slots).collect();
        assert_eq!(pend, [0, 2 * 4 + 2, 8 + 2, 2 * 4 + 2]);
        let csa = &l.layers[1];
        assert_eq!(csa.attn_pending.unwrap().width, 2 * 2 * 96);
        assert_eq!(csa.index_pending.unwrap().width, 2 * 2 * 64);
        let hca = &l.layers[2];
        assert_eq!(hca.attn_pending.unwrap().width, 2 * 96);
        assert_eq!(hca.index_pending, None);
        // 4 windows + 2 csa × 10 × (384 + 256) + 1 hca × 10 × 192
        assert_eq!(l.slot_floats, 4 * 10 * 96 + 2 * 10 * (384 + 256) + 10 * 192);
        assert_eq!(l.slot_bytes(), 4 * l.slot_floats);

        let names: Vec<_> = l.pools.iter().map(|p| p.name).collect();
        assert_eq!(names, [CSA_ENTRIES, HCA_ENTRIES, INDEXER_KEYS]);
        assert_eq!(l.pools[0].layers, [1, 3]);
        assert_eq!(l.pools[0].block_floats(), 2 * 8 * 96);
        assert_eq!(l.pools[1].layers, [2]);
        assert_eq!(l.pools[1].block_floats(), 4 * 96);
        assert_eq!(l.pools[2].block_floats(), 2 * 8 * 64);
        assert_eq!(l.pools[1].ratio, 8);
        assert_eq!(
            l.layers[3].attn_entries,
            Some(EntryPlace { pool: 0, member: 1 })
        );
        assert_eq!(
            l.layers[3].index_entries,
            Some(EntryPlace { pool: 2, member: 1 })
        );
        assert_eq!(
            l.layers[2].attn_entries,
            Some(EntryPlace { pool: 1, member: 0 })
        );
        assert_eq!(l.pools[0].blocks_for(3), 0);
        assert_eq!(l.pools[0].blocks_for(4), 1);
        assert_eq!(l.pools[0].blocks_for(32), 1);
        assert_eq!(l.pools[0].blocks_for(33), 1);
        assert_eq!(l.pools[0].blocks_for(36), 2);
    }

    #[test]
    fn draft_layers_add_a_window_ring_each() {
        let main = CacheLayout::new(&tiny_config(), 2, 32, 0).unwrap();
        let l = CacheLayout::new(&tiny_config(), 2, 32, 1).unwrap();
        assert_eq!(l.layers.len(), 5);
        let mtp = &l.layers[4];
        assert_eq!(mtp.kind, AttnKind::Sliding);
        assert_eq!(mtp.window.offset, main.slot_floats);
        assert_eq!(mtp.window.floats(), 10 * 96);
        assert_eq!((mtp.attn_pending, mtp.attn_entries), (None, None));
        assert_eq!(l.slot_floats, main.slot_floats + 10 * 96);
        assert_eq!(l.pools, main.pools, "draft layers have no paged state");
    }

    #[test]
    fn rings_tile_the_slot() {
        let l = CacheLayout::new(&tiny_config(), 3, 16, 0).unwrap();
        let mut rings: Vec<Ring> = l
            .layers
            .iter()
            .flat_map(|l| [Some(l.window), l.attn_pending, l.index_pending])
            .flatten()
            .collect();
        rings.sort_by_key(|r| r.offset);
        let mut end = 0;
        for r in rings {
            assert_eq!(r.offset, end);
            end += r.floats();
        }
        assert_eq!(end, l.slot_floats);
    }

    #[test]
    fn empty_groups_have_no_pool() {
        let mut cfg = tiny_config();
        cfg.layer_types = vec![AttnKind::Sliding, AttnKind::Hca];
        let l = CacheLayout::new(&cfg, 0, 32, 0).unwrap();
        assert_eq!(l.pools.len(), 1);
        assert_eq!(l.pools[0].name, HCA_ENTRIES);
        assert_eq!(
            l.layers[1].attn_entries,
            Some(EntryPlace { pool: 0, member: 0 })
        );
        assert!(CacheLayout::new(&cfg, 0, 0, 0).is_err());
        // 12 tokens are not whole HCA windows of 8.
        let e = CacheLayout::new(&cfg, 0, 12, 0).unwrap_err();
        assert!(e.to_string().contains("block_size"), "{e}");
    }

    #[test]
    fn entry_range_follows_table() {
        let l = CacheLayout::new(&tiny_config(), 0, 16, 0).unwrap();
        let p = &l.pools[0]; // 2 layers × 4 entries × 96
        let table = [5, 2];
        assert_eq!(p.entry_range(&table, 0, 0), 5 * 768..5 * 768 + 96);
        assert_eq!(p.entry_range(&table, 1, 3).start, 5 * 768 + (4 + 3) * 96);
        assert_eq!(p.entry_range(&table, 1, 6).start, 2 * 768 + (4 + 2) * 96);
    }

    #[test]
    fn snapshots_keep_the_window_and_the_overlap() {
        // tiny-a: [sliding, csa, hca, csa], window 8, csa m=4; a draft layer keeps nothing.
        let l = CacheLayout::new(&tiny_config(), 2, 32, 1).unwrap();
        let s = &l.snapshot;
        let kinds: Vec<_> = s.parts.iter().map(|p| (p.layer, p.what, p.rows)).collect();
        let (w, a, i) = (
            RingKind::Window,
            RingKind::Pending(Stream::Attn),
            RingKind::Pending(Stream::Indexer),
        );
        assert_eq!(
            kinds,
            [
                (0, w, 8),
                (1, w, 8),
                (1, a, 4),
                (1, i, 4),
                (2, w, 8),
                (3, w, 8),
                (3, a, 4),
                (3, i, 4)
            ]
        );
        assert_eq!(s.floats, 4 * 8 * 96 + 2 * 4 * (384 + 256));
        let part = &s.parts[2];
        assert_eq!(s.row(part, 32, 27), None);
        assert_eq!(s.row(part, 32, 28), Some(part.offset..part.offset + 384));
        assert_eq!(s.row(part, 32, 31).unwrap().start, part.offset + 3 * 384);
        assert_eq!(s.row(part, 32, 32), None);
        // Near the start the rows before position 0 do not exist.
        assert_eq!(s.row(&s.parts[0], 4, 0).unwrap().start, 4 * 96);
    }
}
