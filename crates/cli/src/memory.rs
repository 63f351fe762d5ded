//! The memory this process may use, split between the weights and the cache pools by one
//! rule where the flags leave it open, and how many sequences the cache holds.
//!
//! The rule, vLLM's "one memory fraction" made to fit a CPU box: of what the process may use
//! (the machine's available memory, or its memory cgroup's room where that is less, shared
//! by the ranks on the machine, less a margin of 512 MiB and 5 %), the cache pools take what
//! the weights leave, at least [`LEAST_CACHE`] (less where the weights would not run beside
//! it, down to one sequence's room) and at most a quarter; the weights get the rest (resident
//! when they fit, else their routed experts stream from disk through a cache of it). Without `--max-num-seqs`, the state slots may take half of the cache pools, up to
//! [`MOST_SEQS`] sequences. Explicit flags win, and are refused with the numbers when they
//! cannot fit.

use anyhow::{bail, Result};
use deepinfer_engine::cache::{mib, CacheSizes};

const MIB: usize = 1 << 20;
/// The cache pools where the memory the process may use cannot be read.
pub const UNKNOWN_CACHE: usize = 1024 * MIB;
/// The cache pools' floor: room for a few sequences of a few thousand tokens on V4.
const LEAST_CACHE: usize = 256 * MIB;
/// The most sequences the rule admits at once (`--max-num-seqs` may ask for more).
pub const MOST_SEQS: usize = 64;

/// What the weights this process loads need, in bytes: all of them resident, and the least
/// they run with (the dense part and the smallest expert cache).
#[derive(Clone, Copy, Debug)]
pub struct WeightNeeds {
    pub all: u64,
    pub least: u64,
}

/// What the flags ask for; `None`: left to the rule.
#[derive(Clone, Copy, Debug, Default)]
pub struct Asked {
    pub memory_budget: Option<usize>,
    pub cache: Option<usize>,
    pub max_num_seqs: Option<usize>,
}

/// What the weights and the cache pools get.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// The weights' budget (`None`: no limit known).
    pub weights: Option<usize>,
    pub cache: usize,
    pub max_num_seqs: usize,
    /// The sentence that says so, for stderr.
    pub line: String,
}

/// Left for what the process needs besides weights and cache pools (scratch, tokenizer,
/// the page cache of the dense part while it loads).
pub fn margin(available: usize) -> usize {
    512 * MIB + available / 20
}

/// What a process that may take `available` bytes uses beside the margin.
fn usable(available: usize) -> usize {
    available.saturating_sub(margin(available))
}

/// Whole MiB, rounded up: a size to give a flag.
fn flag_mib(bytes: usize) -> usize {
    bytes.div_ceil(MIB)
}

/// The split for a process that may take `available` bytes (`None`: unknown).
pub fn split(
    available: Option<usize>,
    weights: WeightNeeds,
    cache: CacheSizes,
    asked: &Asked,
) -> Result<Split> {
    let usable = available.map(usable);
    let one_seq = cache.slot_bytes + cache.min_pool_bytes;
    let pools = match (asked.cache, usable) {
        (Some(c), _) => c,
        (None, Some(u)) => {
            let taken = asked
                .memory_budget
                .map_or(weights.all, |b| weights.all.min(b as u64));
            let pools = u
                .saturating_sub(taken as usize)
                .min(u / 4)
                .max(LEAST_CACHE.max(one_seq));
            // The weights' least comes first: a smaller cache still serves.
            pools.min(u.saturating_sub(weights.least as usize).max(one_seq))
        }
        (None, None) => UNKNOWN_CACHE,
    };
    let budget = asked
        .memory_budget
        .or(usable.map(|u| u.saturating_sub(pools)));
    if let Some(b) = budget.filter(|&b| (b as u64) < weights.least) {
        bail!(too_small_for_weights(b, available, weights, pools, asked));
    }
    let seqs = sequences(pools, cache, asked)?;
    let line = describe(available, budget, weights, pools, seqs);
    Ok(Split {
        weights: budget,
        cache: pools,
        max_num_seqs: seqs,
        line,
    })
}

/// `--max-num-seqs`, or as many sequences as half the cache pools hold in state slots.
fn sequences(pools: usize, cache: CacheSizes, asked: &Asked) -> Result<usize> {
    let slot = cache.slot_bytes.max(1);
    let fit = pools.saturating_sub(cache.min_pool_bytes) / slot;
    let seqs = asked.max_num_seqs.unwrap_or_else(|| {
        (pools.saturating_sub(cache.min_pool_bytes) / 2 / slot).clamp(1, MOST_SEQS)
    });
    if seqs <= fit {
        return Ok(seqs);
    }
    let need = seqs * cache.slot_bytes + cache.min_pool_bytes;
    let pools_said = match asked.cache {
        Some(_) => format!("--cache-budget-mib {}", pools / MIB),
        None => format!("the cache pools' {}", mib(pools)),
    };
    let fix = match fit {
        0 => format!("give --cache-budget-mib {} or more", flag_mib(need)),
        _ => format!(
            "give --cache-budget-mib {} or --max-num-seqs {fit}",
            flag_mib(need)
        ),
    };
    bail!(
        "{pools_said} cannot hold {seqs} sequence{}: each sequence's state takes {}, and one \
         block of each paged pool {} more ({} in all); {fix}",
        if seqs == 1 { "" } else { "s (--max-num-seqs)" },
        mib(cache.slot_bytes),
        mib(cache.min_pool_bytes),
        mib(need),
    )
}

/// The error for a weights' budget `budget` below what they need.
fn too_small_for_weights(
    budget: usize,
    available: Option<usize>,
    weights: WeightNeeds,
    pools: usize,
    asked: &Asked,
) -> String {
    let need = format!(
        "the weights need at least {} MiB (their dense part and the smallest expert cache)",
        flag_mib(weights.least as usize)
    );
    if asked.memory_budget.is_some() {
        return format!(
            "--memory-budget-mib {} is too small: {need}; give --memory-budget-mib {} or more",
            budget / MIB,
            flag_mib(weights.least as usize)
        );
    }
    let a = available.unwrap_or(0);
    let lower = match asked.cache {
        Some(_) if pools > LEAST_CACHE => format!(
            ", or a smaller --cache-budget-mib (it takes {} MiB)",
            pools / MIB
        ),
        _ => String::new(),
    };
    format!(
        "not enough memory: this process may use {} MiB ({} MiB available less a margin of {} \
         MiB), and the cache pools take {} MiB of it; {need}; give the process {} MiB more \
         memory{lower}",
        usable(a) / MIB,
        a / MIB,
        margin(a) / MIB,
        pools / MIB,
        flag_mib((weights.least as usize).saturating_sub(budget)),
    )
}

/// The stderr line that says how the memory was split.
fn describe(
    available: Option<usize>,
    budget: Option<usize>,
    weights: WeightNeeds,
    pools: usize,
    seqs: usize,
) -> String {
    let weights = match budget {
        Some(b) if (b as u64) < weights.all => format!(
            "the weights {} of {} (routed experts streamed from disk)",
            mib(b),
            mib(weights.all as usize)
        ),
        _ => format!("the weights {}, resident", mib(weights.all as usize)),
    };
    let of = match available {
        Some(a) => format!(
            " of the {} MiB this process may use ({} MiB available less a {} MiB margin)",
            usable(a) / MIB,
            a / MIB,
            margin(a) / MIB
        ),
        None => String::new(),
    };
    let seqs = match seqs {
        1 => "one sequence".to_string(),
        n => format!("up to {n} sequences"),
    };
    format!(
        "memory: {weights}, the cache pools {} MiB for {seqs}{of}",
        pools / MIB
    )
}

/// A memory figure of this process from `/proc/self/status` (`VmHWM`, `RssAnon`, …), in MiB.
pub fn process_status_mib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    Some(line.split_whitespace().next()?.parse::<u64>().ok()? / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;

    /// The `bench` preset's figures (a 3.3 GB checkpoint whose dense part is 1529 MiB; a
    /// sequence's state 5.9 MiB; one block of each pool and a snapshot 3.4 MiB).
    fn bench() -> (WeightNeeds, CacheSizes) {
        let weights = WeightNeeds {
            all: 3300 << 20,
            least: (1529 << 20) + (150 << 20),
        };
        let cache = CacheSizes {
            slot_bytes: 6_176_768,
            min_pool_bytes: 3_565_000,
        };
        (weights, cache)
    }

    #[test]
    fn a_small_box_streams_and_sizes_the_cache_and_sequences_to_fit() {
        let (weights, cache) = bench();
        // 2.5 GiB: 1920 MiB usable after the 640 MiB margin, of which the weights need
        // 1679 MiB at least: the cache pools get the 241 MiB they leave.
        let s = split(Some(5 * GIB / 2), weights, cache, &Asked::default()).unwrap();
        assert_eq!(s.cache, 241 * MIB);
        assert_eq!(s.weights, Some(1679 * MIB));
        assert_eq!(
            s.max_num_seqs,
            (241 * MIB - cache.min_pool_bytes) / 2 / cache.slot_bytes
        );
        assert!(s.max_num_seqs * cache.slot_bytes + cache.min_pool_bytes <= s.cache);
        assert_eq!(
            s.line,
            "memory: the weights 1679 MiB of 3300 MiB (routed experts streamed from disk), the \
             cache pools 241 MiB for up to 20 sequences of the 1920 MiB this process may use \
             (2560 MiB available less a 640 MiB margin)"
        );
        // 3 GiB: the cache pools' floor, the weights the rest.
        let s = split(Some(3 * GIB), weights, cache, &Asked::default()).unwrap();
        let usable = 3 * GIB - margin(3 * GIB);
        assert_eq!(
            (s.cache, s.weights),
            (LEAST_CACHE, Some(usable - LEAST_CACHE))
        );
    }

    #[test]
    fn a_large_box_keeps_the_weights_resident_and_gives_the_cache_the_rest_up_to_a_quarter() {
        let (weights, cache) = bench();
        let s = split(Some(64 * GIB), weights, cache, &Asked::default()).unwrap();
        let usable = 64 * GIB - margin(64 * GIB);
        assert_eq!(s.cache, usable / 4);
        assert_eq!(s.weights, Some(usable - usable / 4));
        assert_eq!(s.max_num_seqs, MOST_SEQS);
        assert!(
            s.line.contains("the weights 3300 MiB, resident"),
            "{}",
            s.line
        );
        // Just enough room: the weights resident, the cache what they leave.
        let s = split(Some(5 * GIB), weights, cache, &Asked::default()).unwrap();
        let usable = 5 * GIB - margin(5 * GIB);
        assert_eq!(s.cache, usable - (3300 << 20));
        assert!(s.line.contains("resident"), "{}", s.line);
        // Unknown memory: the old defaults, no weights' limit.
        let s = split(None, weights, cache, &Asked::default()).unwrap();
        assert_eq!(
            (s.weights, s.cache, s.max_num_seqs),
            (None, UNKNOWN_CACHE, MOST_SEQS)
        );
    }

    #[test]
    fn explicit_flags_win() {
        let (weights, cache) = bench();
        let asked = Asked {
            memory_budget: Some(2000 * MIB),
            cache: Some(128 * MIB),
            max_num_seqs: Some(4),
        };
        let s = split(Some(64 * GIB), weights, cache, &asked).unwrap();
        assert_eq!(
            (s.weights, s.cache, s.max_num_seqs),
            (Some(2000 * MIB), 128 * MIB, 4)
        );
    }

    #[test]
    fn what_does_not_fit_is_refused_naming_the_flag_and_the_fix() {
        let (weights, cache) = bench();
        let err = |available, asked: Asked| {
            split(available, weights, cache, &asked)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(
                Some(64 * GIB),
                Asked {
                    memory_budget: Some(1000 * MIB),
                    ..Asked::default()
                }
            ),
            "--memory-budget-mib 1000 is too small: the weights need at least 1679 MiB (their \
             dense part and the smallest expert cache); give --memory-budget-mib 1679 or more"
        );
        // Less than the margin: nothing to use, said as such (no underflow).
        assert_eq!(
            err(Some(256 * MIB), Asked::default()),
            "not enough memory: this process may use 0 MiB (256 MiB available less a margin of \
             524 MiB), and the cache pools take 9 MiB of it; the weights need at least 1679 MiB \
             (their dense part and the smallest expert cache); give the process 1679 MiB more \
             memory"
        );
        assert_eq!(
            err(Some(2 * GIB), Asked::default()),
            "not enough memory: this process may use 1433 MiB (2048 MiB available less a margin \
             of 614 MiB), and the cache pools take 9 MiB of it; the weights need at least 1679 \
             MiB (their dense part and the smallest expert cache); give the process 255 MiB more \
             memory"
        );
        assert_eq!(
            err(
                Some(64 * GIB),
                Asked {
                    cache: Some(64 * MIB),
                    max_num_seqs: Some(64),
                    ..Asked::default()
                }
            ),
            "--cache-budget-mib 64 cannot hold 64 sequences (--max-num-seqs): each sequence's \
             state takes 5.9 MiB, and one block of each paged pool 3.4 MiB more (381 MiB in \
             all); give --cache-budget-mib 381 or --max-num-seqs 10"
        );
        assert_eq!(
            err(
                Some(64 * GIB),
                Asked {
                    cache: Some(4 * MIB),
                    ..Asked::default()
                }
            ),
            "--cache-budget-mib 4 cannot hold 1 sequence: each sequence's state takes 5.9 MiB, \
             and one block of each paged pool 3.4 MiB more (9.3 MiB in all); give \
             --cache-budget-mib 10 or more"
        );
        assert_eq!(
            err(
                Some(64 * GIB),
                Asked {
                    max_num_seqs: Some(5000),
                    ..Asked::default()
                }
            ),
            "the cache pools' 15437 MiB cannot hold 5000 sequences (--max-num-seqs): each \
             sequence's state takes 5.9 MiB, and one block of each paged pool 3.4 MiB more \
             (29457 MiB in all); give --cache-budget-mib 29457 or --max-num-seqs 2619"
        );
    }
}
