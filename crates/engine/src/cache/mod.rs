//! Cache memory: who owns the state the model keeps between steps, and where it lives.
//!
//! # Why it looks like this
//!
//! The model's state per sequence and layer (docs/MODEL.md §6, [`deepinfer_model::cache`]) comes in
//! two shapes, and each gets the allocator that suits it:
//!
//! - **Fixed-size state** — the sliding-window ring of every layer and the compressors'
//!   pending `[K | Z]` rings — does not grow with the sequence. All of it for one sequence is
//!   one contiguous *state slot*; `max_seqs` slots are carved out up front, so admitting a
//!   sequence is popping a free list ([`CacheManager::add_seq`]).
//! - **Growing state** — compressed entries (one per `m` tokens) and indexer keys — is
//!   paged. Layers whose entries grow at the same rate (all CSA layers, all HCA layers, all
//!   indexers) share one *paged pool* and one [`BlockTable`] per sequence: a block holds
//!   `block_entries` entries of *every* member layer, so growing a sequence takes one
//!   allocation decision per pool, not per layer, and no pool fragments.
//!
//! Everything is addressed by absolute position (window slot `pos mod window_slots`, pending
//! slot `pos mod pending_slots`, entry `pos div m`); the model computes the slots and the
//! view only indexes. So rolling back (rejected drafts, preemption) is a truncation that moves
//! no data: rows past the new length are rewritten before they are read. For that to hold
//! after a truncation, the rings keep `rollback_slack` more slots than the model reads
//! (window `sliding_window + slack`, pending `coff·m + slack`); the runner refuses deeper
//! truncations.
//!
//! The budget pays for the state slots first (a server that cannot hold `max_seqs` sequences
//! is misconfigured, [`CacheError::BudgetTooSmall`]); the rest is split across the pools in
//! proportion to their bytes per token, so they all run out at about the same length. Every
//! pool is one `Vec<f32>` allocated once, zeroed (hence committed lazily by the OS); nothing
//! is allocated per step. Values are stored as f32 — the reference's bf16/fp8 round trips
//! happen in the model — so a packed format later changes only [`layout`].
//!
//! A [`BatchView`] borrows the storage for one forward pass and implements
//! [`deepinfer_model::cache::CacheView`] by plain slice indexing, so there is no `unsafe` and
//! two sequences can never alias (distinct slots, blocks owned by one table each; tested).
//! Everything reachable from user input is a [`CacheError`]; misuse of the view by the model
//! is a bug and panics with the numbers.
//!
//! The prefix cache ([`prefix`]) may be backed by a directory ([`disk`]): its blocks and
//! snapshots written there, and read back past what memory holds.

mod allocator;
mod block_pool;
mod budget;
pub mod disk;
mod error;
pub mod layout;
mod manager;
mod prefix;
mod view;

pub use allocator::{is_exhausted, BlockAllocator};
pub use block_pool::BlockTable;
pub use budget::CacheBudget;
pub use error::{mib, CacheError};
pub use layout::{default_block_tokens, CacheLayout};
pub use manager::{CacheConfig, CacheManager, CacheSizes, PoolUsage, SeqId};
pub use prefix::PrefixUsage;
pub use view::BatchView;

#[cfg(test)]
pub(crate) mod tests {
    use deepinfer_model::config::ModelConfig;

    /// tiny-a: layers [sliding, csa, hca, csa], csa m=4, hca m=8, head_dim 96,
    /// index_head_dim 64, sliding_window 8.
    pub(crate) fn tiny_config() -> ModelConfig {
        ModelConfig::from_json_str(include_str!(
            "../../../../tests/fixtures/golden/tiny-a/hf/config.json"
        ))
        .unwrap()
    }
}
