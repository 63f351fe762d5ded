//! Continuous batching (vLLM V1's unified scheduler): every step hands out a token budget,
//! running sequences first (decodes are never starved by prefills), then waiting ones in
//! arrival order. Long prompts are split across steps (chunked prefill). A decoding
//! sequence with draft tokens gets room for them too (speculative decoding verifies them in
//! the same step); drafts are the first thing given up when the budget or the cache is
//! short. When the cache runs out, the most recently admitted running sequence is
//! preempted: its cache is freed and it is recomputed from its tokens later, which under
//! greedy decoding gives the same tokens (chunked recompute is exact).

use crate::cache::{is_exhausted, BlockAllocator, CacheError};
use crate::request::RequestId;
use crate::sequence::Sequence;
use std::collections::{HashMap, VecDeque};

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens in one forward step (draft tokens included).
    pub max_num_batched_tokens: usize,
    /// Most prompt tokens one sequence feeds per step (None: only the step budget limits).
    pub prefill_chunk: Option<usize>,
    /// Longest sequence (prompt + output) the engine accepts.
    pub max_model_len: usize,
}

/// One sequence's part of a step. Its tokens start at the sequence's `num_computed`: the
/// known tokens not yet in the cache, then `num_draft` draft tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub id: RequestId,
    /// Tokens appended this step, drafts included.
    pub num_tokens: usize,
    pub num_draft: usize,
    /// Rows at the end of the span whose logits the step needs: none while a prompt is
    /// still being fed, one to sample the next token, `1 + num_draft` to verify drafts.
    pub num_logits: usize,
}

/// What one step computes, in batch order, and who lost their cache to make room.
#[derive(Debug, Default)]
pub struct SchedulerOutput {
    pub scheduled: Vec<ScheduledSeq>,
    pub preempted: Vec<RequestId>,
    /// Tokens of the sequences admitted this step looked up in the prefix cache, and those
    /// found (vLLM's `prefix_cache_queries` / `prefix_cache_hits`).
    pub prefix_queries: usize,
    pub prefix_hits: usize,
}

impl SchedulerOutput {
    pub fn num_tokens(&self) -> usize {
        self.scheduled.iter().map(|s| s.num_tokens).sum()
    }

    fn clear(&mut self) {
        self.scheduled.clear();
        self.preempted.clear();
        self.prefix_queries = 0;
        self.prefix_hits = 0;
    }
}

#[derive(Default)]
pub struct Scheduler {
    pub waiting: VecDeque<RequestId>,
    pub running: Vec<RequestId>,
    /// The model's image positions see their whole image span (V4-Flash-Vision-Exp): a
    /// span is prefilled in one chunk, and a cached prefix is never resumed inside one.
    pub whole_images: bool,
}

impl Scheduler {
    pub fn add(&mut self, id: RequestId) {
        self.waiting.push_back(id);
    }

    pub fn remove(&mut self, id: RequestId) {
        self.waiting.retain(|&r| r != id);
        self.running.retain(|&r| r != id);
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Plans the next step into `out` (its buffers are reused), reserving cache room for
    /// every scheduled token through `alloc`.
    pub fn schedule(
        &mut self,
        cfg: &SchedulerConfig,
        seqs: &mut HashMap<RequestId, Sequence>,
        alloc: &mut dyn BlockAllocator,
        out: &mut SchedulerOutput,
    ) -> Result<(), CacheError> {
        out.clear();
        let mut budget = cfg.max_num_batched_tokens;
        let cap = cfg.prefill_chunk.unwrap_or(usize::MAX);
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            // Its reader is behind: the sequence waits (keeping its cache) for room.
            if !seqs[&id].out.has_room() {
                i += 1;
                continue;
            }
            // `None`: it preempted itself, and the sequence at `i` is now the next one.
            let fit = (cap, budget, cfg.max_model_len);
            if let Some(s) = self.schedule_running(id, fit, seqs, alloc, out)? {
                out.scheduled.push(s);
                budget = budget.saturating_sub(s.num_tokens);
                i += 1;
            }
        }
        // Admit waiting requests in order while budget, slots and blocks last (none in a
        // step that had to preempt: memory is already short). One whose reader is behind
        // keeps its place in line without being admitted, and so does one whose prefix the
        // disk tier is still reading ahead while this step has other work (its read then
        // overlaps that work instead of stalling it).
        let memory_short = !out.preempted.is_empty();
        let mut w = 0;
        while !memory_short && budget > 0 && w < self.waiting.len() {
            let id = self.waiting[w];
            let seq = &seqs[&id];
            if !seq.out.has_room() || (seq.reading_ahead() && !out.scheduled.is_empty()) {
                w += 1;
                continue;
            }
            let admitted = if self.running.len() < cfg.max_num_seqs {
                admit(id, (cap, budget, self.whole_images), seqs, alloc, out)?
            } else {
                None
            };
            let Some(s) = admitted else {
                // No slot or no cache left: a running sequence paused for its reader gives
                // its own up (it recomputes once resumed) rather than hold the line.
                if self.preempt_paused(seqs, alloc, out)? {
                    w += 1; // the victim went to the front of the line
                    continue;
                }
                break;
            };
            self.waiting.remove(w);
            self.running.push(id);
            out.scheduled.push(s);
            budget = budget.saturating_sub(s.num_tokens);
        }
        Ok(())
    }

    /// Preempts the most recently admitted running sequence whose reader is behind, if any.
    fn preempt_paused(
        &mut self,
        seqs: &mut HashMap<RequestId, Sequence>,
        alloc: &mut dyn BlockAllocator,
        out: &mut SchedulerOutput,
    ) -> Result<bool, CacheError> {
        let paused = self
            .running
            .iter()
            .rposition(|id| !seqs[id].out.has_room())
            .map(|i| self.running[i]);
        let Some(victim) = paused else {
            return Ok(false);
        };
        if out.scheduled.iter().any(|s| s.id == victim) {
            return Ok(false);
        }
        self.preempt(victim, seqs, alloc)?;
        out.preempted.push(victim);
        Ok(true)
    }

    /// Room for a running sequence's next tokens: with its drafts if they fit, else
    /// without, else after preempting the newest running sequences. `None` when it was the
    /// one preempted.
    fn schedule_running(
        &mut self,
        id: RequestId,
        (cap, budget, max_model_len): (usize, usize, usize),
        seqs: &mut HashMap<RequestId, Sequence>,
        alloc: &mut dyn BlockAllocator,
        out: &mut SchedulerOutput,
    ) -> Result<Option<ScheduledSeq>, CacheError> {
        loop {
            let seq = &seqs[&id];
            let cache = seq.cache.expect("running sequences hold a cache");
            let mut known = seq.num_uncomputed().min(cap).min(budget);
            if self.whole_images {
                known = whole_spans(seq, seq.num_computed, known);
            }
            let drafts = if seq.num_uncomputed() == 1 {
                seq.spec
                    .draft_ids
                    .len()
                    .min(budget.saturating_sub(known))
                    .min(seq.max_drafts(max_model_len))
            } else {
                0
            };
            for d in [drafts, 0] {
                match alloc.ensure_capacity(cache, seq.num_computed + known + d) {
                    Ok(()) => return Ok(Some(plan(id, seq, known, d))),
                    Err(e) if is_exhausted(&e) => {
                        if d == 0 {
                            break;
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            let victim = *self.running.last().expect("non-empty");
            self.preempt(victim, seqs, alloc)?;
            out.preempted.push(victim);
            if victim == id {
                return Ok(None);
            }
        }
    }

    /// Frees a running sequence's cache and puts it first in line for recompute.
    fn preempt(
        &mut self,
        id: RequestId,
        seqs: &mut HashMap<RequestId, Sequence>,
        alloc: &mut dyn BlockAllocator,
    ) -> Result<(), CacheError> {
        let seq = seqs.get_mut(&id).expect("running sequences exist");
        if let Some(cache) = seq.preempt() {
            alloc.free_seq(cache)?;
        }
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        tracing::debug!(request = id, "preempted (recompute)");
        Ok(())
    }
}

/// A waiting sequence's first chunk, with a cache of its own that starts from the longest
/// cached prefix of its tokens; `None` when the cache has no room (it stays waiting).
fn admit(
    id: RequestId,
    (cap, budget, whole_images): (usize, usize, bool),
    seqs: &mut HashMap<RequestId, Sequence>,
    alloc: &mut dyn BlockAllocator,
    out: &mut SchedulerOutput,
) -> Result<Option<ScheduledSeq>, CacheError> {
    let mut cache = match alloc.add_seq() {
        Ok(c) => c,
        Err(e) if is_exhausted(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let seq = seqs.get_mut(&id).expect("waiting sequences exist");
    let len = seq.num_tokens();
    let mut cached = alloc.attach_prefix(cache, len, &|i| seq.key_token(i))?;
    if let Some((a, _)) = seq.request.image_cut(cached).filter(|_| whole_images) {
        // A hit that ends inside an image span resumes from before it: the span's
        // positions see one another (V4-Flash-Vision-Exp), so it is computed in one chunk.
        alloc.free_seq(cache)?;
        cache = alloc.add_seq()?;
        cached = alloc.attach_prefix(cache, a, &|i| seq.key_token(i))?;
    }
    let mut n = (len - cached).min(cap).min(budget);
    if whole_images {
        n = whole_spans(seq, cached, n);
    }
    if let Err(e) = alloc.ensure_capacity(cache, cached + n) {
        alloc.free_seq(cache)?;
        return if is_exhausted(&e) { Ok(None) } else { Err(e) };
    }
    out.prefix_queries += len;
    out.prefix_hits += cached;
    seq.num_computed = cached;
    if seq.num_cached_tokens.is_none() {
        seq.num_cached_tokens = Some(cached);
    }
    seq.cache = Some(cache);
    Ok(Some(plan(id, seq, n, 0)))
}

/// `n` tokens from `start`, moved so that the chunk does not end inside an image span: back
/// to the span's start, or when the span starts the chunk, on to its end (past the step's
/// budget if need be, as vLLM schedules an image's tokens whole).
fn whole_spans(seq: &Sequence, start: usize, n: usize) -> usize {
    match seq.request.image_cut(start + n) {
        Some((a, _)) if a > start => a - start,
        Some((_, b)) => b - start,
        None => n,
    }
}

fn plan(id: RequestId, seq: &Sequence, known: usize, drafts: usize) -> ScheduledSeq {
    let completes = seq.num_computed + known == seq.num_tokens();
    ScheduledSeq {
        id,
        num_tokens: known + drafts,
        num_draft: drafts,
        num_logits: if completes { 1 + drafts } else { 0 },
    }
}

#[cfg(test)]
mod tests;
