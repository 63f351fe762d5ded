//! The MTP drafter (docs/MODEL.md §7.1): the checkpoint's draft block predicts the token after
//! next from the target's final streams at a position and the token that follows it.
//!
//! After every step it first *follows* each sequence over the positions the step committed
//! (one batched pass, filling its window ring with rows computed from the target's own
//! streams), which also drafts the first token for every sequence that drafts next step;
//! then each further draft position is one batched pass over those sequences, chained
//! EAGLE-style: the block's output streams are the next pass's input. Chained rows lie
//! beyond what the block has followed and are rewritten by the next follow pass (the ring's
//! rollback slack covers them). A sequence the policy paused is not followed; when it
//! drafts again, its window restarts at the first position followed (a floor below which
//! the ring holds nothing of use).

use super::StepRecord;
use crate::cache::{CacheManager, SeqId};
use crate::request::RequestId;
use crate::runner::{ModelRunner, RunnerError};
use crate::sequence::Sequence;
use deepinfer_model::batch::{ForwardBatch, Logits};
use deepinfer_model::kernels::topk::argmax;
use std::collections::HashMap;

/// How far the MTP block has followed a sequence: its window ring holds rows computed from
/// the target's streams for positions `floor..len`.
#[derive(Clone, Copy, Debug, Default)]
pub struct MtpProgress {
    len: usize,
    floor: usize,
}

/// One sequence being drafted for: where its newest draft row is.
#[derive(Clone, Copy, Debug)]
struct Chain {
    id: RequestId,
    cache: SeqId,
    floor: usize,
    /// Row of the sequence's newest output streams in the last pass.
    row: usize,
    /// Position of that row.
    pos: usize,
}

/// Reused buffers of the drafter's passes.
pub struct MtpProposer {
    batch: ForwardBatch,
    ids: Vec<SeqId>,
    hidden_in: Vec<f32>,
    hidden_out: Vec<f32>,
    logits: Logits,
    chains: Vec<Chain>,
    /// Floats of one row's streams (`hc · D`).
    width: usize,
}

impl Default for MtpProposer {
    fn default() -> Self {
        Self {
            batch: ForwardBatch::default(),
            ids: Vec::new(),
            hidden_in: Vec::new(),
            hidden_out: Vec::new(),
            logits: Logits {
                vocab: 0,
                data: Vec::new(),
            },
            chains: Vec::new(),
            width: 0,
        }
    }
}

impl MtpProposer {
    pub fn propose(
        &mut self,
        records: &[StepRecord],
        seqs: &mut HashMap<RequestId, Sequence>,
        step: u64,
        runner: &mut ModelRunner,
        cache: &mut CacheManager,
    ) -> Result<(), RunnerError> {
        self.follow(records, seqs, step, runner, cache)?;
        for depth in 1.. {
            self.chains.retain(|c| {
                seqs.get(&c.id)
                    .is_some_and(|s| s.spec.policy.planned > depth)
            });
            if self.chains.is_empty() {
                break;
            }
            self.chain_pass(seqs, runner, cache)?;
        }
        Ok(())
    }

    /// The follow pass: every followed sequence's newly committed positions, with the
    /// token after each; logits at the last one for the sequences drafting next step.
    fn follow(
        &mut self,
        records: &[StepRecord],
        seqs: &mut HashMap<RequestId, Sequence>,
        step: u64,
        runner: &mut ModelRunner,
        cache: &mut CacheManager,
    ) -> Result<(), RunnerError> {
        self.begin();
        let c = &runner.model().config;
        self.width = c.hc_mult * c.hidden_size;
        let (hidden, width) = (runner.hidden(), self.width);
        for r in records {
            let Some(s) = seqs.get_mut(&r.id) else {
                continue;
            };
            s.spec.draft_ids.clear();
            if !s.spec.policy.follows(s.is_decoding(), step) || r.committed == 0 {
                continue;
            }
            let Some(cache_id) = s.cache else {
                continue;
            };
            let mtp = &mut s.spec.mtp;
            if mtp.len != r.start {
                // Not followed since `len`: nothing older than this step is in the ring.
                mtp.floor = r.start;
            }
            mtp.len = r.start + r.committed;
            let floor = mtp.floor;
            let drafts = s.spec.policy.planned > 0;
            let first = self.batch.token_ids.len();
            // Row `i` at position `start + i` reads the token after it.
            let next = (r.start + 1..=r.start + r.committed).map(|i| s.token(i));
            self.push_span(cache_id, r.start, next, floor, drafts);
            self.hidden_in
                .extend_from_slice(&hidden[r.row * width..(r.row + r.committed) * width]);
            if drafts {
                self.chains.push(Chain {
                    id: r.id,
                    cache: cache_id,
                    floor,
                    row: first + r.committed - 1,
                    pos: r.start + r.committed - 1,
                });
            }
        }
        if self.ids.is_empty() {
            return Ok(());
        }
        self.run(seqs, runner, cache)
    }

    /// One chained draft position for every sequence still drafting.
    fn chain_pass(
        &mut self,
        seqs: &mut HashMap<RequestId, Sequence>,
        runner: &mut ModelRunner,
        cache: &mut CacheManager,
    ) -> Result<(), RunnerError> {
        let prev = std::mem::take(&mut self.hidden_out);
        let chains = std::mem::take(&mut self.chains);
        self.begin();
        let width = self.width;
        for c in &chains {
            let draft = *seqs[&c.id].spec.draft_ids.last().expect("drafted");
            self.push_span(c.cache, c.pos + 1, [draft], c.floor, true);
            self.hidden_in
                .extend_from_slice(&prev[c.row * width..(c.row + 1) * width]);
        }
        self.chains = chains;
        for (i, c) in self.chains.iter_mut().enumerate() {
            c.row = i;
            c.pos += 1;
        }
        self.hidden_out = prev;
        self.run(seqs, runner, cache)
    }

    fn begin(&mut self) {
        self.batch.clear();
        self.ids.clear();
        self.hidden_in.clear();
    }

    fn push_span(
        &mut self,
        cache: SeqId,
        start: usize,
        tokens: impl IntoIterator<Item = u32>,
        floor: usize,
        logits: bool,
    ) {
        self.batch.push_span(start, tokens, usize::from(logits));
        self.batch.window_floor.push(floor);
        self.ids.push(cache);
    }

    /// Runs the pass and appends each drafting sequence's next draft token.
    fn run(
        &mut self,
        seqs: &mut HashMap<RequestId, Sequence>,
        runner: &mut ModelRunner,
        cache: &mut CacheManager,
    ) -> Result<(), RunnerError> {
        runner.run_mtp(
            cache,
            &self.ids,
            &self.batch,
            &self.hidden_in,
            &mut self.logits,
            &mut self.hidden_out,
        )?;
        for (i, c) in self.chains.iter().enumerate() {
            let s = seqs.get_mut(&c.id).expect("drafting sequences run");
            // Drafts are greedy: the most likely token, lowest id on ties.
            s.spec.draft_ids.push(argmax(self.logits.row(i)) as u32);
        }
        Ok(())
    }
}
