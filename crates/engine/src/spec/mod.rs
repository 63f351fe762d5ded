//! Speculative decoding: a drafter proposes a few tokens per decoding sequence after each
//! step, the next step runs them through the target model with the sequence's real token
//! (one span of `1 + k` rows), and the sampler keeps the longest prefix the target agrees
//! with plus one token of its own (greedy: exact match; sampling: rejection sampling,
//! [`crate::sampler::Sampler::verify_row`]). Rejected rows are dropped by truncating the
//! cache, which works for every V4 cache kind because every row is addressed by absolute
//! position and the rings keep `k` tokens of slack.
//!
//! On a CPU a verify step of `k + 1` tokens reads up to `k + 1` times the expert bytes of a
//! plain step, so drafting only pays with good acceptance: the [`policy`] measures both
//! sides and stops drafting where it does not.
//!
//! Proposers: the checkpoint's MTP block ([`mtp`]), the DSpark drafter ([`dspark`]) and,
//! for measurement, [`replay`].

pub mod config;
mod dspark;
mod mtp;
mod policy;
mod replay;
mod verification;

pub use config::{SpecMethod, SpeculativeConfig};
pub use policy::StepTiming;

use crate::cache::CacheManager;
use crate::request::RequestId;
use crate::runner::{ModelRunner, RunnerError};
use crate::sequence::Sequence;
use deepinfer_model::config::ModelConfig;
use dspark::{DsparkProgress, DsparkProposer};
use mtp::{MtpProgress, MtpProposer};
use policy::{Policy, SeqPolicy};
use replay::ReplayProposer;
use std::collections::HashMap;
use verification::AdaptiveVerification;

/// A sequence's speculative-decoding state.
#[derive(Debug, Default)]
pub struct SeqSpec {
    /// Draft tokens for the next step, to follow the sequence's last token.
    pub draft_ids: Vec<u32>,
    mtp: MtpProgress,
    dspark: DsparkProgress,
    policy: SeqPolicy,
}

impl SeqSpec {
    /// Forgets drafts and the drafter's cache progress (the sequence lost its cache); what
    /// the policy learnt about the sequence stays.
    pub fn reset(&mut self) {
        self.draft_ids.clear();
        self.mtp = MtpProgress::default();
        self.dspark = DsparkProgress::default();
    }
}

/// What one sequence did in the step just run: the rows `row..row + committed` of the
/// batch hold positions `start..start + committed`, now in the cache for good (known
/// tokens plus accepted drafts; rejected rows are already truncated away).
#[derive(Clone, Copy, Debug)]
pub struct StepRecord {
    pub id: RequestId,
    pub row: usize,
    pub start: usize,
    pub committed: usize,
    /// Drafts verified in this step and how many the target accepted.
    pub drafted: usize,
    pub accepted: usize,
}

enum Proposer {
    Mtp(MtpProposer),
    Dspark(DsparkProposer),
    Replay(ReplayProposer),
}

/// Owns the drafter and the policy; the engine calls it after every step.
pub struct Speculator {
    k: usize,
    proposer: Proposer,
    policy: Policy,
    /// `enable_adaptive_verification`: DSpark's drafts trimmed by their confidences.
    verification: Option<AdaptiveVerification>,
}

impl Speculator {
    pub fn new(cfg: &SpeculativeConfig, max_seqs: usize) -> Self {
        let proposer = match &cfg.method {
            SpecMethod::Mtp => Proposer::Mtp(MtpProposer::default()),
            SpecMethod::Dspark => Proposer::Dspark(DsparkProposer::default()),
            SpecMethod::Replay {
                acceptance_rate,
                seed,
                script,
            } => Proposer::Replay(ReplayProposer::new(*acceptance_rate, *seed, script)),
        };
        Self {
            k: cfg.num_speculative_tokens,
            proposer,
            policy: Policy::new(cfg.num_speculative_tokens, cfg.adaptive, max_seqs),
            verification: cfg
                .enable_adaptive_verification
                .then(AdaptiveVerification::default),
        }
    }

    pub fn num_speculative_tokens(&self) -> usize {
        self.k
    }

    /// Whether the target step must keep its final streams (the MTP block drafts from
    /// them).
    pub fn needs_hidden(&self) -> bool {
        matches!(self.proposer, Proposer::Mtp(_))
    }

    /// Window-only layers the drafter keeps in the cache after the main ones: the MTP
    /// block's ring, or one context ring per DSpark stage.
    pub fn draft_layers(&self, c: &ModelConfig) -> usize {
        match self.proposer {
            Proposer::Mtp(_) => c.num_nextn_predict_layers.max(1),
            Proposer::Dspark(_) => c.dspark.as_ref().map_or(0, |d| d.stages),
            Proposer::Replay(_) => 0,
        }
    }

    /// Learns from the step just run (its timing and every verified draft).
    pub fn observe(
        &mut self,
        timing: &StepTiming,
        records: &[StepRecord],
        seqs: &mut HashMap<RequestId, Sequence>,
    ) {
        self.policy.observe(timing, records, seqs);
    }

    /// Proposes the next step's drafts for every sequence that took part in this one and
    /// still runs. The target's final streams of this step are in `runner`.
    pub fn propose(
        &mut self,
        records: &[StepRecord],
        seqs: &mut HashMap<RequestId, Sequence>,
        runner: &mut ModelRunner,
        cache: &mut CacheManager,
        max_model_len: usize,
    ) -> Result<(), RunnerError> {
        self.policy.plan(records, seqs, max_model_len);
        match &mut self.proposer {
            Proposer::Mtp(p) => p.propose(records, seqs, self.policy.step, runner, cache),
            Proposer::Dspark(p) => {
                p.propose(records, seqs, runner, cache)?;
                let Some(v) = &mut self.verification else {
                    return Ok(());
                };
                let decoding = records
                    .iter()
                    .filter(|r| seqs.get(&r.id).is_some_and(Sequence::is_decoding))
                    .count();
                // Until a plain step has been timed there is nothing to weigh them against.
                if let Some((per_draft, plain)) = self.policy.verify_costs(decoding) {
                    let step = (decoding as f64, plain + p.seconds, per_draft);
                    v.trim(&p.drafted, &p.confidence, seqs, step);
                }
                Ok(())
            }
            Proposer::Replay(p) => {
                p.propose(records, seqs, runner.model().config.vocab_size);
                Ok(())
            }
        }
    }
}
