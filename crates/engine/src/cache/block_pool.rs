//! A fixed set of equal blocks carved out of one allocation, and the tables that own them.
//!
//! Blocks are reference counted: a block of a cached prefix is held by the prefix cache and
//! by every sequence whose table shares it, and returns to the free list with its last
//! holder.

use std::fmt;

use super::CacheError;

/// The blocks one sequence holds in one pool, in entry order: entry `w` lives in block
/// `blocks()[w / block_entries]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockTable {
    blocks: Vec<usize>,
}

impl BlockTable {
    pub fn blocks(&self) -> &[usize] {
        &self.blocks
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

/// `total` blocks of `block_floats` f32 each, allocated (zeroed, so committed lazily by the
/// OS) once at construction, and a free list.
pub struct BlockPool {
    name: &'static str,
    block_floats: usize,
    data: Vec<f32>,
    /// Free block ids; popped from the end, so a fresh pool hands out 0, 1, 2, …
    free: Vec<usize>,
    /// Holders of each block (tables and the prefix cache); 0 for a free block.
    refs: Vec<u32>,
    /// Whether the prefix cache is one of a block's holders.
    cached: Vec<bool>,
    /// Blocks the prefix cache alone holds (free to evict).
    only_cached: usize,
}

impl BlockPool {
    pub fn new(name: &'static str, block_floats: usize, total: usize) -> Self {
        Self {
            name,
            block_floats,
            data: vec![0.0; block_floats * total],
            free: (0..total).rev().collect(),
            refs: vec![0; total],
            cached: vec![false; total],
            only_cached: 0,
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn total_blocks(&self) -> usize {
        self.refs.len()
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Blocks some sequence holds.
    pub fn used_blocks(&self) -> usize {
        self.total_blocks() - self.free_blocks() - self.only_cached
    }

    /// Blocks only the prefix cache holds: reusable by a later request, evicted when a
    /// running one needs the room.
    pub fn cached_blocks(&self) -> usize {
        self.only_cached
    }

    pub fn block_bytes(&self) -> usize {
        self.block_floats * size_of::<f32>()
    }

    /// Extends `table` to `len` blocks; all or nothing.
    pub fn grow(&mut self, table: &mut BlockTable, len: usize) -> Result<(), CacheError> {
        let needed = len.saturating_sub(table.len());
        if needed > self.free.len() {
            return Err(CacheError::OutOfBlocks {
                pool: self.name,
                needed,
                free: self.free.len(),
            });
        }
        for _ in 0..needed {
            let b = self.free.pop().expect("counted above");
            self.refs[b] = 1;
            table.blocks.push(b);
        }
        Ok(())
    }

    /// Shortens `table` to at most `len` blocks, releasing the rest.
    pub fn shrink(&mut self, table: &mut BlockTable, len: usize) {
        while table.len() > len {
            let b = table.blocks.pop().expect("longer than len");
            self.release(b);
        }
    }

    /// Appends block `b`, which another holder keeps, to `table`.
    pub fn share(&mut self, table: &mut BlockTable, b: usize) {
        self.change(b, |r, _| *r += 1);
        table.blocks.push(b);
    }

    /// The prefix cache becomes a holder of the used block `b`.
    pub fn retain_cached(&mut self, b: usize) {
        self.change(b, |r, c| {
            assert!(!*c, "block {b} cached twice");
            *r += 1;
            *c = true;
        });
    }

    /// The prefix cache lets go of block `b`.
    pub fn release_cached(&mut self, b: usize) {
        self.change(b, |r, c| {
            assert!(*c, "block {b} is not cached");
            *r -= 1;
            *c = false;
        });
    }

    /// One holder fewer of block `b`; the last one returns it to the free list.
    fn release(&mut self, b: usize) {
        self.change(b, |r, _| *r -= 1);
    }

    /// Applies `f` to block `b`'s holder count and cached flag, keeping the free list and the
    /// count of cache-only blocks in step.
    fn change(&mut self, b: usize, f: impl FnOnce(&mut u32, &mut bool)) {
        assert!(self.refs[b] > 0, "pool {}: block {b} is free", self.name);
        let only = |r: u32, c: bool| usize::from(c && r == 1);
        self.only_cached -= only(self.refs[b], self.cached[b]);
        f(&mut self.refs[b], &mut self.cached[b]);
        self.only_cached += only(self.refs[b], self.cached[b]);
        if self.refs[b] == 0 {
            self.cached[b] = false;
            self.free.push(b);
        }
    }

    /// Holders of block `b`.
    pub fn refs(&self, b: usize) -> u32 {
        self.refs[b]
    }

    /// The floats of block `b`.
    pub fn block(&self, b: usize) -> &[f32] {
        &self.data[b * self.block_floats..(b + 1) * self.block_floats]
    }

    pub fn block_mut(&mut self, b: usize) -> &mut [f32] {
        &mut self.data[b * self.block_floats..(b + 1) * self.block_floats]
    }

    pub fn block_floats(&self) -> usize {
        self.block_floats
    }

    pub fn data(&self) -> &[f32] {
        &self.data
    }

    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Whether block `b` is currently held (for invariant checks).
    #[cfg(test)]
    pub fn is_used(&self, b: usize) -> bool {
        self.refs[b] > 0
    }
}

impl fmt::Debug for BlockPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockPool")
            .field("name", &self.name)
            .field("block_floats", &self.block_floats)
            .field("total_blocks", &self.total_blocks())
            .field("free_blocks", &self.free_blocks())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grow_is_all_or_nothing_and_shrink_returns() {
        let mut p = BlockPool::new("p", 3, 4);
        assert_eq!(p.data_mut().len(), 12);
        let (mut a, mut b) = (BlockTable::default(), BlockTable::default());
        p.grow(&mut a, 3).unwrap();
        assert_eq!(a.blocks(), [0, 1, 2]);
        let err = p.grow(&mut b, 2).unwrap_err();
        assert_eq!(
            err,
            CacheError::OutOfBlocks {
                pool: "p",
                needed: 2,
                free: 1
            }
        );
        assert!(b.is_empty());
        assert_eq!(p.used_blocks(), 3);
        p.shrink(&mut a, 1);
        assert_eq!(a.blocks(), [0]);
        assert_eq!((p.used_blocks(), p.free_blocks()), (1, 3));
        p.grow(&mut b, 3).unwrap();
        assert_eq!(b.len(), 3);
        assert!(!b.blocks().contains(&0));
        p.shrink(&mut a, 0);
        p.shrink(&mut b, 0);
        assert_eq!(p.used_blocks(), 0);
        assert_eq!(p.block_bytes(), 12);
    }

    #[test]
    fn shared_blocks_return_with_their_last_holder() {
        let mut p = BlockPool::new("p", 1, 2);
        let (mut a, mut b) = (BlockTable::default(), BlockTable::default());
        p.grow(&mut a, 1).unwrap();
        let x = a.blocks()[0];
        p.share(&mut b, x);
        p.retain_cached(x); // a third holder (the prefix cache)
        assert_eq!((p.refs(x), p.used_blocks(), p.cached_blocks()), (3, 1, 0));
        p.shrink(&mut a, 0);
        p.shrink(&mut b, 0);
        assert_eq!((p.refs(x), p.used_blocks(), p.cached_blocks()), (1, 0, 1));
        p.release_cached(x);
        assert_eq!((p.refs(x), p.free_blocks(), p.cached_blocks()), (0, 2, 0));
    }
}
