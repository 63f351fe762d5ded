//! A drafter for measurement only: it proposes what a plain greedy run of the same prompt
//! produced, each token replaced by a wrong one with probability `1 − acceptance_rate`. With
//! greedy decoding a draft is then accepted exactly when it was not replaced, so the
//! speed-up of speculative decoding can be measured at a chosen acceptance rate, with a
//! drafter that costs nothing.

use super::StepRecord;
use crate::request::RequestId;
use crate::sequence::Sequence;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha12Rng;
use std::collections::HashMap;

pub struct ReplayProposer {
    acceptance_rate: f64,
    rng: ChaCha12Rng,
    /// Prompt → the tokens a plain run generated after it.
    script: HashMap<Vec<u32>, Vec<u32>>,
}

impl ReplayProposer {
    pub fn new(acceptance_rate: f64, seed: u64, script: &[(Vec<u32>, Vec<u32>)]) -> Self {
        Self {
            acceptance_rate,
            rng: ChaCha12Rng::seed_from_u64(seed),
            script: script.iter().cloned().collect(),
        }
    }

    pub fn propose(
        &mut self,
        records: &[StepRecord],
        seqs: &mut HashMap<RequestId, Sequence>,
        vocab: usize,
    ) {
        for r in records {
            let Some(s) = seqs.get_mut(&r.id) else {
                continue;
            };
            s.spec.draft_ids.clear();
            let planned = s.spec.policy.planned;
            let Some(out) = self.script.get(&s.request.prompt_ids) else {
                continue;
            };
            // The plain run's tokens after the sequence's last one.
            let from = s.output_ids.len().min(out.len());
            for &t in out[from..].iter().take(planned) {
                let keep = self.rng.random::<f64>() < self.acceptance_rate;
                let wrong = (t as usize + 1 + self.rng.random_range(0..vocab.max(2) - 1)) % vocab;
                s.spec.draft_ids.push(if keep { t } else { wrong as u32 });
            }
        }
    }
}
