//! The DSpark drafter (docs/MODEL.md §7.2): every target pass leaves its rows' context keys in the
//! drafter's rings (the cache's draft layers, filled by the model), and after every step
//! each sequence that drafts next runs one draft block after its newest token: all its
//! drafts in one pass over its window of context.

use super::StepRecord;
use crate::cache::CacheManager;
use crate::request::RequestId;
use crate::runner::{ModelRunner, RunnerError};
use crate::sequence::Sequence;
use deepinfer_model::v4::dspark::Draft;
use std::collections::HashMap;
use std::ops::Range;
use std::time::Instant;

/// How far the target has filled a sequence's rings: positions `floor..len` hold context.
/// A step that does not start at `len` (a cached prefix, a restart) leaves nothing older in
/// them, so the context restarts at its first position.
#[derive(Clone, Copy, Debug, Default)]
pub struct DsparkProgress {
    len: usize,
    floor: usize,
}

#[derive(Default)]
pub struct DsparkProposer {
    draft: Draft,
    /// The last step's drafting sequences, each with the range of `confidence` that
    /// scores its drafts.
    pub drafted: Vec<(RequestId, Range<usize>)>,
    pub confidence: Vec<f32>,
    /// Seconds the last step's drafting took.
    pub seconds: f64,
}

impl DsparkProposer {
    pub fn propose(
        &mut self,
        records: &[StepRecord],
        seqs: &mut HashMap<RequestId, Sequence>,
        runner: &mut ModelRunner,
        cache: &mut CacheManager,
    ) -> Result<(), RunnerError> {
        let window = runner.model().config.sliding_window;
        let clock = Instant::now();
        self.drafted.clear();
        self.confidence.clear();
        for r in records {
            let Some(s) = seqs.get_mut(&r.id) else {
                continue;
            };
            s.spec.draft_ids.clear();
            let progress = &mut s.spec.dspark;
            if progress.len != r.start {
                progress.floor = r.start;
            }
            progress.len = r.start + r.committed;
            let (floor, p0) = (progress.floor, progress.len);
            let planned = s.spec.policy.planned;
            let Some(cache_id) = s.cache else {
                continue;
            };
            if planned == 0 || r.committed == 0 || p0 >= s.num_tokens() {
                continue;
            }
            let anchor = s.token(p0);
            let positions = p0.saturating_sub(window).max(floor)..p0;
            runner.draft(cache, cache_id, positions, anchor, &mut self.draft)?;
            let n = planned.min(self.draft.tokens.len());
            s.spec.draft_ids.extend_from_slice(&self.draft.tokens[..n]);
            let at = self.confidence.len();
            self.confidence
                .extend_from_slice(&self.draft.confidence[..n]);
            self.drafted.push((r.id, at..at + n));
        }
        self.seconds = clock.elapsed().as_secs_f64();
        Ok(())
    }
}
