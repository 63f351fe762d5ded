//! The scheduler's view of cache memory: room for a sequence and for its tokens, nothing
//! about where the rows live. The engine hands its [`CacheManager`] to the scheduler through
//! this trait, and the scheduler's tests hand it a fake one.

use super::{CacheError, CacheManager, SeqId};

pub trait BlockAllocator {
    /// Starts a sequence with no tokens reserved; [`CacheError::NoFreeSlot`] when full.
    fn add_seq(&mut self) -> Result<SeqId, CacheError>;
    /// Makes room for the first `tokens` tokens of `seq`, all or nothing;
    /// [`CacheError::OutOfBlocks`] when the pools cannot.
    fn ensure_capacity(&mut self, seq: SeqId, tokens: usize) -> Result<(), CacheError>;
    /// Returns everything `seq` holds.
    fn free_seq(&mut self, seq: SeqId) -> Result<(), CacheError>;
    /// Starts `seq` (just added) from the longest cached prefix of its `len` tokens
    /// (`token(i)`); returns the tokens it need not compute. Default: none cached.
    fn attach_prefix(
        &mut self,
        _seq: SeqId,
        _len: usize,
        _token: &dyn Fn(usize) -> u32,
    ) -> Result<usize, CacheError> {
        Ok(0)
    }
}

impl BlockAllocator for CacheManager {
    fn add_seq(&mut self) -> Result<SeqId, CacheError> {
        CacheManager::add_seq(self)
    }

    fn ensure_capacity(&mut self, seq: SeqId, tokens: usize) -> Result<(), CacheError> {
        CacheManager::ensure_capacity(self, seq, tokens)
    }

    fn free_seq(&mut self, seq: SeqId) -> Result<(), CacheError> {
        CacheManager::free_seq(self, seq)
    }

    fn attach_prefix(
        &mut self,
        seq: SeqId,
        len: usize,
        token: &dyn Fn(usize) -> u32,
    ) -> Result<usize, CacheError> {
        CacheManager::attach_prefix(self, seq, len, token)
    }
}

/// Whether an error only says the memory is full right now (the scheduler preempts or
/// waits), as opposed to a bug or a bad handle.
pub fn is_exhausted(e: &CacheError) -> bool {
    matches!(
        e,
        CacheError::OutOfBlocks { .. } | CacheError::NoFreeSlot { .. }
    )
}
