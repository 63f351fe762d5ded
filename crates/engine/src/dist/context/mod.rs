//! Context parallelism (`--context-parallel-size N`): a prefill step that is one sequence's
//! chunk of at least `min_tokens` tokens is split into N contiguous ranges, rank r computing
//! range r through every layer. The ranks here are those of the context communicator: each
//! holds a whole copy of the model, or is the first rank of a group that splits its copy
//! (`deepinfer_model::parallel::Grid`), its forward driving its group as rank 0 drives a
//! split model.
//!
//! What a range reads of the positions before it — the window rows just before it, the
//! compressors' rows of the open groups, every compressed entry and indexer key — comes from
//! the rank before it, layer by layer, as soon as that rank has written the layer: rank r
//! runs layer l while rank r + 1 runs layer l − 1, a pipeline over the layers. The last rank
//! then hands rank 0 the state of every range after the first and the logits asked for;
//! decode continues on rank 0 alone. V4's compressed state is small (one entry per 4 or 128
//! tokens), which is what keeps the hand-over cheap next to the layer's compute.
//!
//! Every row is computed as a chunked prefill computes it (the products are batch
//! invariant), so a split step equals one process's chunks at the same boundaries, bit for
//! bit.

mod state;
mod worker;

pub use worker::ContextWorker;

use crate::cache::layout::CacheLayout;
use deepinfer_model::batch::{ForwardBatch, Logits, LOOKBACK};
use deepinfer_model::cache::CacheView;
use deepinfer_model::parallel::{send_header, share, Collectives, Op};
use deepinfer_model::v4::model::{ContextSplit, ForwardExtras, LayerHook};
use deepinfer_model::v4::{Model, ModelError};
use state::{Part, StateMessage};
use std::ops::Range;

/// A split step as every rank reads it: the sequence's chunk and what rank 0 wants back.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    /// Position of the chunk's first token.
    start: usize,
    tokens: Vec<u32>,
    /// Tokens before the chunk, oldest first (V4.1's Engram hashes across the boundary).
    lookback: Vec<u32>,
    /// Logits of the chunk's last `logits` positions.
    logits: usize,
    /// Rank 0 keeps a drafter's context rings (DSpark): every rank sends it the ring rows of
    /// its range that the next draft reads.
    rings: bool,
}

impl Plan {
    /// Rank 0: sends the plan after the step's header.
    fn send(&self, comm: &dyn Collectives) {
        send_header(comm, Op::Context, 0, self.tokens.len());
        let mut meta = [
            self.start as u64,
            self.logits as u64,
            self.lookback.len() as u64,
            u64::from(self.rings),
        ];
        comm.broadcast_u64(&mut meta);
        let mut words: Vec<u64> = self
            .tokens
            .iter()
            .chain(&self.lookback)
            .map(|&t| t as u64)
            .collect();
        comm.broadcast_u64(&mut words);
    }

    /// A rank other than 0: the plan of a step of `tokens` tokens.
    pub(crate) fn receive(comm: &dyn Collectives, tokens: usize) -> Self {
        let mut meta = [0u64; 4];
        comm.broadcast_u64(&mut meta);
        let mut words = vec![0u64; tokens + meta[2] as usize];
        comm.broadcast_u64(&mut words);
        let ids: Vec<u32> = words.iter().map(|&w| w as u32).collect();
        Plan {
            start: meta[0] as usize,
            tokens: ids[..tokens].to_vec(),
            lookback: ids[tokens..].to_vec(),
            logits: meta[1] as usize,
            rings: meta[3] == 1,
        }
    }

    /// What the last rank hands rank 0 after the step (in a cache of `layout`, a model of
    /// `main` layers): every main layer's state of the ranges after the first.
    pub(crate) fn handed_back<'a>(
        &self,
        layout: &'a CacheLayout,
        ranks: usize,
        main: usize,
    ) -> impl Iterator<Item = StateMessage> + 'a {
        let back = self.range(1, ranks).start..self.start + self.tokens.len();
        (0..main).map(move |l| StateMessage::new(layout, l, Part::Range(back.clone()), 0))
    }

    /// What rank `r` hands rank 0 of its range when rank 0 keeps a drafter's rings: the
    /// rows of each drafter layer (after the `main` ones) within `window` of the chunk's end,
    /// which the next draft reads.
    pub(crate) fn ring_rows<'a>(
        &self,
        layout: &'a CacheLayout,
        (r, ranks): (usize, usize),
        (main, window): (usize, usize),
    ) -> impl Iterator<Item = StateMessage> + 'a {
        let range = self.range(r, ranks);
        let end = self.start + self.tokens.len();
        let rows = range.start.max(end.saturating_sub(window)).min(range.end)..range.end;
        let layers = if self.rings {
            main..layout.layers.len()
        } else {
            0..0
        };
        layers.map(move |l| StateMessage::window_rows(layout, l, rows.clone()))
    }

    /// Positions of rank `r`'s range.
    pub(crate) fn range(&self, r: usize, ranks: usize) -> Range<usize> {
        let s = share(self.tokens.len(), r, ranks);
        self.start + s.start..self.start + s.end
    }

    /// The batch of `range`: its tokens, the tokens before it, logits of the last `logits`.
    pub(crate) fn batch(&self, range: Range<usize>, logits: usize, out: &mut ForwardBatch) {
        out.clear();
        let local = range.start - self.start..range.end - self.start;
        out.push_span(
            range.start,
            self.tokens[local.clone()].iter().copied(),
            logits,
        );
        let before = self.lookback.iter().chain(&self.tokens[..local.start]);
        let skip = (self.lookback.len() + local.start).saturating_sub(LOOKBACK);
        out.push_lookback(before.skip(skip).copied());
    }
}

/// Rank 0's side: decides which steps split, runs the first range and takes the others'
/// results back.
pub struct ContextParallel {
    split: ContextSplit,
    layout: CacheLayout,
    batch: ForwardBatch,
}

impl ContextParallel {
    /// For a model [`Model::set_context_parallel`] set up, on a cache of `layout`.
    pub fn new(split: ContextSplit, layout: CacheLayout) -> Self {
        Self {
            split,
            layout,
            batch: ForwardBatch::default(),
        }
    }

    /// The step's plan when it splits: one sequence's chunk of at least `min_tokens` (and
    /// one per rank), no given embeddings, logits wanted only for the last range's last
    /// positions.
    fn plan(&self, model: &Model, batch: &ForwardBatch) -> Option<Plan> {
        let (ranks, n) = (self.split.comm.size(), batch.num_tokens());
        let last = share(n, ranks - 1, ranks);
        let logits = batch.logits_rows.len();
        let tail = batch.logits_rows.iter().copied().eq(n - logits..n);
        let plain = batch.embed_rows.is_empty()
            && batch.image_spans.is_empty()
            && batch.window_floor.iter().all(|&f| f == 0);
        (batch.spans.len() == 1 && n >= self.split.min_tokens.max(ranks) && plain && tail)
            .then_some(())
            .filter(|_| logits <= last.len())?;
        Some(Plan {
            start: batch.positions[0],
            tokens: batch.token_ids.clone(),
            lookback: batch.lookback(0).to_vec(),
            logits,
            rings: model.dspark.is_some() && self.layout.layers.len() > main_layers(model),
        })
    }

    /// Runs `batch` split over the ranks when it qualifies (`None`: run it as usual).
    pub fn try_forward(
        &mut self,
        model: &mut Model,
        batch: &ForwardBatch,
        cache: &mut dyn CacheView,
        logits: &mut Logits,
    ) -> Option<Result<(), ModelError>> {
        let plan = self.plan(model, batch)?;
        Some(self.forward(model, &plan, cache, logits))
    }

    fn forward(
        &mut self,
        model: &mut Model,
        plan: &Plan,
        cache: &mut dyn CacheView,
        logits: &mut Logits,
    ) -> Result<(), ModelError> {
        let comm = &*self.split.comm;
        let ranks = comm.size();
        plan.send(comm);
        let mine = plan.range(0, ranks);
        plan.batch(mine.clone(), 0, &mut self.batch);
        let mut hook = Handover {
            comm,
            layout: &self.layout,
            window: model.config.sliding_window,
            rank: 0,
            from: None,
            to: Some(mine.end),
        };
        let extras = ForwardExtras {
            layers: Some(&mut hook),
            ..ForwardExtras::default()
        };
        let mut none = Logits {
            vocab: logits.vocab,
            data: Vec::new(),
        };
        if let Err(e) = model.forward_into(&self.batch, cache, &mut none, extras) {
            // The other ranks wait for this rank's layers: nothing can end the step cleanly.
            comm.abort(&format!("context-parallel step: {e}"));
        }
        let main = main_layers(model);
        for msg in plan.handed_back(&self.layout, ranks, main) {
            msg.receive(comm, ranks - 1, cache);
        }
        logits.data.resize(plan.logits * logits.vocab, 0.0);
        comm.recv_f32(ranks - 1, &mut logits.data);
        let window = model.config.sliding_window;
        for r in 1..ranks {
            for msg in plan.ring_rows(&self.layout, (r, ranks), (main, window)) {
                msg.receive(comm, r, cache);
            }
        }
        Ok(())
    }
}

pub(crate) fn main_layers(model: &Model) -> usize {
    model.config.layer_types.len()
}

/// Around each layer of one rank's range: the state of the positions before the range in
/// from the rank before (`from`: the range's first position), the state up to the next
/// range's first position (`to`) out to the rank after.
pub(crate) struct Handover<'a> {
    pub(crate) comm: &'a dyn Collectives,
    pub(crate) layout: &'a CacheLayout,
    pub(crate) window: usize,
    pub(crate) rank: usize,
    pub(crate) from: Option<usize>,
    pub(crate) to: Option<usize>,
}

impl LayerHook for Handover<'_> {
    fn before(&mut self, layer: usize, cache: &mut dyn CacheView) {
        if let Some(p) = self.from {
            let msg = StateMessage::new(self.layout, layer, Part::Before(p), self.window);
            msg.receive(self.comm, self.rank - 1, cache);
        }
    }

    fn after(&mut self, layer: usize, cache: &mut dyn CacheView) {
        if let Some(p) = self.to {
            let msg = StateMessage::new(self.layout, layer, Part::Before(p), self.window);
            msg.send(self.comm, self.rank + 1, cache);
        }
    }
}
