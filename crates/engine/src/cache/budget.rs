//! How much memory the cache gets, and how it is split between state slots and paged pools.

use super::layout::{lcm, CacheLayout};
use super::CacheError;

/// Memory for the whole cache (state slots and paged pools together).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CacheBudget {
    /// Exactly this many bytes (at most; rounding down to whole blocks).
    Bytes(usize),
    /// This fraction (0, 1] of `MemAvailable` in `/proc/meminfo` at construction.
    FractionOfFree(f64),
}

impl CacheBudget {
    /// The budget in bytes.
    pub fn resolve(self) -> Result<usize, CacheError> {
        match self {
            CacheBudget::Bytes(b) => Ok(b),
            CacheBudget::FractionOfFree(f) => {
                if !(f.is_finite() && f > 0.0 && f <= 1.0) {
                    return Err(CacheError::InvalidConfig {
                        field: "budget",
                        value: format!("FractionOfFree({f})"),
                        reason: "the fraction must be in (0, 1]",
                    });
                }
                let text = std::fs::read_to_string("/proc/meminfo")
                    .map_err(|e| CacheError::MemInfo(format!("/proc/meminfo: {e}")))?;
                let avail = parse_mem_available(&text).ok_or_else(|| {
                    CacheError::MemInfo("/proc/meminfo has no readable MemAvailable line".into())
                })?;
                Ok((avail as f64 * f) as usize)
            }
        }
    }
}

/// `MemAvailable` in bytes.
fn parse_mem_available(meminfo: &str) -> Option<usize> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let mut parts = line.split_whitespace();
    let n: usize = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// The share of the budget left after the state slots that holds prefix-cache snapshots
/// (when prefix caching is on): snapshots are the large part of cached state (a window of
/// rows per block boundary), and a fixed share keeps them from crowding out the blocks
/// running sequences need.
pub const SNAPSHOT_SHARE: f64 = 0.25;

/// How a budget is carved up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Split {
    /// Blocks per paged pool.
    pub blocks: Vec<usize>,
    /// Prefix-cache snapshot records (0 when prefix caching is off).
    pub snapshots: usize,
}

/// Blocks per paged pool (and snapshot records, if `snapshots`) for a budget of `budget`
/// bytes after `max_seqs` state slots.
///
/// Every pool first gets one block (and the store one snapshot); of the rest, the snapshots
/// get [`SNAPSHOT_SHARE`], and the pools split what remains in proportion to their bytes per
/// token (`layers · width · 4 / ratio`), so that all pools fill up at about the same
/// sequence length. The total never exceeds the budget.
pub(super) fn split(
    layout: &CacheLayout,
    budget: usize,
    max_seqs: usize,
    snapshots: bool,
) -> Result<Split, CacheError> {
    let slot_bytes = layout.slot_bytes();
    let snap_bytes = snapshot_bytes(layout, snapshots);
    let min_pool_bytes = min_pool_bytes(layout, snapshots);
    let too_small = || CacheError::BudgetTooSmall {
        budget,
        max_seqs,
        slot_bytes,
        slots_bytes: max_seqs.saturating_mul(slot_bytes),
        min_pool_bytes,
    };
    let fixed = (max_seqs as u128) * (slot_bytes as u128) + min_pool_bytes as u128;
    let mut rest = (budget as u128).checked_sub(fixed).ok_or_else(too_small)?;
    let mut records = 0;
    if snapshots {
        let share = (rest as f64 * SNAPSHOT_SHARE) as u128;
        records = 1 + (share / snap_bytes as u128) as usize;
        rest -= share / snap_bytes as u128 * snap_bytes as u128;
    }

    // Bytes per token of pool p = 4 · window_floats_p / ratio_p; scale every pool by
    // lcm(ratios) / 4 to compare them in integers.
    let lcm = layout
        .pools
        .iter()
        .fold(1u128, |l, p| lcm(l, p.ratio as u128));
    let weight =
        |p: &super::layout::PoolLayout| p.window_floats() as u128 * (lcm / p.ratio as u128);
    let total_weight: u128 = layout.pools.iter().map(weight).sum();
    let blocks = layout
        .pools
        .iter()
        .map(|p| {
            let extra = rest * weight(p) / (total_weight * p.block_bytes() as u128);
            1 + extra as usize
        })
        .collect();
    Ok(Split {
        blocks,
        snapshots: records,
    })
}

/// One snapshot record's bytes when `snapshots` are kept (0 otherwise).
fn snapshot_bytes(layout: &CacheLayout, snapshots: bool) -> usize {
    match snapshots {
        true => layout.snapshot.bytes().max(1),
        false => 0,
    }
}

/// The least the paged pools need beside the state slots: one block of each, and one
/// snapshot record when `snapshots` are kept.
pub(super) fn min_pool_bytes(layout: &CacheLayout, snapshots: bool) -> usize {
    layout.pools.iter().map(|p| p.block_bytes()).sum::<usize>() + snapshot_bytes(layout, snapshots)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::tests::tiny_config;

    #[test]
    fn meminfo_parsing() {
        let text = "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(parse_mem_available(text), Some(2048 * 1024));
        assert_eq!(parse_mem_available("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: x kB\n"), None);
    }

    #[test]
    fn fraction_is_checked() {
        for f in [0.0, -0.5, 1.5, f64::NAN] {
            let e = CacheBudget::FractionOfFree(f).resolve().unwrap_err();
            assert!(matches!(
                e,
                CacheError::InvalidConfig {
                    field: "budget",
                    ..
                }
            ));
        }
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(CacheBudget::FractionOfFree(0.01).resolve().unwrap() > 0);
        }
    }

    #[test]
    fn split_is_proportional_and_within_budget() {
        let layout = CacheLayout::new(&tiny_config(), 0, 32, 0).unwrap();
        // Per token: csa 2·96/4 = 48, hca 96/8 = 12, indexer 2·64/4 = 32 floats (92 in all).
        // Block bytes (32 tokens each): csa 6144, hca 1536, indexer 4096.
        let min: usize = layout.pools.iter().map(|p| p.block_bytes()).sum();
        let slots = 3 * layout.slot_bytes();
        for rest in [0, 1, 11_775, 11_776, 23_552, 1 << 20, 10 << 20] {
            let budget = slots + min + rest;
            let blocks = split(&layout, budget, 3, false).unwrap().blocks;
            let used: usize = blocks
                .iter()
                .zip(&layout.pools)
                .map(|(n, p)| n * p.block_bytes())
                .sum();
            assert!(slots + used <= budget, "rest {rest}: {blocks:?}");
            // 92 floats = 368 bytes per token; every block spans 32 tokens.
            let tokens = rest / 368;
            assert_eq!(blocks, [1 + tokens / 32; 3], "rest {rest}");
        }
    }

    #[test]
    fn snapshots_take_their_share() {
        let layout = CacheLayout::new(&tiny_config(), 0, 32, 0).unwrap();
        let (snap, slots) = (layout.snapshot.bytes(), 3 * layout.slot_bytes());
        let min: usize = layout.pools.iter().map(|p| p.block_bytes()).sum::<usize>() + snap;
        let rest = 40 << 20;
        let s = split(&layout, slots + min + rest, 3, true).unwrap();
        let pools: usize = s
            .blocks
            .iter()
            .zip(&layout.pools)
            .map(|(n, p)| n * p.block_bytes())
            .sum();
        assert_eq!(s.snapshots, 1 + rest / 4 / snap);
        assert!(slots + pools + s.snapshots * snap <= slots + min + rest);
        let off = split(&layout, slots + min + rest, 3, false).unwrap();
        assert!(
            s.blocks[0] * 4 / 3 <= off.blocks[0] + 1,
            "{:?} {:?}",
            s.blocks,
            off.blocks
        );
        assert_eq!(off.snapshots, 0);
    }

    #[test]
    fn too_small_names_the_numbers() {
        let layout = CacheLayout::new(&tiny_config(), 0, 32, 0).unwrap();
        let slot = layout.slot_bytes();
        let e = split(&layout, 2 * slot, 2, false).unwrap_err();
        assert_eq!(
            e,
            CacheError::BudgetTooSmall {
                budget: 2 * slot,
                max_seqs: 2,
                slot_bytes: slot,
                slots_bytes: 2 * slot,
                min_pool_bytes: 6144 + 1536 + 4096,
            }
        );
        assert_eq!(
            e.to_string(),
            format!(
                "a cache budget of {} is too small: 2 sequences' state slots of {} each take {}, \
                 and one block of each paged pool 0.02 MiB more",
                super::super::error::mib(2 * slot),
                super::super::error::mib(slot),
                super::super::error::mib(2 * slot),
            )
        );
        let mib = super::super::error::mib;
        assert_eq!(mib(0), "0 MiB");
        assert_eq!(mib(1 << 20), "1 MiB");
        assert_eq!(mib((1 << 20) + 1), "1.1 MiB");
        assert_eq!(mib(11_776), "0.02 MiB");
        assert_eq!(mib(1 << 19), "0.50 MiB");
        assert_eq!(mib(6_176_768), "5.9 MiB");
        assert_eq!(mib(1529 << 20), "1529 MiB");
        assert_eq!(mib((15 << 20) + (1 << 19)), "16 MiB");
    }
}
