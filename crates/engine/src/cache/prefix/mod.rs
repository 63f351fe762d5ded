//! The prefix cache: token blocks already computed, found again by their content.
//!
//! A *node* stands for one block of `block_tokens` tokens after a given prefix (its parent
//! node): it holds that block's paged blocks in every pool (one reference each) and, if it
//! was taken, the *snapshot* of the fixed-size state at the block's end (window rows and
//! the overlapping compressors' pending rows, see [`super::layout::SnapshotLayout`]). A
//! request resumes after the deepest node of its chain that has a snapshot: its tables
//! share the chain's blocks, its rings get the snapshot's rows, and it computes only the
//! rest. Nodes are keyed by parent and token content (compared in full, not only hashed),
//! so a hit means the whole prefix matches, as vLLM's chained block hashes do.
//!
//! Eviction is least recently used, leaves first (a node's children hold its prefix), and
//! happens only when memory is asked for: blocks when a pool runs out, snapshots when the
//! snapshot store does. A node a running sequence extends is *pinned* (its next block
//! becomes the node's child) and stays.
//!
//! With a disk tier ([`super::disk`]), each node also carries its chain hash: its block is
//! written as it is cached, a snapshot as it is evicted (or as a sequence ends on it), and a
//! lookup continues on disk past the last block memory has ([`tier`]).

mod tier;

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::block_pool::BlockPool;
use super::disk::{self, DiskTier};

/// The parent of the first block of every chain.
const ROOT: usize = usize::MAX;
/// Paged pools a layout has at most: V4's CSA entries, HCA entries and indexer keys, or
/// V4.1's entries and keys at ratios 2 and 1.
pub(super) const MAX_POOLS: usize = 4;

#[derive(Debug)]
struct Node {
    parent: usize,
    key: u64,
    /// One block per pool, in layout order.
    blocks: [usize; MAX_POOLS],
    snapshot: Option<usize>,
    children: u32,
    pins: u32,
    last_used: u64,
    /// Blocks from the start through this one.
    depth: usize,
    /// The chained hash of every token through this block (only with a disk tier).
    chain: disk::Digest,
}

/// Fixed-size snapshot records carved out of one allocation.
#[derive(Debug)]
struct SnapshotStore {
    floats: usize,
    data: Vec<f32>,
    free: Vec<usize>,
}

/// A hit: the chain of nodes from the first block, the last one with a snapshot.
pub(super) struct Hit {
    pub chain: Vec<usize>,
}

/// Occupancy of the prefix cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixUsage {
    pub nodes: usize,
    pub snapshots: usize,
    pub snapshot_capacity: usize,
}

#[derive(Debug)]
pub(super) struct PrefixCache {
    block_tokens: usize,
    pools: usize,
    /// Nodes are allocated up front (and their tokens, `block_tokens` each, in `tokens`), so
    /// caching a block during a decode step allocates nothing.
    max_nodes: usize,
    nodes: Vec<Option<Node>>,
    tokens: Vec<u32>,
    free_ids: Vec<usize>,
    index: HashMap<(usize, u64), usize>,
    clock: u64,
    snapshots: SnapshotStore,
    disk: Option<DiskTier>,
}

fn key_of(tokens: impl Iterator<Item = u32>) -> u64 {
    let mut h = DefaultHasher::new();
    for t in tokens {
        t.hash(&mut h);
    }
    h.finish()
}

impl PrefixCache {
    /// At most `max_nodes` blocks of `block_tokens` tokens over `pools` paged pools, and
    /// `snapshots` records of `snapshot_floats` each (zeroed, committed as touched).
    pub fn new(
        block_tokens: usize,
        pools: usize,
        max_nodes: usize,
        snapshot_floats: usize,
        snapshots: usize,
    ) -> Self {
        assert!(pools <= MAX_POOLS);
        Self {
            block_tokens,
            pools,
            max_nodes,
            nodes: Vec::with_capacity(max_nodes),
            tokens: vec![0; max_nodes * block_tokens],
            free_ids: Vec::with_capacity(max_nodes),
            index: HashMap::with_capacity(max_nodes),
            clock: 0,
            snapshots: SnapshotStore {
                floats: snapshot_floats,
                data: vec![0.0; snapshot_floats * snapshots],
                free: (0..snapshots).rev().collect(),
            },
            disk: None,
        }
    }

    fn node(&self, id: usize) -> &Node {
        self.nodes[id].as_ref().expect("live node")
    }

    fn node_mut(&mut self, id: usize) -> &mut Node {
        self.nodes[id].as_mut().expect("live node")
    }

    pub fn blocks_of(&self, id: usize) -> &[usize] {
        &self.node(id).blocks[..self.pools]
    }

    fn tokens_of(&self, id: usize) -> &[u32] {
        &self.tokens[id * self.block_tokens..(id + 1) * self.block_tokens]
    }

    pub fn snapshot_of(&self, id: usize) -> Option<usize> {
        self.node(id).snapshot
    }

    /// The child of `parent` for the block of tokens `start..start + block_tokens`.
    fn find(&self, parent: usize, start: usize, token: &dyn Fn(usize) -> u32) -> Option<usize> {
        let t = self.block_tokens;
        let key = key_of((start..start + t).map(token));
        let id = *self.index.get(&(parent, key))?;
        let same = self
            .tokens_of(id)
            .iter()
            .enumerate()
            .all(|(i, &x)| x == token(start + i));
        same.then_some(id)
    }

    /// The nodes of the longest cached run of blocks `token` gives, at most `most`.
    fn walk(&self, most: usize, token: &dyn Fn(usize) -> u32) -> Vec<usize> {
        let t = self.block_tokens;
        let mut chain = Vec::new();
        let mut parent = ROOT;
        while chain.len() < most {
            let Some(id) = self.find(parent, chain.len() * t, token) else {
                break;
            };
            chain.push(id);
            parent = id;
        }
        chain
    }

    /// The longest cached prefix of the `len` tokens `token` gives that leaves at least one
    /// token to compute and ends at a snapshot; its nodes are marked used.
    pub fn lookup(
        &mut self,
        len: usize,
        token: &dyn Fn(usize) -> u32,
        pools: &mut [BlockPool],
    ) -> Option<Hit> {
        let most = len.saturating_sub(1) / self.block_tokens;
        let mut chain = self.walk(most, token);
        if self.disk.is_some() {
            self.extend_from_disk(&mut chain, most, token, pools);
        }
        let last = chain
            .iter()
            .rposition(|&id| self.node(id).snapshot.is_some())?;
        chain.truncate(last + 1);
        self.clock += 1;
        for &id in &chain {
            let clock = self.clock;
            self.node_mut(id).last_used = clock;
        }
        Some(Hit { chain })
    }

    /// The node for block `start / block_tokens` after `parent` (`None`: the first block),
    /// holding `blocks` (one per pool; a reference is taken on each). An equal node already
    /// cached is returned instead, and nothing is taken. `None` when every node is in use
    /// and none can be evicted.
    pub fn insert(
        &mut self,
        parent: Option<usize>,
        start: usize,
        token: &dyn Fn(usize) -> u32,
        blocks: &[usize],
        pools: &mut [BlockPool],
    ) -> Option<usize> {
        let parent = parent.unwrap_or(ROOT);
        if let Some(id) = self.find(parent, start, token) {
            return Some(id);
        }
        let id = match self.free_ids.pop() {
            Some(id) => id,
            None if self.nodes.len() < self.max_nodes => {
                self.nodes.push(None);
                self.nodes.len() - 1
            }
            None => {
                let victim = self.lru_leaf(|_| true)?;
                self.spill(victim, pools);
                self.evict(victim, pools);
                self.free_ids.pop().expect("just freed")
            }
        };
        let t = self.block_tokens;
        for (i, x) in self.tokens[id * t..(id + 1) * t].iter_mut().enumerate() {
            *x = token(start + i);
        }
        let key = key_of(self.tokens_of(id).iter().copied());
        let chain = self.chain_after(parent, id);
        let mut held = [0; MAX_POOLS];
        for ((pool, &b), h) in pools.iter_mut().zip(blocks).zip(&mut held) {
            pool.retain_cached(b);
            *h = b;
        }
        self.clock += 1;
        self.nodes[id] = Some(Node {
            parent,
            key,
            blocks: held,
            snapshot: None,
            children: 0,
            pins: 0,
            last_used: self.clock,
            depth: start / t + 1,
            chain,
        });
        self.index.insert((parent, key), id);
        if parent != ROOT {
            self.node_mut(parent).children += 1;
        }
        self.store_block(id, pools);
        Some(id)
    }

    pub fn pin(&mut self, id: usize) {
        self.node_mut(id).pins += 1;
    }

    pub fn unpin(&mut self, id: usize) {
        let n = self.node_mut(id);
        assert!(n.pins > 0, "prefix node {id} unpinned more than pinned");
        n.pins -= 1;
    }

    /// Gives node `id` the snapshot record `rec` unless it has one; false: the caller keeps
    /// `rec` (and frees it).
    pub fn set_snapshot(&mut self, id: usize, rec: usize) -> bool {
        let n = self.node_mut(id);
        if n.snapshot.is_some() {
            return false;
        }
        n.snapshot = Some(rec);
        true
    }

    /// A free snapshot record, taking the least recently used node's if none is free.
    pub fn alloc_snapshot(&mut self) -> Option<usize> {
        if let Some(r) = self.snapshots.free.pop() {
            return Some(r);
        }
        let victim = self
            .live()
            .filter(|(_, n)| n.snapshot.is_some())
            .min_by_key(|(_, n)| (n.last_used, std::cmp::Reverse(n.depth)))
            .map(|(id, _)| id)?;
        self.store_snapshot(victim);
        self.node_mut(victim).snapshot.take()
    }

    pub fn free_snapshot(&mut self, rec: usize) {
        debug_assert!(!self.snapshots.free.contains(&rec));
        self.snapshots.free.push(rec);
    }

    pub fn snapshot(&self, rec: usize) -> &[f32] {
        let f = self.snapshots.floats;
        &self.snapshots.data[rec * f..(rec + 1) * f]
    }

    /// The whole snapshot store (records of `snapshot_floats` each).
    pub fn snapshot_data_mut(&mut self) -> &mut [f32] {
        &mut self.snapshots.data
    }

    fn live(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(id, n)| n.as_ref().map(|n| (id, n)))
    }

    /// The least recently used unpinned leaf that `ok` accepts (deeper first on ties).
    fn lru_leaf(&self, ok: impl Fn(&Node) -> bool) -> Option<usize> {
        self.live()
            .filter(|(_, n)| n.children == 0 && n.pins == 0 && ok(n))
            .min_by_key(|(_, n)| (n.last_used, std::cmp::Reverse(n.depth)))
            .map(|(id, _)| id)
    }

    /// Evicts the least recently used unpinned leaf whose block in `pool` only the cache
    /// holds (so evicting it frees one there); false if there is none.
    pub fn evict_for(&mut self, pool: usize, pools: &mut [BlockPool]) -> bool {
        let only_cached = |n: &Node| pools[pool].refs(n.blocks[pool]) == 1;
        match self.lru_leaf(only_cached) {
            Some(id) => {
                self.spill(id, pools);
                self.evict(id, pools);
                true
            }
            None => false,
        }
    }

    fn evict(&mut self, id: usize, pools: &mut [BlockPool]) {
        let n = self.nodes[id].take().expect("live node");
        debug_assert!(n.children == 0 && n.pins == 0);
        for (pool, &b) in pools.iter_mut().zip(&n.blocks[..self.pools]) {
            pool.release_cached(b);
        }
        if let Some(r) = n.snapshot {
            self.snapshots.free.push(r);
        }
        self.index.remove(&(n.parent, n.key));
        if n.parent != ROOT {
            self.node_mut(n.parent).children -= 1;
        }
        self.free_ids.push(id);
    }

    /// Evicts every node no running sequence extends; returns how many.
    pub fn clear(&mut self, pools: &mut [BlockPool]) -> usize {
        let mut evicted = 0;
        loop {
            let leaves: Vec<usize> = self
                .live()
                .filter(|(_, n)| n.children == 0 && n.pins == 0)
                .map(|(id, _)| id)
                .collect();
            if leaves.is_empty() {
                return evicted;
            }
            for id in leaves {
                self.evict(id, pools);
                evicted += 1;
            }
        }
    }

    pub fn usage(&self) -> PrefixUsage {
        let cap = self.snapshots.data.len() / self.snapshots.floats.max(1);
        PrefixUsage {
            nodes: self.live().count(),
            snapshots: cap - self.snapshots.free.len(),
            snapshot_capacity: cap,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pools() -> Vec<BlockPool> {
        vec![BlockPool::new("a", 1, 8), BlockPool::new("b", 1, 8)]
    }

    /// A node per block of `tokens` (blocks of 4), each with a snapshot; the last id.
    fn cache_chain(c: &mut PrefixCache, pools: &mut [BlockPool], tokens: &[u32]) -> usize {
        let tok = |i: usize| tokens[i];
        let mut parent = None;
        for b in 0..tokens.len() / 4 {
            let mut tables = vec![super::super::BlockTable::default(); pools.len()];
            for (p, t) in pools.iter_mut().zip(&mut tables) {
                p.grow(t, 1).unwrap();
            }
            let blocks: Vec<usize> = tables.iter().map(|t| t.blocks()[0]).collect();
            let id = c.insert(parent, b * 4, &tok, &blocks, pools).unwrap();
            // The sequence's own references go (as when it finishes).
            for (p, t) in pools.iter_mut().zip(&mut tables) {
                p.shrink(t, 0);
            }
            let rec = c.alloc_snapshot().unwrap();
            assert!(c.set_snapshot(id, rec));
            parent = Some(id);
        }
        parent.unwrap()
    }

    #[test]
    fn lookup_finds_the_longest_prefix_that_leaves_a_token() {
        let mut pools = pools();
        let mut c = PrefixCache::new(4, 2, 8, 3, 8);
        let a: Vec<u32> = (0..12).collect();
        cache_chain(&mut c, &mut pools, &a);
        let mut depth = |t: &[u32]| {
            c.lookup(t.len(), &|i| t[i], &mut pools)
                .map_or(0, |h| h.chain.len())
        };
        assert_eq!(depth(&a), 2, "the last token is always computed");
        assert_eq!(depth(&[a.clone(), vec![99]].concat()), 3);
        let mut b = a.clone();
        b[5] = 77; // differs in the second block
        assert_eq!(depth(&b), 1);
        b[0] = 77;
        assert_eq!(depth(&b), 0);
        assert_eq!(depth(&a[..4]), 0);
        assert_eq!(depth(&a[..5]), 1);
    }

    #[test]
    fn eviction_takes_unpinned_leaves_least_recently_used_first() {
        let mut pools = pools();
        let mut c = PrefixCache::new(4, 2, 8, 3, 8);
        let a: Vec<u32> = (0..8).collect();
        let b: Vec<u32> = (100..108).collect();
        let tip_a = cache_chain(&mut c, &mut pools, &a);
        cache_chain(&mut c, &mut pools, &b);
        assert_eq!(pools[0].cached_blocks(), 4);
        // Use a: b becomes the least recently used.
        let a9 = [a.clone(), vec![1]].concat();
        assert!(c.lookup(9, &|i| a9[i], &mut pools).is_some());
        c.pin(tip_a);
        assert!(c.evict_for(0, &mut pools));
        assert!(c.evict_for(0, &mut pools));
        assert_eq!(
            pools[0].cached_blocks(),
            2,
            "b's two blocks went, tail first"
        );
        // a's tip is pinned and its first block has a child: nothing else can go.
        assert!(!c.evict_for(0, &mut pools));
        c.unpin(tip_a);
        assert_eq!(c.clear(&mut pools), 2);
        assert_eq!((pools[0].free_blocks(), pools[1].free_blocks()), (8, 8));
        assert_eq!(
            c.usage(),
            PrefixUsage {
                nodes: 0,
                snapshots: 0,
                snapshot_capacity: 8
            }
        );
    }

    #[test]
    fn snapshots_are_reclaimed_from_the_least_recently_used() {
        let mut pools = pools();
        let mut c = PrefixCache::new(4, 2, 8, 3, 2);
        let a: Vec<u32> = (0..8).collect();
        let tip = cache_chain(&mut c, &mut pools, &a); // both records used
        let rec = c.alloc_snapshot().expect("taken from the first block");
        assert_eq!(c.snapshot_of(tip).map(|_| ()), Some(()));
        c.free_snapshot(rec);
        assert_eq!(c.usage().snapshots, 1);
        // Equal content is found, not inserted twice.
        let blocks = c.blocks_of(tip).to_vec();
        let parent = Some(c.node(tip).parent);
        let again = c.insert(parent, 4, &|i| a[i], &blocks, &mut pools);
        let again = again.unwrap();
        assert_eq!(again, tip);
    }
}
