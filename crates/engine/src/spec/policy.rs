//! When drafting pays: per step, what verification and drafting cost against a plain
//! step, and per sequence, how often its drafts are accepted.
//!
//! A plain decode step of `B` sequences takes `P(B)` and yields `B` tokens. Drafting `k`
//! tokens for a sequence adds `k · c` to the step, where `c` is the measured extra target
//! time per verified draft token plus the drafter's time per draft token, and yields
//! `α + α² + … + α^k` more tokens on average (`α`: the sequence's per-token acceptance).
//! Drafts are handed out one token at a time to whichever sequence gains most from its
//! next one, while the gain per second beats the step's current tokens per second. A
//! sequence that gets none stops drafting (its drafter does no work either) and tries
//! again after a backoff that doubles up to [`MAX_BACKOFF`] steps, so a model that never
//! predicts itself well pays for one short probe now and then, not for every step.

use super::StepRecord;
use crate::request::RequestId;
use crate::sequence::Sequence;
use std::collections::HashMap;

/// Steps a sequence waits before probing again after drafting stopped paying (doubling).
const FIRST_BACKOFF: u64 = 16;
const MAX_BACKOFF: u64 = 256;
/// Weight of the newest observation in the running averages.
const EWMA: f64 = 0.2;
/// Per-observation decay of the acceptance counts, so the estimate follows the text.
const ACCEPT_DECAY: f64 = 0.9;

/// What the step just finished cost.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepTiming {
    /// Seconds of the target forward pass.
    pub target_s: f64,
    /// Seconds the drafter spent proposing this step's drafts (after the previous step).
    pub draft_s: f64,
    /// Whether every scheduled sequence was decoding (one known token each): only such
    /// steps measure decode costs.
    pub pure_decode: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct Ewma {
    value: f64,
    n: u32,
}

impl Ewma {
    fn update(&mut self, x: f64) {
        self.value = if self.n == 0 {
            x
        } else {
            self.value + EWMA * (x - self.value)
        };
        self.n = self.n.saturating_add(1);
    }

    fn get(&self) -> Option<f64> {
        (self.n > 0).then_some(self.value)
    }
}

/// Decayed counts of accepted and rejected draft tokens.
#[derive(Clone, Copy, Debug, Default)]
struct Acceptance {
    hits: f64,
    misses: f64,
}

impl Acceptance {
    fn update(&mut self, drafted: usize, accepted: usize) {
        self.hits = self.hits * ACCEPT_DECAY + accepted as f64;
        let missed = if accepted < drafted { 1.0 } else { 0.0 };
        self.misses = self.misses * ACCEPT_DECAY + missed;
    }

    fn observed(&self) -> bool {
        self.hits + self.misses > 0.0
    }

    /// Per-token acceptance, with one imagined hit and miss so a few observations do not
    /// read as certainty.
    fn rate(&self) -> f64 {
        (self.hits + 1.0) / (self.hits + self.misses + 2.0)
    }
}

/// The policy's view of one sequence.
#[derive(Clone, Copy, Debug, Default)]
pub struct SeqPolicy {
    acceptance: Acceptance,
    /// Draft tokens to propose for the next step.
    pub planned: usize,
    /// No drafting (nor drafter work) before this step.
    paused_until: u64,
    /// Length of the last pause (0 while drafting pays).
    backoff: u64,
    /// Whether the pause ends with a probe (one draft token).
    probe_due: bool,
    /// Whether the policy has judged the sequence at all yet.
    seen: bool,
}

impl SeqPolicy {
    /// Whether the drafter should follow the sequence (keep its own context current): when
    /// it drafts next, or may draft soon (a prompt still being fed, not paused).
    pub fn follows(&self, decoding: bool, step: u64) -> bool {
        self.planned > 0 || (!decoding && step >= self.paused_until)
    }

    fn pause(&mut self, step: u64) {
        self.backoff = match self.backoff {
            0 => FIRST_BACKOFF,
            b => (2 * b).min(MAX_BACKOFF),
        };
        self.paused_until = step + 1 + self.backoff;
        self.probe_due = true;
    }
}

pub struct Policy {
    k_max: usize,
    adaptive: bool,
    /// Plain decode step time by number of sequences.
    plain: Vec<Ewma>,
    /// Extra target time per verified draft token, by number of sequences.
    extra: Vec<Ewma>,
    /// Drafter time per draft token.
    draft: Ewma,
    /// Acceptance over all sequences: the guess for a sequence not yet observed.
    prior: Acceptance,
    pub step: u64,
}

/// The value at `b`, else at the nearest `b` that has one.
fn nearest(v: &[Ewma], b: usize) -> Option<f64> {
    (0..v.len()).find_map(|d| {
        let below = b.checked_sub(d).and_then(|i| v.get(i)).and_then(Ewma::get);
        below.or_else(|| v.get(b + d).and_then(Ewma::get))
    })
}

impl Policy {
    pub fn new(k_max: usize, adaptive: bool, max_seqs: usize) -> Self {
        Self {
            k_max,
            adaptive,
            plain: vec![Ewma::default(); max_seqs + 1],
            extra: vec![Ewma::default(); max_seqs + 1],
            draft: Ewma::default(),
            prior: Acceptance::default(),
            step: 0,
        }
    }

    /// Records the step's costs and every verified draft's outcome.
    pub fn observe(
        &mut self,
        t: &StepTiming,
        records: &[StepRecord],
        seqs: &mut HashMap<RequestId, Sequence>,
    ) {
        self.step += 1;
        let b = records.len().min(self.plain.len() - 1);
        let drafted: usize = records.iter().map(|r| r.drafted).sum();
        if t.pure_decode && drafted == 0 {
            self.plain[b].update(t.target_s);
        }
        if drafted > 0 {
            if let (true, Some(p)) = (t.pure_decode, self.plain[b].get()) {
                self.extra[b].update((t.target_s - p).max(0.0) / drafted as f64);
            }
            self.draft.update(t.draft_s / drafted as f64);
        }
        for r in records.iter().filter(|r| r.drafted > 0) {
            self.prior.update(r.drafted, r.accepted);
            if let Some(s) = seqs.get_mut(&r.id) {
                s.spec.policy.acceptance.update(r.drafted, r.accepted);
            }
        }
    }

    /// The cost of one draft token in a step of `b` sequences, and the plain step time;
    /// `None` until a plain step of about that size has been timed.
    fn costs(&self, b: usize) -> Option<(f64, f64)> {
        let b = b.clamp(1, self.plain.len() - 1);
        let plain = nearest(&self.plain, b)?;
        // Until measured: verifying a token costs half a plain token, drafting a third.
        let per_token = plain / b as f64;
        let extra = nearest(&self.extra, b).unwrap_or(0.5 * per_token);
        let draft = self.draft.get().unwrap_or(0.3 * per_token);
        Some((extra + draft, plain))
    }

    /// Decides every participating sequence's drafts for the next step
    /// (`SeqPolicy::planned`), capped by what the sequence may still emit.
    pub fn plan(
        &mut self,
        records: &[StepRecord],
        seqs: &mut HashMap<RequestId, Sequence>,
        max_model_len: usize,
    ) {
        let step = self.step;
        let cap = |s: &Sequence| self.k_max.min(s.max_drafts(max_model_len));
        if !self.adaptive {
            for r in records {
                if let Some(s) = seqs.get_mut(&r.id) {
                    s.spec.policy.planned = if s.is_decoding() { cap(s) } else { 0 };
                }
            }
            return;
        }
        let decoding = records
            .iter()
            .filter(|r| seqs.get(&r.id).is_some_and(Sequence::is_decoding))
            .count();
        let costs = self.costs(decoding);
        // (id, acceptance, cap) of the sequences that may draft next step.
        let mut cands: smallvec::SmallVec<[(RequestId, f64, usize); 64]> =
            smallvec::SmallVec::new();
        for r in records {
            let Some(s) = seqs.get_mut(&r.id) else {
                continue;
            };
            let p = &mut s.spec.policy;
            p.planned = 0;
            if !p.seen {
                p.seen = true;
                // A newcomer starts as drafting did for the others: paused where it has
                // not been paying, so its prompt costs the drafter nothing.
                if self.prior.observed() && !self.pays(self.prior.rate(), costs) {
                    p.pause(step);
                }
            }
            if !s.is_decoding() || step < s.spec.policy.paused_until || costs.is_none() {
                continue;
            }
            let p = &s.spec.policy;
            let rate = if p.acceptance.observed() {
                p.acceptance.rate()
            } else {
                self.prior.rate()
            };
            cands.push((r.id, rate, cap(s)));
        }
        let Some((per_draft, plain)) = costs else {
            return;
        };
        let mut planned: smallvec::SmallVec<[usize; 64]> = smallvec::smallvec![0; cands.len()];
        // Hand out drafts one at a time to the best next gain while it beats the step's rate.
        let (mut time, mut tokens) = (plain, decoding.max(1) as f64);
        loop {
            let best = cands
                .iter()
                .enumerate()
                .filter(|(i, c)| planned[*i] < c.2)
                .map(|(i, c)| (i, c.1.powi(planned[i] as i32 + 1)))
                .max_by(|a, b| a.1.total_cmp(&b.1));
            match best {
                Some((i, gain)) if gain * time > per_draft * tokens => {
                    planned[i] += 1;
                    time += per_draft;
                    tokens += gain;
                }
                _ => break,
            }
        }
        for (&(id, _, cap), &k) in cands.iter().zip(&planned) {
            let p = &mut seqs.get_mut(&id).expect("candidate").spec.policy;
            if k > 0 {
                p.planned = k;
                p.backoff = 0;
                p.paused_until = 0;
                p.probe_due = false;
            } else if p.probe_due {
                // The pause ran out: one draft token tells whether the text got easier.
                p.planned = cap.min(1);
                p.probe_due = false;
            } else {
                p.pause(step);
            }
        }
    }

    /// Whether one draft token at acceptance `rate` pays in a single-sequence step.
    fn pays(&self, rate: f64, costs: Option<(f64, f64)>) -> bool {
        costs.is_none_or(|(per_draft, plain)| rate * plain > per_draft)
    }
}
