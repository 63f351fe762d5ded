//! Continuous batching (vLLM V1's unified scheduler): every step hands out a token budget,
//! running sequences first (decodes are never starved by prefills), then waiting ones in
//! arrival order. Long prompts are split across steps (chunked prefill). When the cache
//! pools run out, the most recently admitted running sequence is preempted: its cache is
//! freed and it is recomputed from its tokens later, which under greedy decoding gives the
//! same tokens (chunked recompute is exact).

use crate::cache::CacheError;
use crate::request::RequestId;
use crate::runner::{ModelRunner, RunnerError};
use crate::sequence::{SeqStatus, Sequence};
use std::collections::{HashMap, VecDeque};

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens in one forward step.
    pub max_num_batched_tokens: usize,
    /// Most prompt tokens one sequence feeds per step (None: only the step budget limits).
    pub prefill_chunk: Option<usize>,
    /// Longest sequence (prompt + output) the engine accepts.
    pub max_model_len: usize,
}

/// What one step computes: `(request, tokens to append)` in batch order.
#[derive(Debug, Default)]
pub struct SchedulerOutput {
    pub scheduled: Vec<(RequestId, usize)>,
    pub preempted: Vec<RequestId>,
}

#[derive(Default)]
pub struct Scheduler {
    pub waiting: VecDeque<RequestId>,
    pub running: Vec<RequestId>,
}

fn out_of_blocks(e: &RunnerError) -> bool {
    matches!(
        e,
        RunnerError::Cache(CacheError::OutOfBlocks { .. } | CacheError::NoFreeSlot { .. })
    )
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

    pub fn schedule(
        &mut self,
        cfg: &SchedulerConfig,
        seqs: &mut HashMap<RequestId, Sequence>,
        runner: &mut ModelRunner,
    ) -> Result<SchedulerOutput, RunnerError> {
        let mut out = SchedulerOutput::default();
        let mut budget = cfg.max_num_batched_tokens;
        let cap = cfg.prefill_chunk.unwrap_or(usize::MAX);

        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let seq = &seqs[&id];
            let n = seq.num_uncomputed().min(cap).min(budget);
            let target = seq.num_computed + n;
            let cache = seq.cache.expect("running sequences hold a cache");
            let mut scheduled = true;
            loop {
                match runner.reserve(cache, target) {
                    Ok(()) => break,
                    Err(e) if out_of_blocks(&e) => {
                        let victim = *self.running.last().expect("non-empty");
                        self.preempt(victim, seqs, runner)?;
                        out.preempted.push(victim);
                        if victim == id {
                            scheduled = false;
                            break;
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            if scheduled {
                out.scheduled.push((id, n));
                budget -= n;
                i += 1;
            }
        }

        // Admit waiting requests while budget, slots and blocks last (none in a step that
        // had to preempt: memory is already short).
        while out.preempted.is_empty() && budget > 0 && self.running.len() < cfg.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let cache = match runner.add_sequence() {
                Ok(c) => c,
                Err(e) if out_of_blocks(&e) => break,
                Err(e) => return Err(e),
            };
            let seq = seqs.get_mut(&id).expect("waiting sequences exist");
            let n = seq.num_uncomputed().min(cap).min(budget);
            match runner.reserve(cache, n) {
                Ok(()) => {}
                Err(e) => {
                    runner.free(cache)?;
                    if out_of_blocks(&e) {
                        break;
                    }
                    return Err(e);
                }
            }
            self.waiting.pop_front();
            seq.cache = Some(cache);
            seq.status = SeqStatus::Running;
            self.running.push(id);
            out.scheduled.push((id, n));
            budget -= n;
        }
        Ok(out)
    }

    /// Frees a running sequence's cache and puts it first in line for recompute.
    fn preempt(
        &mut self,
        id: RequestId,
        seqs: &mut HashMap<RequestId, Sequence>,
        runner: &mut ModelRunner,
    ) -> Result<(), RunnerError> {
        let seq = seqs.get_mut(&id).expect("running sequences exist");
        if let Some(cache) = seq.cache.take() {
            runner.free(cache)?;
        }
        seq.num_computed = 0;
        seq.status = SeqStatus::Waiting;
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        tracing::debug!(request = id, "preempted (recompute)");
        Ok(())
    }
}
