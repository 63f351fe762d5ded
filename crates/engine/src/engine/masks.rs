//! A step's structured-output masks, computed while its forward pass runs: the constrained
//! sequences lend their grammars to a thread of their own for the length of the pass (the
//! next token of each depends only on tokens already kept), and get them back with one mask
//! per row they may sample.

use super::EngineCore;
use crate::constraint::{masks_for_step, MaskJob};
use crate::engine::EngineError;

impl EngineCore {
    /// Runs the forward pass, with the masks of the constrained sequences computed beside it.
    pub(super) fn forward_with_masks(&mut self) -> Result<(), EngineError> {
        self.masks.clear();
        let jobs = self.mask_jobs();
        if jobs.is_empty() {
            return self.forward();
        }
        let vocab = self.vocab();
        let (forward, (results, seconds)) = std::thread::scope(|scope| {
            let masks = scope.spawn(move || masks_for_step(jobs, vocab));
            let forward = self.forward();
            (
                forward,
                masks.join().expect("the mask thread does not panic"),
            )
        });
        self.metrics.structured_output_mask_time.observe(seconds);
        for r in results {
            self.metrics
                .structured_output_masks
                .inc_by(r.masks.len() as u64);
            if let Some(seq) = self.seqs.get_mut(&r.id) {
                seq.constraint = Some(r.constraint);
            }
            self.masks.insert(r.id, r.masks);
        }
        forward
    }

    /// The grammars of the scheduled sequences that sample this step, taken for the pass.
    fn mask_jobs(&mut self) -> Vec<MaskJob> {
        let mut jobs = Vec::new();
        for s in &self.plan.scheduled {
            if s.num_logits == 0 {
                continue;
            }
            let seq = self.seqs.get_mut(&s.id).expect("scheduled");
            if let Some(constraint) = seq.constraint.take() {
                jobs.push(MaskJob {
                    id: s.id,
                    constraint,
                    drafts: seq.spec.draft_ids[..s.num_draft].to_vec(),
                    rows: s.num_logits,
                });
            }
        }
        jobs
    }
}
