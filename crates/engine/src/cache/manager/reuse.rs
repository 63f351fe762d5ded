//! How sequences resume from cached prefixes and leave their own blocks behind for later
//! ones (the state the prefix cache keeps is described in [`super::super::prefix`]).
//!
//! A sequence's blocks are cached as it passes block boundaries: when a step's tokens cross
//! a boundary, [`CacheManager::begin_capture`] takes a snapshot record for it and copies the
//! ring rows from before the step; the model hands every row it computes to the view
//! (`keep_window`, `keep_pending`), which copies those the snapshot keeps; after the step,
//! [`CacheManager::commit_prefix`] caches each block the sequence has completed, with its
//! snapshot. A new sequence ([`CacheManager::attach_prefix`]) shares the blocks of the
//! longest cached chain that ends at a snapshot and gets the snapshot's rows in its rings:
//! exactly the state a full prefill would have left there.

use super::{CacheManager, SeqId};
use crate::cache::layout::{CacheLayout, SnapshotPart};
use crate::cache::prefix::{PrefixUsage, MAX_POOLS};
use crate::cache::CacheError;

/// Where `part`'s row of position `pos` lives in a state slot.
fn ring_row(part: &SnapshotPart, pos: usize) -> std::ops::Range<usize> {
    part.ring.row(pos % part.ring.slots)
}

/// The rows a snapshot at `boundary` keeps for positions below `end`: `f(ring rows in the
/// state slot, rows in the snapshot)` for each.
fn each_row(
    layout: &CacheLayout,
    boundary: usize,
    end: usize,
    mut f: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>),
) {
    let s = &layout.snapshot;
    for part in &s.parts {
        for pos in boundary.saturating_sub(part.rows)..end.min(boundary) {
            f(
                ring_row(part, pos),
                s.row(part, boundary, pos).expect("kept"),
            );
        }
    }
}

impl CacheManager {
    pub fn prefix_caching(&self) -> bool {
        self.prefix.is_some()
    }

    /// Tokens per block: a prefix is reused in whole blocks.
    pub fn block_tokens(&self) -> usize {
        self.layout.block_tokens
    }

    pub fn prefix_usage(&self) -> Option<PrefixUsage> {
        self.prefix.as_ref().map(|p| p.usage())
    }

    /// Floats of state slot `slot` in the states.
    fn slot_range(&self, slot: usize) -> std::ops::Range<usize> {
        slot * self.layout.slot_floats..(slot + 1) * self.layout.slot_floats
    }

    /// Starts `seq` (just added, nothing reserved) from the longest cached prefix of its
    /// `len` tokens (`token(i)`) that leaves at least one to compute; returns the tokens
    /// reused (a multiple of the block size; 0 without prefix caching).
    pub fn attach_prefix(
        &mut self,
        seq: SeqId,
        len: usize,
        token: &dyn Fn(usize) -> u32,
    ) -> Result<usize, CacheError> {
        let s = self.seqs.get(&seq).ok_or(CacheError::UnknownSeq(seq))?;
        let (slot, range) = (s.slot, self.slot_range(s.slot));
        let Some(prefix) = &mut self.prefix else {
            return Ok(0);
        };
        if s.capacity != 0 {
            return Ok(0);
        }
        let Some(hit) = prefix.lookup(len, token, &mut self.pools) else {
            return Ok(0);
        };
        let tables = &mut self.slot_tables[slot];
        for &id in &hit.chain {
            for (i, &b) in prefix.blocks_of(id).iter().enumerate() {
                self.pools[i].share(&mut tables[i], b);
            }
        }
        let tip = *hit.chain.last().expect("a hit has a block");
        let reused = hit.chain.len() * self.layout.block_tokens;
        let rec = prefix.snapshot_of(tip).expect("a hit ends at a snapshot");
        prefix.pin(tip);
        let (state, snapshot) = (&mut self.states[range], prefix.snapshot(rec));
        each_row(&self.layout, reused, reused, |ring, kept| {
            state[ring].copy_from_slice(&snapshot[kept]);
        });
        let s = self.seqs.get_mut(&seq).expect("looked up");
        s.tip = Some(tip);
        s.cached_blocks = hit.chain.len();
        s.capacity = reused;
        s.high_water = reused;
        Ok(reused)
    }

    /// Before a step that computes positions `start..end` of `seq`: a snapshot record for
    /// every block boundary in `start + 1..=end` not cached yet (while records last), with
    /// the rows from before `start` copied from the rings; the step's own rows arrive
    /// through the view.
    pub fn begin_capture(
        &mut self,
        seq: SeqId,
        start: usize,
        end: usize,
    ) -> Result<(), CacheError> {
        let slot = self.seqs.get(&seq).ok_or(CacheError::UnknownSeq(seq))?.slot;
        let range = self.slot_range(slot);
        let s = self.seqs.get_mut(&seq).expect("looked up");
        let Some(prefix) = &mut self.prefix else {
            return Ok(());
        };
        let captures = &mut self.slot_captures[slot];
        for (_, rec) in captures.drain(..) {
            prefix.free_snapshot(rec);
        }
        let t = self.layout.block_tokens;
        let first = (start / t + 1).max(s.cached_blocks + 1);
        for b in first..=end / t {
            let Some(rec) = prefix.alloc_snapshot() else {
                break;
            };
            let f = self.layout.snapshot.floats;
            let snapshot = &mut prefix.snapshot_data_mut()[rec * f..(rec + 1) * f];
            let state = &self.states[range.clone()];
            each_row(&self.layout, b * t, start, |ring, kept| {
                snapshot[kept].copy_from_slice(&state[ring]);
            });
            captures.push((b * t, rec));
        }
        Ok(())
    }

    /// After a step: caches every block of `seq` that its first `computed` tokens
    /// (`token(i)`) complete, each with the snapshot taken at its end if there is one;
    /// snapshots of boundaries not reached (rejected drafts) are dropped.
    pub fn commit_prefix(
        &mut self,
        seq: SeqId,
        computed: usize,
        token: &dyn Fn(usize) -> u32,
    ) -> Result<(), CacheError> {
        let s = self.seqs.get_mut(&seq).ok_or(CacheError::UnknownSeq(seq))?;
        let Some(prefix) = &mut self.prefix else {
            return Ok(());
        };
        let t = self.layout.block_tokens;
        let tables = &self.slot_tables[s.slot];
        let captures = &mut self.slot_captures[s.slot];
        for b in s.cached_blocks..computed / t {
            let mut blocks = [0usize; MAX_POOLS];
            for (i, table) in tables.iter().enumerate() {
                blocks[i] = table.blocks()[b];
            }
            let Some(id) = prefix.insert(
                s.tip,
                b * t,
                token,
                &blocks[..tables.len()],
                &mut self.pools,
            ) else {
                break;
            };
            prefix.pin(id);
            if let Some(old) = s.tip.replace(id) {
                prefix.unpin(old);
            }
            s.cached_blocks = b + 1;
            if let Some(k) = captures.iter().position(|c| c.0 == (b + 1) * t) {
                let (_, rec) = captures.swap_remove(k);
                if !prefix.set_snapshot(id, rec) {
                    prefix.free_snapshot(rec);
                }
            }
        }
        for (_, rec) in captures.drain(..) {
            prefix.free_snapshot(rec);
        }
        Ok(())
    }

    /// Evicts every cached prefix no running sequence extends (vLLM's
    /// `/reset_prefix_cache`), and with `disk` every entry of the disk tier; returns how
    /// many blocks went from memory.
    pub fn reset_prefix_cache(&mut self, disk: bool) -> usize {
        let Some(p) = &mut self.prefix else {
            return 0;
        };
        if let Some(d) = p.disk_mut().filter(|_| disk) {
            d.clear();
        }
        p.clear(&mut self.pools)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::layout::RingKind;
    use crate::cache::tests::tiny_config;
    use crate::cache::{CacheBudget, CacheConfig};

    fn manager() -> CacheManager {
        let cfg = CacheConfig {
            budget: CacheBudget::Bytes(8 << 20),
            max_seqs: 3,
            rollback_slack: 2,
            block_tokens: 16,
            ..CacheConfig::default()
        };
        CacheManager::new(&tiny_config(), cfg).unwrap()
    }

    /// Fills `seq`'s rings as a model would after `len` tokens: row `pos` of each ring
    /// holds `pos` (plus the part's index, so parts differ).
    fn fill(m: &mut CacheManager, seq: SeqId, from: usize, len: usize) {
        let slot = m.seqs[&seq].slot;
        let range = m.slot_range(slot);
        let layout = m.layout.clone();
        for (k, part) in layout.snapshot.parts.iter().enumerate() {
            for pos in from..len {
                let r = ring_row(part, pos);
                m.states[range.clone()][r].fill((pos * 100 + k) as f32);
            }
        }
    }

    #[test]
    fn a_resumed_sequence_gets_the_blocks_and_the_rows() {
        let mut m = manager();
        let tokens: Vec<u32> = (0..40).collect();
        let tok = |i: usize| tokens[i];
        let a = m.add_seq().unwrap();
        assert_eq!(m.attach_prefix(a, 40, &tok).unwrap(), 0);
        // One step of 20 tokens, one of 12: boundaries 16 and 32.
        for (start, end) in [(0, 20), (20, 32)] {
            m.ensure_capacity(a, end).unwrap();
            m.begin_capture(a, start, end).unwrap();
            fill(&mut m, a, start, end);
            // What the view would have copied during the step.
            let caps = m.slot_captures[m.seqs[&a].slot].clone();
            let slot = m.seqs[&a].slot;
            let range = m.slot_range(slot);
            for (boundary, rec) in caps {
                let f = m.layout.snapshot.floats;
                let state = &m.states[range.clone()];
                let data = m.prefix.as_mut().unwrap().snapshot_data_mut();
                let snapshot = &mut data[rec * f..(rec + 1) * f];
                each_row(&m.layout, boundary, boundary, |ring, kept| {
                    snapshot[kept].copy_from_slice(&state[ring]);
                });
            }
            m.commit_prefix(a, end, &tok).unwrap();
        }
        assert_eq!(m.prefix_usage().unwrap().nodes, 2);
        let b = m.add_seq().unwrap();
        assert_eq!(m.attach_prefix(b, 40, &tok).unwrap(), 32);
        assert_eq!(m.capacity_tokens(b).unwrap(), 32);
        for i in 0..m.pools.len() {
            let (ta, tb) = (
                &m.slot_tables[m.seqs[&a].slot][i],
                &m.slot_tables[m.seqs[&b].slot][i],
            );
            assert_eq!(
                ta.blocks()[..tb.len()],
                *tb.blocks(),
                "pool {i} shares a's blocks"
            );
        }
        let (sa, sb) = (m.slot_range(m.seqs[&a].slot), m.slot_range(m.seqs[&b].slot));
        for part in &m.layout.snapshot.parts {
            for pos in 32 - part.rows..32 {
                let r = ring_row(part, pos);
                assert_eq!(
                    m.states[sa.clone()][r.clone()],
                    m.states[sb.clone()][r],
                    "{part:?} {pos}"
                );
            }
        }
        // A shorter request reuses only whole blocks that leave a token.
        let c = m.add_seq().unwrap();
        assert_eq!(m.attach_prefix(c, 32, &tok).unwrap(), 16);
        for id in [a, b, c] {
            m.free_seq(id).unwrap();
        }
        let usage = m.usage();
        assert!(usage.iter().all(|u| u.used_blocks == 0), "{usage:?}");
        assert!(usage[1].cached_blocks > 0);
        assert_eq!(m.reset_prefix_cache(false), 2);
        assert!(m.usage().iter().all(|u| u.cached_blocks == 0));
        assert_eq!(m.prefix_usage().unwrap().snapshots, 0);
    }

    #[test]
    fn window_kind_is_kept_for_every_main_layer() {
        let m = manager();
        let windows = m
            .layout
            .snapshot
            .parts
            .iter()
            .filter(|p| p.what == RingKind::Window)
            .count();
        assert_eq!(windows, 4);
    }
}
