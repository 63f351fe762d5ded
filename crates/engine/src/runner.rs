//! The model runner: turns "append these tokens to these sequences" into one flat
//! [`ForwardBatch`], makes sure the cache can hold them, and runs the model.
//!
//! It owns the model and the cache pools and tracks every sequence's length. It is where
//! truncation is checked: a sequence may be shortened by at most the cache's rollback slack
//! below the furthest position it has written, because the rings only keep that much
//! history beyond what the model reads.

use crate::cache::{CacheConfig, CacheError, CacheManager, SeqId};
use deepinfer_model::batch::{ForwardBatch, Logits, SeqSpan};
use deepinfer_model::v4::{Model, ModelError};
use std::collections::HashMap;

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("unknown sequence {0:?}")]
    UnknownSequence(SeqId),
    #[error("sequence {seq:?} appears twice in one step")]
    DuplicateSequence { seq: SeqId },
    #[error("cannot truncate sequence {seq:?} to {to} tokens: it has {len}")]
    TruncateBeyondLength { seq: SeqId, to: usize, len: usize },
    #[error(
        "cannot truncate sequence {seq:?} to {to} tokens: it has written up to {high_water}, and the cache keeps only {slack} tokens of rollback history"
    )]
    TruncateTooFar {
        seq: SeqId,
        to: usize,
        high_water: usize,
        slack: usize,
    },
}

#[derive(Clone, Copy, Debug)]
struct SeqState {
    /// Tokens whose state is in the cache.
    len: usize,
    /// The furthest length ever reached: rings may hold rows up to here.
    high_water: usize,
}

pub struct ModelRunner {
    model: Model,
    cache: CacheManager,
    seqs: HashMap<SeqId, SeqState>,
    /// Reused every step, so a decode step's batch and logits allocate nothing.
    batch: ForwardBatch,
    logits: Logits,
    ids: Vec<SeqId>,
}

/// One sequence's part of a step: the tokens to append at its current length.
pub struct SeqWork<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    /// Logits for every appended token (chunked-prefill checks, verification) or the last.
    pub all_logits: bool,
}

impl ModelRunner {
    pub fn new(model: Model, cache: CacheConfig) -> Result<Self, RunnerError> {
        let cache = CacheManager::new(&model.config, cache)?;
        let logits = Logits {
            vocab: model.config.vocab_size,
            data: Vec::new(),
        };
        Ok(Self {
            model,
            cache,
            seqs: HashMap::new(),
            batch: ForwardBatch::default(),
            logits,
            ids: Vec::new(),
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn cache(&self) -> &CacheManager {
        &self.cache
    }

    /// The model and the cache side by side, for callers that drive single layers
    /// (benchmarks) without going through [`ModelRunner::step`].
    pub fn parts_mut(&mut self) -> (&Model, &mut CacheManager) {
        (&self.model, &mut self.cache)
    }

    pub fn add_sequence(&mut self) -> Result<SeqId, RunnerError> {
        let id = self.cache.add_seq()?;
        self.seqs.insert(
            id,
            SeqState {
                len: 0,
                high_water: 0,
            },
        );
        Ok(id)
    }

    /// Makes room in the cache for `tokens` tokens of `seq` (all or nothing).
    pub fn reserve(&mut self, seq: SeqId, tokens: usize) -> Result<(), RunnerError> {
        if !self.seqs.contains_key(&seq) {
            return Err(RunnerError::UnknownSequence(seq));
        }
        Ok(self.cache.ensure_capacity(seq, tokens)?)
    }

    pub fn seq_len(&self, seq: SeqId) -> Result<usize, RunnerError> {
        self.seqs
            .get(&seq)
            .map(|s| s.len)
            .ok_or(RunnerError::UnknownSequence(seq))
    }

    /// Appends every item's tokens to its sequence in one forward and returns, per item, the
    /// logits asked for (valid until the next step). On error no sequence's length changes.
    pub fn step(&mut self, work: &[SeqWork<'_>]) -> Result<&Logits, RunnerError> {
        let (batch, ids) = (&mut self.batch, &mut self.ids);
        batch.token_ids.clear();
        batch.positions.clear();
        batch.spans.clear();
        batch.logits_rows.clear();
        ids.clear();
        for item in work {
            let state = *self
                .seqs
                .get(&item.seq)
                .ok_or(RunnerError::UnknownSequence(item.seq))?;
            if ids.contains(&item.seq) {
                return Err(RunnerError::DuplicateSequence { seq: item.seq });
            }
            ids.push(item.seq);
            let start = batch.token_ids.len();
            batch.token_ids.extend_from_slice(item.tokens);
            batch
                .positions
                .extend(state.len..state.len + item.tokens.len());
            batch.spans.push(SeqSpan {
                start,
                len: item.tokens.len(),
            });
            if item.all_logits {
                batch.logits_rows.extend(start..start + item.tokens.len());
            } else if !item.tokens.is_empty() {
                batch.logits_rows.push(start + item.tokens.len() - 1);
            }
            self.cache
                .ensure_capacity(item.seq, state.len + item.tokens.len())?;
        }
        {
            let mut view = self.cache.view(ids)?;
            self.model
                .forward_into(batch, &mut view, &mut self.logits, None)?;
        }
        for item in work {
            let s = self.seqs.get_mut(&item.seq).expect("checked above");
            s.len += item.tokens.len();
            s.high_water = s.high_water.max(s.len);
        }
        Ok(&self.logits)
    }

    /// Shortens a sequence (rejected draft tokens, a rollback): the next step rewrites every
    /// row past `to` before anything reads it.
    pub fn truncate(&mut self, seq: SeqId, to: usize) -> Result<(), RunnerError> {
        let slack = self.cache.rollback_slack();
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(RunnerError::UnknownSequence(seq))?;
        if to > s.len {
            return Err(RunnerError::TruncateBeyondLength {
                seq,
                to,
                len: s.len,
            });
        }
        if s.high_water - to > slack {
            return Err(RunnerError::TruncateTooFar {
                seq,
                to,
                high_water: s.high_water,
                slack,
            });
        }
        s.len = to;
        self.cache.truncate(seq, to)?;
        Ok(())
    }

    /// Frees a finished or aborted sequence's cache.
    pub fn free(&mut self, seq: SeqId) -> Result<(), RunnerError> {
        self.seqs
            .remove(&seq)
            .ok_or(RunnerError::UnknownSequence(seq))?;
        self.cache.free_seq(seq)?;
        Ok(())
    }
}
