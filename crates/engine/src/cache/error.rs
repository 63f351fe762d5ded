//! Everything that can go wrong with cache memory as a value: budgets, exhaustion, unknown
//! sequences. Misuse of a [`super::BatchView`] by the model (a layer without such state, an
//! entry past the reserved capacity) is a programming error and panics instead.

use super::SeqId;

/// `bytes` in MiB, to two significant digits below 10 MiB (rounded up, so a size quoted as
/// what is needed is enough).
pub fn mib(bytes: usize) -> String {
    let hundredths = (bytes as u128 * 100).div_ceil(1 << 20);
    match hundredths {
        0 => "0 MiB".into(),
        h if h < 100 => format!("0.{h:02} MiB"),
        h if h >= 1000 || h.div_ceil(10) % 10 == 0 => format!("{} MiB", h.div_ceil(100)),
        h => format!("{}.{} MiB", h.div_ceil(10) / 10, h.div_ceil(10) % 10),
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum CacheError {
    #[error("cache config: {field} = {value} is invalid: {reason}")]
    InvalidConfig {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("cannot size the cache from free memory: {0}")]
    MemInfo(String),
    #[error(
        "a cache budget of {} is too small: {max_seqs} sequences' state slots of {} each take \
         {}, and one block of each paged pool {} more",
        mib(*budget), mib(*slot_bytes), mib(*slots_bytes), mib(*min_pool_bytes)
    )]
    BudgetTooSmall {
        budget: usize,
        max_seqs: usize,
        slot_bytes: usize,
        slots_bytes: usize,
        min_pool_bytes: usize,
    },
    #[error("pool state_slots: all {max_seqs} sequence slots are in use")]
    NoFreeSlot { max_seqs: usize },
    #[error("pool {pool}: {needed} more blocks needed, only {free} free")]
    OutOfBlocks {
        pool: &'static str,
        needed: usize,
        free: usize,
    },
    #[error("unknown sequence {0} (never added, or already freed)")]
    UnknownSeq(SeqId),
    #[error("sequence {0} appears more than once in one batch")]
    DuplicateSeq(SeqId),
    #[error("cannot truncate sequence {seq} to {to} tokens: only {capacity} are reserved")]
    TruncateBeyondCapacity {
        seq: SeqId,
        to: usize,
        capacity: usize,
    },
    #[error(
        "cannot truncate sequence {seq} to {to} tokens: it has reserved up to {high_water}, and \
         the rings keep only {slack} tokens of rollback history"
    )]
    TruncateTooFar {
        seq: SeqId,
        to: usize,
        high_water: usize,
        slack: usize,
    },
    #[error(
        "--prefix-cache-dir {dir}: another deepinfer process is using this directory (its \
         `lock` file is held); give each server a directory of its own"
    )]
    PrefixDirInUse { dir: String },
}
