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

    /// Brings the value down to `bound` if it is above (a known upper bound).
    fn cap(&mut self, bound: f64) {
        if self.n > 0 && self.value > bound {
            self.value = bound;
        }
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
            // A step that also verified drafts did more than a plain one: a plain step timed
            // slower (a disturbed one, and once drafting pays no plain step comes to correct
            // it) made every draft look free.
            if t.pure_decode {
                self.plain[b].cap(t.target_s);
            }
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
        let (extra, plain) = self.verify_costs(b)?;
        // Until measured: drafting a token costs a third of a plain token.
        let draft = self
            .draft
            .get()
            .unwrap_or(0.3 * (plain / self.clamp(b) as f64));
        Some((extra + draft, plain))
    }

    /// The extra target time of one verified draft token in a step of `b` sequences, and
    /// the plain step time; `None` until a plain step of about that size has been timed.
    pub fn verify_costs(&self, b: usize) -> Option<(f64, f64)> {
        let b = self.clamp(b);
        let plain = nearest(&self.plain, b)?;
        // Until measured: verifying a token costs half a plain token.
        let extra = nearest(&self.extra, b).unwrap_or(0.5 * (plain / b as f64));
        Some((extra, plain))
    }

    /// `b` within the step sizes timed.
    fn clamp(&self, b: usize) -> usize {
        b.clamp(1, self.plain.len() - 1)
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
        // (id, acceptance, cap, explore) of the sequences that may draft next step.
        let mut cands: smallvec::SmallVec<[(RequestId, f64, usize, bool); 64]> =
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
            // Nothing known about acceptance yet: probe rather than guess.
            let explore = !p.acceptance.observed() && !self.prior.observed();
            cands.push((r.id, rate, cap(s), explore));
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
        for (&(id, _, cap, explore), &k) in cands.iter().zip(&planned) {
            let p = &mut seqs.get_mut(&id).expect("candidate").spec.policy;
            if explore {
                p.planned = k.max(cap.min(1));
            } else if k > 0 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{Request, RequestOutput};
    use crate::sampling_params::SamplingParams;

    const K: usize = 4;

    fn seqs(n: u64) -> HashMap<RequestId, Sequence> {
        (0..n)
            .map(|id| {
                let (tx, _rx) = std::sync::mpsc::channel::<RequestOutput>();
                let req = Request {
                    id,
                    prompt_ids: vec![3; 8],
                    params: SamplingParams {
                        max_tokens: 1000,
                        ..SamplingParams::default()
                    },
                    arrival: std::time::Instant::now(),
                    images: Vec::new(),
                };
                let mut s = Sequence::new(req, Box::new(tx));
                s.output_ids.push(5); // decoding: one sampled token to feed
                s.num_computed = 8;
                (id, s)
            })
            .collect()
    }

    /// A decode step where every sequence verified `drafted` drafts and accepted `accepted`.
    fn records(n: u64, drafted: usize, accepted: usize) -> Vec<StepRecord> {
        (0..n)
            .map(|id| StepRecord {
                id,
                row: 0,
                start: 8,
                committed: 1 + accepted,
                drafted,
                accepted,
            })
            .collect()
    }

    fn decode_step(target_s: f64, draft_s: f64) -> StepTiming {
        StepTiming {
            target_s,
            draft_s,
            pure_decode: true,
        }
    }

    fn planned(seqs: &HashMap<RequestId, Sequence>) -> Vec<usize> {
        let mut v: Vec<_> = seqs
            .iter()
            .map(|(&id, s)| (id, s.spec.policy.planned))
            .collect();
        v.sort();
        v.into_iter().map(|(_, k)| k).collect()
    }

    /// One engine step as the policy sees it: observe, then plan.
    fn step(p: &mut Policy, s: &mut HashMap<RequestId, Sequence>, t: StepTiming, r: &[StepRecord]) {
        p.observe(&t, r, s);
        p.plan(r, s, 4096);
    }

    #[test]
    fn nothing_is_drafted_before_a_plain_step_was_timed() {
        let mut p = Policy::new(K, true, 8);
        let mut s = seqs(1);
        let t = StepTiming::default(); // a prefill: not a decode measurement
        step(&mut p, &mut s, t, &records(1, 0, 0));
        assert_eq!(planned(&s), [0]);
        step(&mut p, &mut s, decode_step(0.010, 0.0), &records(1, 0, 0));
        assert!(
            planned(&s)[0] > 0,
            "a timed plain step and no evidence: try drafting"
        );
    }

    #[test]
    fn a_disturbed_plain_step_does_not_make_drafts_look_free() {
        let mut p = Policy::new(K, true, 8);
        let mut s = seqs(1);
        // The only plain step timed was disturbed: 10× its real 10 ms.
        step(&mut p, &mut s, decode_step(0.100, 0.0), &records(1, 0, 0));
        let mut drafted = 0;
        let mut last = planned(&s)[0];
        for _ in 0..200 {
            // Drafts never accepted; a verify round costs as much as a plain step.
            let t = if last > 0 {
                decode_step(0.020, 0.005)
            } else {
                decode_step(0.010, 0.0)
            };
            step(&mut p, &mut s, t, &records(1, last, 0));
            last = planned(&s)[0];
            drafted += usize::from(last > 0);
        }
        assert!(drafted <= 12, "{drafted} of 200 steps drafted");
    }

    #[test]
    fn cheap_well_accepted_drafts_get_the_full_length() {
        let mut p = Policy::new(K, true, 8);
        let mut s = seqs(1);
        step(&mut p, &mut s, decode_step(0.010, 0.0), &records(1, 0, 0));
        // Verifying 4 drafts costs 2 ms more, drafting them 1 ms: all accepted.
        for _ in 0..10 {
            step(&mut p, &mut s, decode_step(0.012, 0.001), &records(1, K, K));
        }
        assert_eq!(planned(&s), [K]);
    }

    #[test]
    fn drafts_that_are_never_accepted_stop_and_are_probed_with_backoff() {
        let mut p = Policy::new(K, true, 8);
        let mut s = seqs(1);
        step(&mut p, &mut s, decode_step(0.010, 0.0), &records(1, 0, 0));
        let mut drafted_steps = Vec::new();
        let mut last = 0;
        for i in 0..600 {
            let r = records(1, last, 0);
            // Verify rounds cost as much as a step each, plain steps 10 ms.
            let t = if last > 0 {
                decode_step(0.020, 0.005)
            } else {
                decode_step(0.010, 0.0)
            };
            step(&mut p, &mut s, t, &r);
            last = planned(&s)[0];
            if last > 0 {
                drafted_steps.push(i);
            }
        }
        // A few rounds to learn, then single-token probes ever further apart.
        assert!(drafted_steps.len() <= 12, "{drafted_steps:?}");
        let gaps: Vec<_> = drafted_steps.windows(2).map(|w| w[1] - w[0]).collect();
        let tail = &gaps[gaps.len() - 3..];
        assert!(tail.windows(2).all(|w| w[1] >= w[0]), "{gaps:?}");
        assert!(*tail.last().unwrap() >= MAX_BACKOFF as usize, "{gaps:?}");
        // A newcomer does not even start drafting.
        let mut s2 = seqs(2);
        s2.remove(&0);
        let r = [StepRecord {
            id: 1,
            ..records(1, 0, 0)[0]
        }];
        step(&mut p, &mut s2, decode_step(0.010, 0.0), &r);
        assert_eq!(planned(&s2), [0]);
        assert!(
            !s2[&1].spec.policy.follows(false, p.step),
            "its prompt is not followed"
        );
    }

    #[test]
    fn drafts_go_to_the_sequence_that_gains_most() {
        let mut p = Policy::new(K, true, 8);
        let mut s = seqs(2);
        step(&mut p, &mut s, decode_step(0.010, 0.0), &records(2, 0, 0));
        for _ in 0..10 {
            // Sequence 0 accepts every draft, 1 none; verification is cheap.
            let mut r = records(2, 2, 2);
            r[1].accepted = 0;
            step(&mut p, &mut s, decode_step(0.011, 0.001), &r);
        }
        let k = planned(&s);
        assert!(k[0] > k[1], "{k:?}");
    }

    #[test]
    fn without_the_policy_every_decoding_sequence_drafts_its_cap() {
        let mut p = Policy::new(K, false, 8);
        let mut s = seqs(2);
        s.get_mut(&1).unwrap().request.params.max_tokens = 3; // 1 emitted: 1 draft left
        step(&mut p, &mut s, StepTiming::default(), &records(2, 0, 0));
        assert_eq!(planned(&s), [K, 1]);
    }
}
