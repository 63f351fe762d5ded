//! The DSpark drafter (spec §7.2): after every step it keeps, per sequence, the target's
//! context streams of the last `sliding_window` committed positions (what the step's rows
//! computed, [`ModelRunner::aux`]), and for each sequence that drafts next step runs one
//! draft block after its newest token: all its drafts in one pass, no cache of its own.

use super::StepRecord;
use crate::request::RequestId;
use crate::runner::{ModelRunner, RunnerError};
use crate::sequence::Sequence;
use deepinfer_model::v4::dspark::Draft;
use deepinfer_model::v4::workspace::Workspace;
use std::collections::HashMap;

/// A sequence's context rows: positions `first..first + rows.len() / width`.
#[derive(Debug, Default)]
pub struct DsparkContext {
    first: usize,
    rows: Vec<f32>,
}

#[derive(Default)]
pub struct DsparkProposer {
    ws: Workspace,
    draft: Draft,
}

impl DsparkProposer {
    pub fn propose(
        &mut self,
        records: &[StepRecord],
        seqs: &mut HashMap<RequestId, Sequence>,
        runner: &mut ModelRunner,
    ) -> Result<(), RunnerError> {
        let model = runner.model();
        let ds = model
            .dspark
            .as_ref()
            .expect("the engine checks the checkpoint has a DSpark drafter");
        let width = ds.config.aux_layers.len() * model.config.hidden_size;
        let window = model.config.sliding_window;
        let aux = runner.aux();
        for r in records {
            let Some(s) = seqs.get_mut(&r.id) else {
                continue;
            };
            s.spec.draft_ids.clear();
            let ctx = &mut s.spec.dspark;
            if ctx.first + ctx.rows.len() / width != r.start {
                // A gap (a paused or restarted sequence): the context starts over here.
                ctx.first = r.start;
                ctx.rows.clear();
            }
            // The window and a whole verified block: a steady step never grows the rows.
            let most =
                (window + ds.config.block_size + 1).max(ctx.rows.len() / width + r.committed);
            ctx.rows.reserve(most * width - ctx.rows.len());
            ctx.rows
                .extend_from_slice(&aux[r.row * width..(r.row + r.committed) * width]);
            let held = ctx.rows.len() / width;
            if held > window {
                ctx.rows.drain(..(held - window) * width);
                ctx.first += held - window;
            }
            let planned = s.spec.policy.planned;
            let p0 = r.start + r.committed;
            if planned == 0 || r.committed == 0 || p0 >= s.num_tokens() {
                continue;
            }
            let anchor = s.token(p0);
            let ctx = &s.spec.dspark;
            ds.draft_into(
                model,
                &ctx.rows,
                ctx.first,
                p0,
                anchor,
                &mut self.draft,
                &mut self.ws,
            )
            .map_err(|e| RunnerError::Model(e.into()))?;
            let n = planned.min(self.draft.tokens.len());
            s.spec.draft_ids.extend_from_slice(&self.draft.tokens[..n]);
        }
        Ok(())
    }
}
