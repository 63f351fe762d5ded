//! vLLM's adaptive verification (`enable_adaptive_verification`, DSpark only): the drafter's
//! confidence head scores each draft; a draft survives verification only if every draft
//! before it does, so its chance is the running product of the confidences before and at
//! it. Of all the step's drafts, the best-surviving ones are verified, as many as maximise
//! the step's expected tokens per second; the rest are dropped before the target sees them.

use crate::request::RequestId;
use crate::sequence::Sequence;
use std::collections::HashMap;
use std::ops::Range;

/// How many of the drafts to verify: `survival` holds their chances, best first; without
/// any the step yields `base` tokens in `time` seconds, and each verified draft adds
/// `per_draft` seconds and its chance in tokens.
pub fn verify_budget(survival: &[f64], base: f64, time: f64, per_draft: f64) -> usize {
    let (mut best, mut best_rate, mut tokens) = (0, base / time, base);
    for (i, s) in survival.iter().enumerate() {
        tokens += s;
        let rate = tokens / (time + per_draft * (i + 1) as f64);
        if rate > best_rate {
            (best, best_rate) = (i + 1, rate);
        }
    }
    best
}

/// Reused buffers of the trimming.
#[derive(Default)]
pub struct AdaptiveVerification {
    survival: Vec<f64>,
    ranked: Vec<f64>,
}

impl AdaptiveVerification {
    /// Trims each sequence's drafts to the budget: `drafted` names each drafting sequence
    /// and the range of `confidence` that scores its drafts (in order); the step yields
    /// `base` tokens in `time` seconds without drafts, each verified one costs `per_draft`.
    pub fn trim(
        &mut self,
        drafted: &[(RequestId, Range<usize>)],
        confidence: &[f32],
        seqs: &mut HashMap<RequestId, Sequence>,
        (base, time, per_draft): (f64, f64, f64),
    ) {
        self.survival.clear();
        for (_, range) in drafted {
            let mut chance = 1.0;
            for &c in &confidence[range.clone()] {
                chance *= f64::from(c);
                self.survival.push(chance);
            }
        }
        self.ranked.clear();
        self.ranked.extend_from_slice(&self.survival);
        self.ranked.sort_unstable_by(|a, b| b.total_cmp(a));
        let budget = verify_budget(&self.ranked, base, time, per_draft);
        let cutoff = budget
            .checked_sub(1)
            .map_or(f64::INFINITY, |i| self.ranked[i]);
        let mut at = 0;
        for (id, range) in drafted {
            let chances = &self.survival[at..at + range.len()];
            at += range.len();
            // Chances only fall along a sequence: the admitted ones are a prefix.
            let keep = chances.iter().take_while(|&&c| c >= cutoff).count();
            if let Some(s) = seqs.get_mut(id) {
                s.spec.draft_ids.truncate(keep);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_maximises_tokens_per_second() {
        // One sequence, a plain step of 10 ms, 2 ms per verified draft: 1.9 tokens in 12 ms,
        // 2.62 in 14 ms, then 2.98 in 16 ms (fewer per second).
        let survival = [0.9, 0.72, 0.36, 0.07];
        assert_eq!(verify_budget(&survival, 1.0, 10.0, 2.0), 2);
        // Dearer verification: only the likeliest pay.
        assert_eq!(verify_budget(&survival, 1.0, 10.0, 8.0), 1);
        assert_eq!(verify_budget(&survival, 1.0, 10.0, 20.0), 0);
        // Exhaustively: no other count gives more tokens per second.
        let rate = |k: usize| (1.0 + survival[..k].iter().sum::<f64>()) / (10.0 + 2.0 * k as f64);
        let best = verify_budget(&survival, 1.0, 10.0, 2.0);
        assert!((0..=4).all(|k| rate(k) <= rate(best)));
        assert_eq!(verify_budget(&[], 2.0, 10.0, 1.0), 0);
    }

    fn sequence(id: RequestId, drafts: &[u32]) -> Sequence {
        use crate::request::{Request, RequestOutput};
        let (tx, _rx) = std::sync::mpsc::channel::<RequestOutput>();
        let req = Request {
            id,
            prompt_ids: vec![3; 8],
            params: Default::default(),
            arrival: std::time::Instant::now(),
            images: Vec::new(),
        };
        let mut s = Sequence::new(req, Box::new(tx));
        s.spec.draft_ids = drafts.to_vec();
        s
    }

    #[test]
    fn the_best_surviving_drafts_are_kept_as_prefixes() {
        let mut seqs: HashMap<RequestId, Sequence> = [
            (1, sequence(1, &[10, 11, 12])),
            (2, sequence(2, &[20, 21, 22])),
        ]
        .into_iter()
        .collect();
        // Survival: sequence 1 0.9, 0.81, 0.081; sequence 2 0.5, 0.45, 0.405.
        let confidence = [0.9, 0.9, 0.1, 0.5, 0.9, 0.9];
        let drafted = [(1, 0..3), (2, 3..6)];
        // Two sequences, 10 ms plain, 1 ms a draft: the ranked chances 0.9, 0.81, 0.5,
        // 0.45, 0.405 each beat the running rate; 0.081 does not.
        let mut v = AdaptiveVerification::default();
        v.trim(&drafted, &confidence, &mut seqs, (2.0, 10.0, 1.0));
        assert_eq!(seqs[&1].spec.draft_ids, [10, 11]);
        assert_eq!(seqs[&2].spec.draft_ids, [20, 21, 22]);
        // Verification as dear as a plain step: none is worth it.
        v.trim(&drafted, &confidence, &mut seqs, (2.0, 10.0, 10.0));
        assert!(seqs.values().all(|s| s.spec.draft_ids.is_empty()));
    }
}
