//! A rank other than 0 under context parallelism: the whole model and a cache for the one
//! sequence of a split step, computing its range of each step's chunk.

use super::{main_layers, Handover, Plan};
use crate::cache::layout::CacheLayout;
use crate::cache::{
    default_block_tokens, CacheBudget, CacheConfig, CacheError, CacheManager, SeqId,
};
use deepinfer_model::batch::{ForwardBatch, Logits};
use deepinfer_model::parallel::{receive_header, Collectives, Op};
use deepinfer_model::v4::model::ForwardExtras;
use deepinfer_model::v4::Model;
use std::sync::Arc;

pub struct ContextWorker {
    model: Model,
    /// Room for the one sequence of the longest step so far (grown when a step needs more).
    cache: CacheManager,
    layout: CacheLayout,
    comm: Arc<dyn Collectives>,
    seq: Option<SeqId>,
    batch: ForwardBatch,
    logits: Logits,
}

impl ContextWorker {
    /// This rank's part of a job that rank 0's [`Model::set_context_parallel`] splits by
    /// position.
    pub fn new(model: Model, comm: Arc<dyn Collectives>) -> Result<Self, CacheError> {
        let cache = CacheManager::new(&model.config, cache_config(&model, FIRST_BUDGET))?;
        let logits = Logits {
            vocab: model.config.vocab_size,
            data: Vec::new(),
        };
        Ok(Self {
            layout: cache.layout().clone(),
            model,
            cache,
            comm,
            seq: None,
            batch: ForwardBatch::default(),
            logits,
        })
    }

    /// Serves split steps until rank 0's model goes; an error names what went wrong (the
    /// caller ends the job with it: rank 0 is waiting for this rank's layers).
    pub fn run(mut self) -> Result<(), String> {
        loop {
            match receive_header(&*self.comm) {
                Ok((Op::Context, _, tokens)) => self.step(tokens)?,
                Ok((Op::Stop, ..)) => return Ok(()),
                Ok((op, ..)) => {
                    return Err(format!(
                        "rank 0 sent {op:?}: it does not split by position like this rank \
                         (give every rank the same --context-parallel-size)"
                    ))
                }
                Err(word) => return Err(format!("unknown operation {word} from rank 0")),
            }
        }
    }

    /// One split step: this rank's range, the state before it from the rank before, its
    /// own on to the rank after; the last rank hands rank 0 every later range's state and
    /// the logits.
    fn step(&mut self, tokens: usize) -> Result<(), String> {
        let comm = Arc::clone(&self.comm);
        let (rank, ranks) = (comm.rank(), comm.size());
        let plan = Plan::receive(&*comm, tokens);
        let mine = plan.range(rank, ranks);
        let last = rank + 1 == ranks;
        plan.batch(
            mine.clone(),
            if last { plan.logits } else { 0 },
            &mut self.batch,
        );
        let cache_err = |e: CacheError| format!("context-parallel cache: {e}");
        if let Some(s) = self.seq.take() {
            self.cache.free_seq(s).map_err(cache_err)?;
        }
        self.make_room(mine.end).map_err(cache_err)?;
        let seq = self.cache.add_seq().map_err(cache_err)?;
        self.seq = Some(seq);
        self.cache
            .ensure_capacity(seq, mine.end)
            .map_err(cache_err)?;
        let mut hook = Handover {
            comm: &*comm,
            layout: &self.layout,
            window: self.model.config.sliding_window,
            rank,
            from: Some(mine.start),
            to: (!last).then(|| plan.range(rank + 1, ranks).start),
        };
        let mut view = self.cache.view(&[seq]).map_err(cache_err)?;
        let extras = ForwardExtras {
            layers: Some(&mut hook),
            ..ForwardExtras::default()
        };
        self.model
            .forward_into(&self.batch, &mut view, &mut self.logits, extras)
            .map_err(|e| format!("context-parallel step: {e}"))?;
        let main = main_layers(&self.model);
        if last {
            for msg in plan.handed_back(&self.layout, ranks, main) {
                msg.send(&*comm, 0, &view);
            }
            comm.send_f32(0, &self.logits.data);
        }
        let window = self.model.config.sliding_window;
        for msg in plan.ring_rows(&self.layout, (rank, ranks), (main, window)) {
            msg.send(&*comm, 0, &view);
        }
        Ok(())
    }
}

/// The worker cache's first budget; doubled until a step's positions fit.
const FIRST_BUDGET: usize = 64 << 20;

/// One sequence of `model`, its drafter's context rings when it has a DSpark drafter, no
/// prefix caching, in `bytes`.
fn cache_config(model: &Model, bytes: usize) -> CacheConfig {
    let c = &model.config;
    let rings = c.dspark.as_ref().filter(|_| model.dspark.is_some());
    CacheConfig {
        budget: CacheBudget::Bytes(bytes),
        max_seqs: 1,
        block_tokens: default_block_tokens(c),
        draft_layers: rings.map_or(0, |d| d.stages),
        prefix_caching: false,
        ..CacheConfig::default()
    }
}

impl ContextWorker {
    /// A cache whose one sequence holds `tokens` positions: this one, or twice the budget
    /// until one does.
    fn make_room(&mut self, tokens: usize) -> Result<(), CacheError> {
        if self.cache.max_tokens_per_seq() >= tokens {
            return Ok(());
        }
        let (m, c) = (&self.model, &self.model.config);
        let mut bytes = FIRST_BUDGET;
        while CacheManager::max_tokens_for(c, cache_config(m, bytes))? < tokens {
            bytes *= 2;
        }
        self.cache = CacheManager::new(c, cache_config(m, bytes))?;
        self.layout = self.cache.layout().clone();
        Ok(())
    }
}
