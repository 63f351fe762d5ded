//! The model runner: turns "append these tokens to these sequences" into one flat
//! [`ForwardBatch`] and runs the model on the engine's cache.
//!
//! It owns the model and the batch buffers, and nothing about sequences: the caller says
//! where each sequence's tokens start (its `Sequence::num_computed`) and reserves the cache
//! room for them first (the scheduler does, through its allocator).

use crate::cache::{CacheError, CacheManager, SeqId};
use crate::dist::context::ContextParallel;
use crate::request::PromptImage;
use deepinfer_model::batch::{ForwardBatch, Logits};
use deepinfer_model::v4::dspark::{Draft, DraftContext};
use deepinfer_model::v4::model::ForwardExtras;
use deepinfer_model::v4::workspace::Workspace;
use deepinfer_model::v4::{Model, ModelError};
use std::ops::Range;

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// One sequence's part of a step: `tokens` appended at positions `start..`, logits for the
/// last `num_logits` of them; `history`: the sequence's tokens before `start` (the last few
/// suffice, see [`ModelRunner::add_lookback`]); `images`: its prompt's images (those
/// whose spans the tokens reach give their embeddings, see [`ModelRunner::add_images`]).
pub struct SeqWork<'a> {
    pub seq: SeqId,
    pub start: usize,
    pub tokens: &'a [u32],
    pub num_logits: usize,
    pub history: &'a [u32],
    pub images: &'a [PromptImage],
}

/// One sequence's part of a step being built: [`SeqWork`] with the tokens and the history as
/// iterators (a sequence's known tokens then its drafts, read in place).
pub struct StepSeq<'a, T, H> {
    pub seq: SeqId,
    pub start: usize,
    pub tokens: T,
    pub num_logits: usize,
    pub history: H,
    pub images: &'a [PromptImage],
}

pub struct ModelRunner {
    model: Model,
    /// Reused every step, so a decode step's batch and logits allocate nothing.
    batch: ForwardBatch,
    logits: Logits,
    /// The final residual streams of the last step's rows (`[N, hc, D]`) when it kept them.
    hidden: Vec<f32>,
    ids: Vec<SeqId>,
    /// The DSpark drafter's buffers, kept between drafts.
    draft_ws: Workspace,
    /// Splits long prefill steps over the ranks by position, when the model is set to.
    context: Option<ContextParallel>,
}

impl ModelRunner {
    pub fn new(model: Model) -> Self {
        let logits = Logits {
            vocab: model.config.vocab_size,
            data: Vec::new(),
        };
        Self {
            model,
            batch: ForwardBatch::default(),
            logits,
            hidden: Vec::new(),
            ids: Vec::new(),
            draft_ws: Workspace::default(),
            context: None,
        }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }

    pub fn into_model(self) -> Model {
        self.model
    }

    /// Starts a new batch.
    pub fn clear(&mut self) {
        self.batch.clear();
        self.ids.clear();
    }

    /// Appends `tokens` of `seq` at positions `start..` to the batch; logits are wanted for
    /// the last `num_logits` of them.
    pub fn add(
        &mut self,
        seq: SeqId,
        start: usize,
        tokens: impl IntoIterator<Item = u32>,
        num_logits: usize,
    ) {
        self.batch.push_span(start, tokens, num_logits);
        self.ids.push(seq);
    }

    /// Gives the sequence just added the tokens before its `start` (oldest first; the last
    /// [`LOOKBACK`](deepinfer_model::batch::LOOKBACK) suffice): V4.1's Engram hashes n-grams
    /// across the step's boundary.
    pub fn add_lookback(&mut self, history: impl IntoIterator<Item = u32>) {
        self.batch.push_lookback(history);
    }

    /// Gives the sequence just added the embeddings of `images` at the positions its tokens
    /// (from `start`) reach: a chunk that cuts an image's span takes its part of it.
    pub fn add_images(&mut self, start: usize, images: &[PromptImage]) {
        let len = self.batch.spans.last().map_or(0, |s| s.len);
        let d = self.model.config.hidden_size;
        for im in images {
            let (lo, hi) = (im.offset.max(start), (im.offset + im.len).min(start + len));
            if lo < hi {
                let embeds = im
                    .embeds()
                    .expect("a request is scheduled only once its images are encoded");
                let values = &embeds[(lo - im.offset) * d..(hi - im.offset) * d];
                self.batch.push_embeds(lo - start, values, d);
                self.batch
                    .push_image_span(im.offset, im.offset + im.len - 1);
            }
        }
    }

    /// Runs the batch built since [`Self::clear`] and returns the logits asked for, in
    /// batch order (valid until the next step). `keep_hidden`: also keep every row's final
    /// streams (see [`Self::hidden`]). On error no cache row is trusted to have been written.
    pub fn run(
        &mut self,
        cache: &mut CacheManager,
        keep_hidden: bool,
    ) -> Result<&Logits, RunnerError> {
        if let (Some(split), None) = (self.model.context_parallel(), &self.context) {
            self.context = Some(ContextParallel::new(split.clone(), cache.layout().clone()));
        }
        let mut view = cache.view(&self.ids)?;
        if let (Some(cp), false) = (self.context.as_mut(), keep_hidden) {
            let (batch, logits) = (&self.batch, &mut self.logits);
            if let Some(done) = cp.try_forward(&mut self.model, batch, &mut view, logits) {
                done?;
                return Ok(&self.logits);
            }
        }
        let extras = ForwardExtras {
            hidden: keep_hidden.then_some(&mut self.hidden),
            ..ForwardExtras::default()
        };
        self.model
            .forward_into(&self.batch, &mut view, &mut self.logits, extras)?;
        Ok(&self.logits)
    }

    /// Builds one step's flat batch from its sequences ([`Self::clear`], then
    /// [`Self::add`] and [`Self::add_lookback`] for each) and runs it ([`Self::run`]).
    pub fn run_step<'a, T, H>(
        &mut self,
        cache: &mut CacheManager,
        seqs: impl IntoIterator<Item = StepSeq<'a, T, H>>,
        keep_hidden: bool,
    ) -> Result<&Logits, RunnerError>
    where
        T: IntoIterator<Item = u32>,
        H: IntoIterator<Item = u32>,
    {
        self.clear();
        for w in seqs {
            self.add(w.seq, w.start, w.tokens, w.num_logits);
            self.add_lookback(w.history);
            self.add_images(w.start, w.images);
        }
        self.run(cache, keep_hidden)
    }

    /// [`Self::run_step`] from a list of work items (tests, benchmarks).
    pub fn step(
        &mut self,
        cache: &mut CacheManager,
        work: &[SeqWork<'_>],
    ) -> Result<&Logits, RunnerError> {
        let seqs = work.iter().map(|w| StepSeq {
            seq: w.seq,
            start: w.start,
            tokens: w.tokens.iter().copied(),
            num_logits: w.num_logits,
            history: w.history.iter().copied(),
            images: w.images,
        });
        self.run_step(cache, seqs, false)
    }

    /// One pass of the MTP block over `batch` (the sequences `seqs`, in span order) from the
    /// final streams `hidden` of the rows before them: the draft logits, and the block's own
    /// streams (`hidden_out`) for a chained pass.
    pub fn run_mtp(
        &mut self,
        cache: &mut CacheManager,
        seqs: &[SeqId],
        batch: &ForwardBatch,
        hidden: &[f32],
        logits: &mut Logits,
        hidden_out: &mut Vec<f32>,
    ) -> Result<(), RunnerError> {
        let mut view = cache.view(seqs)?;
        self.model
            .forward_mtp(batch, hidden, &mut view, logits, hidden_out)?;
        Ok(())
    }

    /// DSpark's block for `seq` after its committed `positions` (the drafter reads their
    /// context keys in the cache), `anchor` being the token at their end.
    pub fn draft(
        &mut self,
        cache: &mut CacheManager,
        seq: SeqId,
        positions: Range<usize>,
        anchor: u32,
        out: &mut Draft,
    ) -> Result<(), RunnerError> {
        let view = cache.view(std::slice::from_ref(&seq))?;
        let context = DraftContext {
            cache: &view,
            seq: 0,
            positions,
        };
        self.model
            .draft_into(&context, anchor, out, &mut self.draft_ws)?;
        Ok(())
    }

    /// The logits of the last [`Self::run`].
    pub fn logits(&self) -> &Logits {
        &self.logits
    }

    /// The final residual streams `[N, hc, D]` of the last [`Self::run`] that kept them.
    pub fn hidden(&self) -> &[f32] {
        &self.hidden
    }

    /// Batch row of span `i`'s first token in the last batch.
    pub fn span_start(&self, i: usize) -> usize {
        self.batch.spans[i].start
    }
}
