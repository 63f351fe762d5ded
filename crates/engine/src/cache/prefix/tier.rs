//! The prefix cache over its disk tier: what it writes there, and how a lookup continues on
//! disk where memory ends (the tier itself is [`crate::cache::disk`]).
//!
//! A lookup that finds on disk a deeper snapshot than memory has *promotes* the blocks in
//! between: each is read, checked (its tokens, its parent's hash, its size), copied into
//! blocks the cache takes from the pools, and cached as a node; then the snapshot is read
//! into a record. From there the memory hit proceeds as always, so a disk hit restores
//! exactly the state a memory hit would have, bit for bit.

use super::{PrefixCache, ROOT};
use crate::cache::block_pool::{BlockPool, BlockTable};
use crate::cache::disk::{self, DiskTier, Head, Kind, ReadAhead};
use std::sync::atomic::Ordering;

impl PrefixCache {
    pub fn set_disk(&mut self, tier: DiskTier) {
        debug_assert!(self.live().next().is_none(), "attach the disk tier first");
        self.disk = Some(tier);
    }

    pub fn disk(&self) -> Option<&DiskTier> {
        self.disk.as_ref()
    }

    pub fn disk_mut(&mut self) -> Option<&mut DiskTier> {
        self.disk.as_mut()
    }

    /// The chain hash of every token through node `id`'s block, or the root's (the
    /// identity) for [`ROOT`]; zero without a disk tier.
    fn hash_through(&self, id: usize) -> disk::Digest {
        match (id, &self.disk) {
            (_, None) => [0; 32],
            (ROOT, Some(d)) => *d.root(),
            (id, Some(_)) => self.node(id).chain,
        }
    }

    /// The chain hash of node `id`'s block after `parent` (zero without a disk tier).
    pub(super) fn chain_after(&self, parent: usize, id: usize) -> disk::Digest {
        if self.disk.is_none() {
            return [0; 32];
        }
        disk::chain(
            &self.hash_through(parent),
            self.tokens_of(id).iter().copied(),
        )
    }

    /// Writes node `id`'s blocks to disk unless it has them.
    pub(super) fn store_block(&mut self, id: usize, pools: &[BlockPool]) {
        let parent = self.hash_through(self.node(id).parent);
        let Some(d) = &mut self.disk else {
            return;
        };
        let n = self.nodes[id].as_ref().expect("live node");
        d.poll();
        if d.knows(&n.chain, Kind::Block) {
            return;
        }
        let floats: Vec<&[f32]> = pools
            .iter()
            .zip(&n.blocks[..self.pools])
            .map(|(p, &b)| p.block(b))
            .collect();
        let t = self.block_tokens;
        let identity = *d.root();
        let head = Head {
            kind: Kind::Block,
            identity: &identity,
            chain: &n.chain,
            parent: &parent,
            depth: n.depth as u32,
            tokens: &self.tokens[id * t..(id + 1) * t],
        };
        d.store(&head, &floats);
    }

    /// Writes node `id`'s snapshot to disk, if it has one the disk lacks.
    pub fn store_snapshot(&mut self, id: usize) {
        let Some(d) = &mut self.disk else {
            return;
        };
        let n = self.nodes[id].as_ref().expect("live node");
        let Some(rec) = n.snapshot else {
            return;
        };
        if d.knows(&n.chain, Kind::Snapshot) {
            return;
        }
        let f = self.snapshots.floats;
        let identity = *d.root();
        let head = Head {
            kind: Kind::Snapshot,
            identity: &identity,
            chain: &n.chain,
            parent: &[0; 32],
            depth: n.depth as u32,
            tokens: &[],
        };
        d.store(&head, &[&self.snapshots.data[rec * f..(rec + 1) * f]]);
    }

    /// At shutdown: what memory holds goes to disk, as much of it as the disk's bound
    /// takes, the most recently used kept. Written (or, if the disk has it, marked used)
    /// from the least recently used up, so that the directory's order of use (file times,
    /// read at the next start) has memory's, after whatever only the disk held.
    pub fn spill_all(&mut self, pools: &[BlockPool]) {
        let Some(d) = &mut self.disk else {
            return;
        };
        d.close();
        let budget = d.max_bytes();
        let mut ids: Vec<(u64, usize)> = self.live().map(|(id, n)| (n.last_used, id)).collect();
        ids.sort_unstable_by_key(|&(used, _)| std::cmp::Reverse(used));
        let block = pools.iter().map(|p| p.block_bytes() as u64).sum::<u64>();
        let snapshot = (self.snapshots.floats * size_of::<f32>()) as u64;
        let mut total = 0;
        let keep = ids
            .iter()
            .take_while(|&&(_, id)| {
                total += block + snapshot * u64::from(self.node(id).snapshot.is_some());
                total <= budget
            })
            .count();
        for &(_, id) in ids[..keep].iter().rev() {
            self.spill(id, pools);
            let (chain, snap) = (self.node(id).chain, self.node(id).snapshot.is_some());
            let d = self.disk.as_mut().expect("checked above");
            d.mark_used(&chain, Kind::Block);
            if snap {
                d.mark_used(&chain, Kind::Snapshot);
            }
        }
        if let Some(d) = &mut self.disk {
            d.flush();
        }
    }

    /// Before node `id` leaves memory: what of it the disk lacks goes there.
    pub(super) fn spill(&mut self, id: usize, pools: &[BlockPool]) {
        if self.disk.is_some() {
            self.store_block(id, pools);
            self.store_snapshot(id);
        }
    }

    /// Continues `chain` (the nodes memory has of the prompt, from its first block; at most
    /// `most` blocks) on disk, if the disk has a deeper snapshot than memory: promotes the
    /// blocks up to it and the snapshot. Whatever fails to read stops it there (a miss).
    pub(super) fn extend_from_disk(
        &mut self,
        chain: &mut Vec<usize>,
        most: usize,
        token: &dyn Fn(usize) -> u32,
        pools: &mut [BlockPool],
    ) {
        let t = self.block_tokens;
        let in_memory = self.deepest_snapshot(chain);
        let hashes = self.hashes_on_disk(chain, most, token);
        let Some(d) = &self.disk else {
            return;
        };
        let stats = d.stats();
        let query = (most - in_memory) * t;
        stats
            .query_tokens
            .fetch_add(query as u64, Ordering::Relaxed);
        // Deepest first; a snapshot or block that fails to read moves on to shallower ones.
        let targets: Vec<usize> = (in_memory + 1..=hashes.len())
            .rev()
            .filter(|&depth| d.has(&hashes[depth - 1], Kind::Snapshot))
            .collect();
        for &id in chain.iter() {
            self.pin(id);
        }
        let mut reachable = hashes.len();
        for target in targets {
            if target > reachable {
                continue;
            }
            while chain.len() < target.min(reachable) {
                let b = chain.len();
                let parent = chain.last().copied();
                let Some(id) = self.promote_block(parent, b, &hashes[b], token, pools) else {
                    reachable = b;
                    break;
                };
                self.pin(id);
                chain.push(id);
            }
            if chain.len() >= target && self.promote_snapshot(chain[target - 1]) {
                let hit = ((target - in_memory) * t) as u64;
                let d = self.disk.as_ref().expect("checked above");
                d.stats().hit_tokens.fetch_add(hit, Ordering::Relaxed);
                break;
            }
        }
        for &id in chain.iter() {
            self.unpin(id);
        }
    }

    /// Reads ahead what a lookup of the `len` tokens `token` gives would read from disk, for
    /// a request that waits for admission; `None` if it would read nothing.
    pub fn prefetch(&mut self, len: usize, token: &dyn Fn(usize) -> u32) -> Option<ReadAhead> {
        let keys = self.read_ahead(len, token);
        self.disk.as_ref()?.prefetch(keys.into_iter())
    }

    /// The entries a lookup would read from disk: the blocks past memory's up to the
    /// deepest snapshot the disk has beyond memory's, and that snapshot.
    fn read_ahead(
        &mut self,
        len: usize,
        token: &dyn Fn(usize) -> u32,
    ) -> Vec<(disk::Digest, Kind)> {
        if self.disk.is_none() {
            return Vec::new();
        }
        let most = len.saturating_sub(1) / self.block_tokens;
        let chain = self.walk(most, token);
        let in_memory = self.deepest_snapshot(&chain);
        let hashes = self.hashes_on_disk(&chain, most, token);
        let d = self.disk.as_ref().expect("checked above");
        let Some(deepest) = (in_memory + 1..=hashes.len())
            .rev()
            .find(|&depth| d.has(&hashes[depth - 1], Kind::Snapshot))
        else {
            return Vec::new();
        };
        let blocks = hashes[chain.len().min(deepest)..deepest].iter();
        let keys = blocks.map(|h| (*h, Kind::Block));
        keys.chain([(hashes[deepest - 1], Kind::Snapshot)])
            .collect()
    }

    /// Blocks up to the last node of `chain` with a snapshot (0: none has one).
    fn deepest_snapshot(&self, chain: &[usize]) -> usize {
        chain
            .iter()
            .rposition(|&id| self.node(id).snapshot.is_some())
            .map_or(0, |i| i + 1)
    }

    /// The chain hashes of `chain`'s nodes, then of the blocks after them that the disk has.
    fn hashes_on_disk(
        &mut self,
        chain: &[usize],
        most: usize,
        token: &dyn Fn(usize) -> u32,
    ) -> Vec<disk::Digest> {
        let mut hashes: Vec<disk::Digest> = chain.iter().map(|&id| self.node(id).chain).collect();
        let Some(d) = &mut self.disk else {
            return hashes;
        };
        d.poll();
        let t = self.block_tokens;
        let mut prev = hashes.last().copied().unwrap_or(*d.root());
        for b in chain.len()..most {
            let h = disk::chain(&prev, (b * t..(b + 1) * t).map(token));
            if !d.has(&h, Kind::Block) {
                break;
            }
            hashes.push(h);
            prev = h;
        }
        hashes
    }

    /// Reads block `b` (hash `h`, after node `parent`) from disk into blocks of the pools and
    /// caches it as a node; `None` if it cannot be read or room cannot be made.
    fn promote_block(
        &mut self,
        parent: Option<usize>,
        b: usize,
        h: &disk::Digest,
        token: &dyn Fn(usize) -> u32,
        pools: &mut [BlockPool],
    ) -> Option<usize> {
        let t = self.block_tokens;
        let parent_hash = self.hash_through(parent.unwrap_or(ROOT));
        let d = self.disk.as_mut()?;
        let bytes = d.read(h, Kind::Block)?;
        let e = d.check(&bytes, h, Kind::Block)?;
        let floats: usize = pools.iter().map(BlockPool::block_floats).sum();
        let fits = e.parent == parent_hash
            && e.depth as usize == b + 1
            && e.tokens().eq((b * t..(b + 1) * t).map(token))
            && e.floats_len() == floats;
        if !fits {
            d.reject(
                h,
                Kind::Block,
                &"its tokens, parent or size are not the prefix's",
            );
            return None;
        }
        let mut tables = vec![BlockTable::default(); pools.len()];
        let taken = (0..pools.len()).all(|i| {
            while pools[i].grow(&mut tables[i], 1).is_err() {
                if !self.evict_for(i, pools) {
                    return false;
                }
            }
            true
        });
        let id = taken.then(|| {
            let mut at = 0;
            for (pool, table) in pools.iter_mut().zip(&tables) {
                let block = pool.block_mut(table.blocks()[0]);
                e.floats_into(at, block);
                at += block.len();
            }
            let blocks: Vec<usize> = tables.iter().map(|t| t.blocks()[0]).collect();
            self.insert(parent, b * t, token, &blocks, pools)
        });
        for (pool, table) in pools.iter_mut().zip(&mut tables) {
            pool.shrink(table, 0);
        }
        id.flatten()
    }

    /// Reads node `id`'s snapshot from disk into a record of its own; false if it cannot.
    fn promote_snapshot(&mut self, id: usize) -> bool {
        let (h, depth) = (self.node(id).chain, self.node(id).depth);
        let f = self.snapshots.floats;
        let Some(d) = self.disk.as_mut() else {
            return false;
        };
        let Some(bytes) = d.read(&h, Kind::Snapshot) else {
            return false;
        };
        let Some(e) = d.check(&bytes, &h, Kind::Snapshot) else {
            return false;
        };
        if e.floats_len() != f || e.depth as usize != depth {
            d.reject(&h, Kind::Snapshot, &"its size or depth is not the node's");
            return false;
        }
        let Some(rec) = self.alloc_snapshot() else {
            return false;
        };
        e.floats_into(0, &mut self.snapshots.data[rec * f..(rec + 1) * f]);
        if !self.set_snapshot(id, rec) {
            self.free_snapshot(rec);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::disk::DiskConfig;

    fn cache(dir: &std::path::Path) -> PrefixCache {
        let mut c = PrefixCache::new(4, 2, 8, 3, 8);
        let cfg = DiskConfig {
            dir: dir.to_path_buf(),
            max_bytes: 1 << 20,
            checkpoint: [1; 32],
            kernels: "test",
        };
        let tier = DiskTier::open(&cfg, [2; 32], Default::default()).unwrap();
        c.set_disk(tier.expect("a usable directory"));
        c
    }

    #[test]
    fn a_waiting_request_reads_ahead_what_its_lookup_will_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut pools = vec![BlockPool::new("a", 2, 8), BlockPool::new("b", 1, 8)];
        let tokens: Vec<u32> = (0..13).collect();
        let tok = |i: usize| tokens[i];
        let mut first = cache(dir.path());
        let mut parent = None;
        for b in 0..3 {
            let mut tables = vec![BlockTable::default(); 2];
            for (p, t) in pools.iter_mut().zip(&mut tables) {
                p.grow(t, 1).unwrap();
            }
            let blocks: Vec<usize> = tables.iter().map(|t| t.blocks()[0]).collect();
            let id = first
                .insert(parent, b * 4, &tok, &blocks, &mut pools)
                .unwrap();
            for (p, t) in pools.iter_mut().zip(&mut tables) {
                p.shrink(t, 0);
            }
            let rec = first.alloc_snapshot().unwrap();
            assert!(first.set_snapshot(id, rec));
            parent = Some(id);
        }
        assert!(first.read_ahead(13, &tok).is_empty(), "memory has it all");
        first.spill_all(&pools);
        drop(first); // writes what was queued
        let mut pools = vec![BlockPool::new("a", 2, 8), BlockPool::new("b", 1, 8)];
        let mut second = cache(dir.path());
        let keys = second.read_ahead(13, &tok);
        let kinds: Vec<Kind> = keys.iter().map(|k| k.1).collect();
        assert_eq!(
            kinds,
            [Kind::Block, Kind::Block, Kind::Block, Kind::Snapshot]
        );
        assert_eq!(keys[2].0, keys[3].0, "the snapshot at the last block");
        // What the lookup then reads is exactly that: three blocks, their snapshot.
        let hit = second.lookup(13, &tok, &mut pools).unwrap();
        assert_eq!(hit.chain.len(), 3);
        assert!(second.read_ahead(13, &tok).is_empty(), "now in memory");
        // A shorter prompt reads ahead only as deep as it could resume.
        let mut third_pools = vec![BlockPool::new("a", 2, 8), BlockPool::new("b", 1, 8)];
        drop(second);
        let mut third = cache(dir.path());
        assert_eq!(third.read_ahead(9, &tok).len(), 3);
        assert!(third.lookup(9, &tok, &mut third_pools).is_some());
    }
}
