//! The owner of all cache memory: hands out state slots and blocks to sequences.

use std::collections::HashMap;
use std::fmt;

use deepinfer_model::config::ModelConfig;

use super::block_pool::{BlockPool, BlockTable};
use super::budget::{min_pool_bytes, split, CacheBudget};
use super::layout::CacheLayout;
use super::prefix::PrefixCache;
use super::view::{BatchView, Capture};
use super::CacheError;

mod disk;
mod reuse;

/// How big the cache is and what it must allow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheConfig {
    pub budget: CacheBudget,
    /// Sequences that can hold state at once (one state slot each).
    pub max_seqs: usize,
    /// Extra ring slots beyond what the model reads: a sequence may be truncated by at most
    /// this many tokens below the furthest position it has written.
    pub rollback_slack: usize,
    /// Tokens per block (vLLM's `--block-size`): every paged pool's block covers this many
    /// tokens, and the prefix cache shares whole blocks; a multiple of every compress ratio.
    pub block_tokens: usize,
    /// Window-only layers of a draft model (the MTP block) kept after the main layers.
    pub draft_layers: usize,
    /// Keep computed blocks for later requests that start with the same tokens.
    pub prefix_caching: bool,
}

/// One sequence in 64 MiB with vLLM's defaults otherwise (prefix caching on, 128-token blocks:
/// V4's compress ratios 4 and 128 divide it, as [`super::default_block_tokens`] would choose
/// for V4's shipped configs), so that a caller names only what it changes.
impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            budget: CacheBudget::Bytes(64 << 20),
            max_seqs: 1,
            rollback_slack: 0,
            block_tokens: 128,
            draft_layers: 0,
            prefix_caching: true,
        }
    }
}

/// A sequence's handle. Never reused, so a stale handle is reported, not confused with a
/// newer sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(u64);

impl SeqId {
    /// A handle no manager gave out (for fake allocators in tests).
    #[cfg(test)]
    pub(crate) fn fake(n: u64) -> Self {
        Self(n)
    }
}

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq#{}", self.0)
    }
}

/// Occupancy of one pool (the state slots are reported as pool `"state_slots"`, one block
/// per slot). Blocks only the prefix cache holds count as `cached`, not used: a request
/// that needs them evicts them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    pub name: &'static str,
    pub used_blocks: usize,
    pub cached_blocks: usize,
    pub total_blocks: usize,
    pub used_bytes: usize,
    pub total_bytes: usize,
}

#[derive(Debug)]
struct SeqState {
    slot: usize,
    /// Tokens reserved; every table has exactly `blocks_for(capacity)` blocks.
    capacity: usize,
    /// The most tokens ever reserved: the rings may hold rows up to here (only what is
    /// reserved is written), which bounds how far back a truncation may go.
    high_water: usize,
    /// The prefix-cache node of this sequence's last cached block (pinned while it runs:
    /// its next block becomes the node's child), and how many blocks are cached.
    tip: Option<usize>,
    cached_blocks: usize,
}

/// Block boundaries a step's tokens usually cross (more grow the buffers once).
const CAPTURES_PER_SEQ: usize = 4;

/// All cache memory of the engine: `max_seqs` state slots and one paged pool per group of
/// layers whose entries grow at the same rate.
pub struct CacheManager {
    layout: CacheLayout,
    max_seqs: usize,
    states: Vec<f32>,
    free_slots: Vec<usize>,
    pools: Vec<BlockPool>,
    seqs: HashMap<SeqId, SeqState>,
    /// Block tables by state slot, one per pool: kept for the slot's next sequence, so
    /// admitting one allocates nothing.
    slot_tables: Vec<Vec<BlockTable>>,
    /// `(slot, capacity)` of the sequences of the last view, reused.
    batch: Vec<(usize, usize)>,
    /// The snapshots the last view's sequences are taking.
    captures: Vec<Capture>,
    /// The snapshots each state slot's sequence is taking this step, `(boundary, record)`
    /// (kept per slot, so taking one allocates nothing).
    slot_captures: Vec<Vec<(usize, usize)>>,
    prefix: Option<PrefixCache>,
    next_id: u64,
}

/// The layout of a manager built from `cache`.
fn layout_of(cfg: &ModelConfig, cache: &CacheConfig) -> Result<CacheLayout, CacheError> {
    CacheLayout::new(
        cfg,
        cache.rollback_slack,
        cache.block_tokens,
        cache.draft_layers,
    )
}

/// What a cache costs whatever its budget ([`CacheManager::sizes_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheSizes {
    /// One sequence's state slot (window rings, compressor rows).
    pub slot_bytes: usize,
    /// One block of each paged pool, and one snapshot record with prefix caching.
    pub min_pool_bytes: usize,
}

/// The longest sequence pools of `blocks` blocks each hold (the shortest-lived pool decides;
/// a layout without paged pools holds any length).
fn tokens_held(layout: &CacheLayout, blocks: impl Iterator<Item = usize>) -> usize {
    layout
        .pools
        .iter()
        .zip(blocks)
        .map(|(l, n)| {
            n.saturating_mul(l.block_entries)
                .saturating_add(1)
                .saturating_mul(l.ratio)
                - 1
        })
        .min()
        .unwrap_or(usize::MAX)
}

impl CacheManager {
    /// Allocates the whole budget once (zeroed memory, committed by the OS as it is touched).
    pub fn new(cfg: &ModelConfig, cache: CacheConfig) -> Result<Self, CacheError> {
        if cache.max_seqs == 0 {
            return Err(CacheError::InvalidConfig {
                field: "max_seqs",
                value: "0".into(),
                reason: "the cache must hold at least one sequence",
            });
        }
        let layout = layout_of(cfg, &cache)?;
        let budget = cache.budget.resolve()?;
        if budget > isize::MAX as usize {
            return Err(CacheError::InvalidConfig {
                field: "budget",
                value: format!("{budget} bytes"),
                reason: "larger than the address space",
            });
        }
        let split = split(&layout, budget, cache.max_seqs, cache.prefix_caching)?;
        let pools: Vec<BlockPool> = layout
            .pools
            .iter()
            .zip(&split.blocks)
            .map(|(p, &n)| BlockPool::new(p.name, p.block_floats(), n))
            .collect();
        // A node holds a block of every pool, so there are never more nodes than the
        // smallest pool has blocks (a layout without pools keeps snapshots only).
        let max_nodes = split
            .blocks
            .iter()
            .copied()
            .min()
            .unwrap_or(split.snapshots);
        let prefix = cache.prefix_caching.then(|| {
            PrefixCache::new(
                cache.block_tokens,
                pools.len(),
                max_nodes,
                layout.snapshot.floats,
                split.snapshots,
            )
        });
        let this = Self {
            states: vec![0.0; cache.max_seqs * layout.slot_floats],
            free_slots: (0..cache.max_seqs).rev().collect(),
            max_seqs: cache.max_seqs,
            layout,
            slot_tables: vec![vec![BlockTable::default(); pools.len()]; cache.max_seqs],
            pools,
            seqs: HashMap::new(),
            batch: Vec::with_capacity(cache.max_seqs),
            captures: Vec::with_capacity(CAPTURES_PER_SEQ * cache.max_seqs),
            slot_captures: vec![Vec::with_capacity(CAPTURES_PER_SEQ); cache.max_seqs],
            prefix,
            next_id: 0,
        };
        for u in this.usage() {
            tracing::info!(
                pool = u.name,
                blocks = u.total_blocks,
                mib = u.total_bytes as f64 / (1 << 20) as f64,
                "cache pool"
            );
        }
        if let Some(p) = &this.prefix {
            let u = p.usage();
            tracing::info!(
                snapshots = u.snapshot_capacity,
                mib =
                    (u.snapshot_capacity * this.layout.snapshot.bytes()) as f64 / (1 << 20) as f64,
                block_tokens = this.layout.block_tokens,
                "prefix cache"
            );
        }
        Ok(this)
    }

    pub fn layout(&self) -> &CacheLayout {
        &self.layout
    }

    pub fn max_seqs(&self) -> usize {
        self.max_seqs
    }

    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }

    pub fn rollback_slack(&self) -> usize {
        self.layout.rollback_slack
    }

    pub fn window_slots(&self) -> usize {
        self.layout.window_slots
    }

    /// Pending-ring slots of `layer` (0 for a sliding layer).
    ///
    /// # Panics
    /// If `layer` is not a decoder layer of the model.
    pub fn pending_slots(&self, layer: usize) -> usize {
        self.layout.layers[layer].pending_slots()
    }

    /// Starts a sequence with capacity 0. Its state slot is not cleared: the model writes
    /// every row before reading it.
    pub fn add_seq(&mut self) -> Result<SeqId, CacheError> {
        let slot = self.free_slots.pop().ok_or(CacheError::NoFreeSlot {
            max_seqs: self.max_seqs,
        })?;
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.seqs.insert(
            id,
            SeqState {
                slot,
                capacity: 0,
                high_water: 0,
                tip: None,
                cached_blocks: 0,
            },
        );
        Ok(id)
    }

    fn state(&self, seq: SeqId) -> Result<&SeqState, CacheError> {
        self.seqs.get(&seq).ok_or(CacheError::UnknownSeq(seq))
    }

    /// Tokens reserved for `seq` so far.
    pub fn capacity_tokens(&self, seq: SeqId) -> Result<usize, CacheError> {
        Ok(self.state(seq)?.capacity)
    }

    /// Reserves blocks in every pool so that all entries of `tokens` tokens fit, evicting
    /// cached prefixes no sequence holds when a pool is short. All or nothing: on failure
    /// every block taken by this call is returned.
    pub fn ensure_capacity(&mut self, seq: SeqId, tokens: usize) -> Result<(), CacheError> {
        let s = self.seqs.get_mut(&seq).ok_or(CacheError::UnknownSeq(seq))?;
        if tokens <= s.capacity {
            return Ok(());
        }
        let tables = &mut self.slot_tables[s.slot];
        for i in 0..self.pools.len() {
            let want = self.layout.pools[i].blocks_for(tokens);
            while let Err(e) = self.pools[i].grow(&mut tables[i], want) {
                let evicted = self
                    .prefix
                    .as_mut()
                    .is_some_and(|p| p.evict_for(i, &mut self.pools));
                if evicted {
                    continue;
                }
                for (j, table) in tables.iter_mut().enumerate().take(i) {
                    let had = self.layout.pools[j].blocks_for(s.capacity);
                    self.pools[j].shrink(table, had);
                }
                return Err(e);
            }
        }
        s.capacity = tokens;
        s.high_water = s.high_water.max(tokens);
        Ok(())
    }

    /// Shortens `seq` to `tokens` (rejected draft tokens, a rollback) and releases the
    /// blocks no longer needed. Data is not touched: the next step rewrites every row past
    /// `tokens` before anything reads it, which holds only while the rings still keep the
    /// rows below: at most `rollback_slack` tokens under the furthest ever reserved.
    pub fn truncate(&mut self, seq: SeqId, tokens: usize) -> Result<(), CacheError> {
        let slack = self.layout.rollback_slack;
        let s = self.seqs.get_mut(&seq).ok_or(CacheError::UnknownSeq(seq))?;
        if tokens > s.capacity {
            return Err(CacheError::TruncateBeyondCapacity {
                seq,
                to: tokens,
                capacity: s.capacity,
            });
        }
        if s.high_water - tokens > slack {
            return Err(CacheError::TruncateTooFar {
                seq,
                to: tokens,
                high_water: s.high_water,
                slack,
            });
        }
        let tables = &mut self.slot_tables[s.slot];
        for (i, pool) in self.pools.iter_mut().enumerate() {
            pool.shrink(&mut tables[i], self.layout.pools[i].blocks_for(tokens));
        }
        s.capacity = tokens;
        Ok(())
    }

    /// Returns `seq`'s state slot and all its blocks (those the prefix cache holds stay
    /// cached).
    pub fn free_seq(&mut self, seq: SeqId) -> Result<(), CacheError> {
        let s = self.seqs.remove(&seq).ok_or(CacheError::UnknownSeq(seq))?;
        for (pool, table) in self.pools.iter_mut().zip(&mut self.slot_tables[s.slot]) {
            pool.shrink(table, 0);
        }
        if let Some(p) = &mut self.prefix {
            if let Some(tip) = s.tip {
                // Where the sequence ended is where a next turn resumes.
                p.store_snapshot(tip);
                p.unpin(tip);
            }
            for (_, rec) in self.slot_captures[s.slot].drain(..) {
                p.free_snapshot(rec);
            }
        }
        self.free_slots.push(s.slot);
        Ok(())
    }

    /// The longest sequence the pools could hold if it had them to itself: requests longer
    /// than this can never run, and admitting them would preempt forever.
    pub fn max_tokens_per_seq(&self) -> usize {
        tokens_held(&self.layout, self.pools.iter().map(BlockPool::total_blocks))
    }

    /// What [`Self::max_tokens_per_seq`] gives for a manager built from `cache`, without
    /// allocating one.
    pub fn max_tokens_for(cfg: &ModelConfig, cache: CacheConfig) -> Result<usize, CacheError> {
        let layout = layout_of(cfg, &cache)?;
        let split = split(
            &layout,
            cache.budget.resolve()?,
            cache.max_seqs,
            cache.prefix_caching,
        )?;
        Ok(tokens_held(&layout, split.blocks.into_iter()))
    }

    /// The fixed costs of a manager built from `cache`: what one sequence's state slot
    /// takes, and the least the paged pools (and the snapshot store) need beside the slots.
    pub fn sizes_for(cfg: &ModelConfig, cache: CacheConfig) -> Result<CacheSizes, CacheError> {
        let layout = layout_of(cfg, &cache)?;
        Ok(CacheSizes {
            slot_bytes: layout.slot_bytes(),
            min_pool_bytes: min_pool_bytes(&layout, cache.prefix_caching),
        })
    }

    /// Occupancy: `"state_slots"` first, then the paged pools in layout order.
    pub fn usage(&self) -> Vec<PoolUsage> {
        self.pool_usage().collect()
    }

    /// [`Self::usage`] without collecting it (the engine reads it every step).
    pub fn pool_usage(&self) -> impl Iterator<Item = PoolUsage> + '_ {
        let slot_bytes = self.layout.slot_bytes();
        let used_slots = self.max_seqs - self.free_slots.len();
        let slots = PoolUsage {
            name: "state_slots",
            used_blocks: used_slots,
            cached_blocks: 0,
            total_blocks: self.max_seqs,
            used_bytes: used_slots * slot_bytes,
            total_bytes: self.max_seqs * slot_bytes,
        };
        std::iter::once(slots).chain(self.pools.iter().map(|p| PoolUsage {
            name: p.name(),
            used_blocks: p.used_blocks(),
            cached_blocks: p.cached_blocks(),
            total_blocks: p.total_blocks(),
            used_bytes: p.used_blocks() * p.block_bytes(),
            total_bytes: p.total_blocks() * p.block_bytes(),
        }))
    }

    /// The cache state of one batch; batch span `i` is `seqs[i]`.
    pub fn view(&mut self, seqs: &[SeqId]) -> Result<BatchView<'_>, CacheError> {
        self.batch.clear();
        self.captures.clear();
        for (i, &id) in seqs.iter().enumerate() {
            if seqs[..i].contains(&id) {
                return Err(CacheError::DuplicateSeq(id));
            }
            let s = self.seqs.get(&id).ok_or(CacheError::UnknownSeq(id))?;
            self.batch.push((s.slot, s.capacity));
            self.captures.extend(
                self.slot_captures[s.slot]
                    .iter()
                    .map(|&(boundary, record)| Capture {
                        seq: i,
                        boundary,
                        record,
                    }),
            );
        }
        let snapshots = self
            .prefix
            .as_mut()
            .map(|p| (&self.layout.snapshot, p.snapshot_data_mut()));
        Ok(BatchView::new(
            &self.layout,
            &mut self.states,
            &mut self.pools,
            &self.slot_tables,
            &self.batch,
            snapshots.map(|(l, d)| (l, d, &self.captures[..])),
        ))
    }
}

impl Drop for CacheManager {
    /// A clean shutdown leaves what memory cached on disk (if there is a disk tier), for the
    /// next start.
    fn drop(&mut self) {
        if let Some(p) = &mut self.prefix {
            p.spill_all(&self.pools);
        }
    }
}

impl fmt::Debug for CacheManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheManager")
            .field("pools", &self.pools)
            .field("max_seqs", &self.max_seqs)
            .field("seqs", &self.seqs.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::tests::tiny_config;

    fn manager(budget: usize, max_seqs: usize) -> CacheManager {
        let cfg = CacheConfig {
            budget: CacheBudget::Bytes(budget),
            max_seqs,
            rollback_slack: 2,
            block_tokens: 32,
            prefix_caching: false,
            ..CacheConfig::default()
        };
        CacheManager::new(&tiny_config(), cfg).unwrap()
    }

    fn slot_bytes() -> usize {
        CacheLayout::new(&tiny_config(), 2, 32, 0)
            .unwrap()
            .slot_bytes()
    }

    /// Bytes of one block of each pool (csa, hca, indexer) for tiny-a with 32-token blocks.
    const MIN_POOLS: usize = 6144 + 1536 + 4096;

    impl CacheManager {
        fn check_invariants(&self) {
            let mut slots: Vec<usize> = self.seqs.values().map(|s| s.slot).collect();
            slots.extend(&self.free_slots);
            slots.sort_unstable();
            assert_eq!(slots, (0..self.max_seqs).collect::<Vec<_>>(), "slots");
            for (i, pool) in self.pools.iter().enumerate() {
                let mut owned = vec![false; pool.total_blocks()];
                for s in self.seqs.values() {
                    let t = &self.slot_tables[s.slot][i];
                    assert_eq!(t.len(), self.layout.pools[i].blocks_for(s.capacity));
                    for &b in t.blocks() {
                        assert!(!owned[b], "pool {}: block {b} owned twice", pool.name());
                        assert!(pool.is_used(b));
                        owned[b] = true;
                    }
                }
                let used = owned.iter().filter(|&&o| o).count();
                assert_eq!(used, pool.used_blocks(), "pool {}", pool.name());
                assert_eq!(used + pool.free_blocks(), pool.total_blocks());
            }
            let usage = self.usage();
            let block_bytes = std::iter::once(self.layout.slot_bytes())
                .chain(self.pools.iter().map(BlockPool::block_bytes));
            for (u, bb) in usage.iter().zip(block_bytes) {
                assert_eq!(u.used_bytes, u.used_blocks * bb, "{}", u.name);
                assert_eq!(u.total_bytes, u.total_blocks * bb, "{}", u.name);
                assert!(u.used_blocks <= u.total_blocks);
            }
        }
    }

    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn random_operations_keep_invariants() {
        let mut m = manager(4 * slot_bytes() + MIN_POOLS + 400_000, 4);
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let mut live: Vec<SeqId> = Vec::new();
        let (mut failures, mut successes) = (0, 0);
        let (mut truncations, mut refused) = (0, 0);
        for _ in 0..5000 {
            match rng.below(10) {
                0 | 1 => match m.add_seq() {
                    Ok(id) => live.push(id),
                    Err(e) => {
                        assert_eq!(live.len(), 4);
                        assert_eq!(e, CacheError::NoFreeSlot { max_seqs: 4 });
                    }
                },
                2..=5 if !live.is_empty() => {
                    let id = live[rng.below(live.len())];
                    let before = m.usage();
                    let cap = m.capacity_tokens(id).unwrap();
                    let tokens = cap + rng.below(400);
                    match m.ensure_capacity(id, tokens) {
                        Ok(()) => {
                            successes += 1;
                            assert_eq!(m.capacity_tokens(id).unwrap(), tokens);
                        }
                        Err(CacheError::OutOfBlocks { .. }) => {
                            failures += 1;
                            assert_eq!(m.usage(), before, "failed ensure changed usage");
                            assert_eq!(m.capacity_tokens(id).unwrap(), cap);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                6 | 7 if !live.is_empty() => {
                    let id = live[rng.below(live.len())];
                    let cap = m.capacity_tokens(id).unwrap();
                    let to = cap.saturating_sub(rng.below(4));
                    match m.truncate(id, to) {
                        Ok(()) => {
                            truncations += 1;
                            assert_eq!(m.capacity_tokens(id).unwrap(), to);
                        }
                        Err(CacheError::TruncateTooFar { high_water, .. }) => {
                            refused += 1;
                            assert!(high_water - to > 2, "{high_water} {to}");
                            assert_eq!(m.capacity_tokens(id).unwrap(), cap);
                        }
                        Err(e) => panic!("{e}"),
                    }
                    assert!(matches!(
                        m.truncate(id, m.capacity_tokens(id).unwrap() + 1),
                        Err(CacheError::TruncateBeyondCapacity { .. })
                    ));
                }
                8 | 9 if !live.is_empty() => {
                    let id = live.swap_remove(rng.below(live.len()));
                    m.free_seq(id).unwrap();
                    assert_eq!(m.free_seq(id), Err(CacheError::UnknownSeq(id)));
                }
                _ => {}
            }
            m.check_invariants();
        }
        assert!(failures > 10 && successes > 100, "{failures} {successes}");
        assert!(truncations > 100 && refused > 10, "{truncations} {refused}");
        for id in live.drain(..) {
            m.free_seq(id).unwrap();
        }
        m.check_invariants();
        for u in m.usage() {
            assert_eq!((u.used_blocks, u.used_bytes), (0, 0), "{}", u.name);
        }
    }

    #[test]
    fn exhaustion_leaves_everything_as_it_was() {
        // 23 552 spare bytes = 64 tokens of every pool: 1 + 2 blocks (32 tokens) each.
        let mut m = manager(3 * slot_bytes() + MIN_POOLS + 23_552, 3);
        let totals: Vec<usize> = m.usage().iter().map(|u| u.total_blocks).collect();
        assert_eq!(totals, [3, 3, 3, 3]);
        let (a, b, c) = (
            m.add_seq().unwrap(),
            m.add_seq().unwrap(),
            m.add_seq().unwrap(),
        );
        m.ensure_capacity(a, 9).unwrap();
        m.ensure_capacity(b, 32).unwrap();
        // c: 40 tokens need two csa blocks, one is left.
        let before = m.usage();
        let err = m.ensure_capacity(c, 40).unwrap_err();
        assert_eq!(
            err,
            CacheError::OutOfBlocks {
                pool: "csa_entries",
                needed: 2,
                free: 1
            }
        );
        assert!(err.to_string().contains("csa_entries"));
        assert_eq!(m.usage(), before);
        assert_eq!(m.capacity_tokens(c).unwrap(), 0);
        m.ensure_capacity(c, 32).unwrap();
        assert!(m.usage()[1..].iter().all(|u| u.used_blocks == 3));
        m.check_invariants();
        // Truncating a below its first HCA entry frees its hca block (within the slack of
        // 2: 9 → 7, not 6).
        assert!(matches!(
            m.truncate(a, 6),
            Err(CacheError::TruncateTooFar {
                high_water: 9,
                slack: 2,
                ..
            })
        ));
        m.truncate(a, 7).unwrap();
        assert_eq!(m.usage()[2].used_blocks, 2);
        assert_eq!(m.add_seq(), Err(CacheError::NoFreeSlot { max_seqs: 3 }));
        m.check_invariants();
    }

    #[test]
    fn unknown_sequences_are_errors() {
        let mut m = manager(slot_bytes() + MIN_POOLS, 1);
        let a = m.add_seq().unwrap();
        m.free_seq(a).unwrap();
        let b = m.add_seq().unwrap();
        assert_ne!(a, b, "ids are not reused");
        assert_eq!(m.free_seq(a), Err(CacheError::UnknownSeq(a)));
        assert_eq!(m.ensure_capacity(a, 4), Err(CacheError::UnknownSeq(a)));
        assert_eq!(m.truncate(a, 0), Err(CacheError::UnknownSeq(a)));
        assert_eq!(m.capacity_tokens(a), Err(CacheError::UnknownSeq(a)));
        assert_eq!(m.view(&[a]).err(), Some(CacheError::UnknownSeq(a)));
        assert_eq!(m.view(&[b, b]).err(), Some(CacheError::DuplicateSeq(b)));
        assert!(m.free_seq(a).unwrap_err().to_string().contains("seq#0"));
        m.free_seq(b).unwrap();
    }

    #[test]
    fn budget_too_small_for_slots() {
        let cfg = CacheConfig {
            budget: CacheBudget::Bytes(1000),
            max_seqs: 4,
            rollback_slack: 2,
            block_tokens: 32,
            prefix_caching: false,
            ..CacheConfig::default()
        };
        let e = CacheManager::new(&tiny_config(), cfg).unwrap_err();
        let msg = e.to_string();
        let sb = slot_bytes();
        let mib = super::super::mib;
        assert!(
            msg.starts_with("a cache budget of 0.01 MiB is too small: 4 sequences'"),
            "{msg}"
        );
        for n in [mib(sb), mib(4 * sb)] {
            assert!(msg.contains(&n), "{msg} lacks {n}");
        }
        assert!(matches!(e, CacheError::BudgetTooSmall { budget: 1000, .. }));
        let zero = CacheConfig { max_seqs: 0, ..cfg };
        assert!(matches!(
            CacheManager::new(&tiny_config(), zero),
            Err(CacheError::InvalidConfig {
                field: "max_seqs",
                ..
            })
        ));
    }

    #[test]
    fn accessors() {
        let m = manager(2 * slot_bytes() + MIN_POOLS, 2);
        assert_eq!(m.rollback_slack(), 2);
        assert_eq!(m.window_slots(), 10);
        assert_eq!(
            (0..4).map(|l| m.pending_slots(l)).collect::<Vec<_>>(),
            [0, 10, 10, 10]
        );
        let names: Vec<_> = m.usage().iter().map(|u| u.name).collect();
        assert_eq!(
            names,
            ["state_slots", "csa_entries", "hca_entries", "indexer_keys"]
        );
    }
}
