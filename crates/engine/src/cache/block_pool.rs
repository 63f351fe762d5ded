//! A fixed set of equal blocks carved out of one allocation, and the tables that own them.

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
    in_use: Vec<bool>,
}

impl BlockPool {
    pub fn new(name: &'static str, block_floats: usize, total: usize) -> Self {
        Self {
            name,
            block_floats,
            data: vec![0.0; block_floats * total],
            free: (0..total).rev().collect(),
            in_use: vec![false; total],
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn total_blocks(&self) -> usize {
        self.in_use.len()
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    pub fn used_blocks(&self) -> usize {
        self.total_blocks() - self.free_blocks()
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
            self.in_use[b] = true;
            table.blocks.push(b);
        }
        Ok(())
    }

    /// Shortens `table` to at most `len` blocks, returning the rest to the free list.
    pub fn shrink(&mut self, table: &mut BlockTable, len: usize) {
        while table.len() > len {
            let b = table.blocks.pop().expect("longer than len");
            assert!(self.in_use[b], "pool {}: block {b} freed twice", self.name);
            self.in_use[b] = false;
            self.free.push(b);
        }
    }

    pub fn data(&self) -> &[f32] {
        &self.data
    }

    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Whether block `b` is currently owned by some table (for invariant checks).
    #[cfg(test)]
    pub fn is_used(&self, b: usize) -> bool {
        self.in_use[b]
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
}
