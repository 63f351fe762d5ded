//! The whole model: embedding → mHC residual streams → blocks → hyper head → norm → lm_head,
//! over a flat batch whose sequences keep their state in a [`CacheView`]. V4.1 (docs/MODEL.md §8)
//! adds Engram reads in front of some blocks and collapses the final streams with the last
//! sublayer's weights instead of a hyper head.

mod weights;
pub use weights::ModelWeights;

use super::block::block_forward;
use super::carry::Carry;
use super::dspark::{Draft, DraftContext, DraftTarget, DsparkWeights};
use super::embed::{embed_streams, override_streams};
use super::engram::{engram, EngramHashing};
use super::head::{FinalCollapse, Head};
use super::pass::BlockCtx;
use super::rows::{Angles, BatchRows};
use super::workspace::Workspace;
use crate::batch::{ForwardBatch, Logits};
use crate::cache::CacheView;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{AttnKind, ConfigError, ModelConfig, RopeParams};
use crate::engram::{CompressedTokenMap, EngramError, EngramLayout};
use crate::experts::{BudgetTooSmall, ExpertError, MemoryPlan, StoredBytes};
use crate::numerics::Numerics;
use crate::parallel::{Collectives, Placement, SplitGuard};
use crate::profile::{scope, Op};
use crate::v4::moe::TextRouting;
use crate::vision::{VisionError, VisionTower};
use deepinfer_kernels::rope::{Rope, YarnParams};
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    // The inner errors already say what they are about (a config field, a tensor, a file):
    // each is shown as it is, once (a prefix here would repeat it in an error chain).
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("streamed experts: {0}")]
    Experts(#[from] ExpertError),
    #[error(transparent)]
    Engram(#[from] EngramError),
    #[error(transparent)]
    Vision(#[from] VisionError),
    #[error(transparent)]
    Memory(#[from] BudgetTooSmall),
    #[error("{0}")]
    Unsupported(&'static str),
    #[error("{numerics} numerics: {reason}")]
    Numerics {
        numerics: Numerics,
        reason: &'static str,
    },
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("the batch has {tokens} tokens but {positions} positions")]
    PositionsLength { positions: usize, tokens: usize },
    #[error("sequence {seq}: positions must run consecutively; offset {offset} has position {pos}, expected {expected}")]
    NonConsecutive {
        seq: usize,
        offset: usize,
        pos: usize,
        expected: usize,
    },
    #[error("sequence {seq}: position {pos} is beyond the {capacity} tokens its cache holds")]
    CacheTooSmall {
        seq: usize,
        pos: usize,
        capacity: usize,
    },
    #[error("the cache's window ring has {slots} slots; the model needs at least {needed}")]
    RingTooSmall { slots: usize, needed: usize },
    #[error("logits row {row} is outside the batch of {tokens} tokens")]
    BadLogitsRow { row: usize, tokens: usize },
    #[error("{rows} input embeddings of {values} values for a width of {hidden}, or a row outside the batch of {tokens} tokens")]
    BadEmbeds {
        rows: usize,
        values: usize,
        hidden: usize,
        tokens: usize,
    },
    #[error("a span [{start}, {start}+{len}) does not fit the batch of {tokens} tokens")]
    BadSpan {
        start: usize,
        len: usize,
        tokens: usize,
    },
    #[error("the batch has {floors} window floors for {spans} spans")]
    WindowFloors { floors: usize, spans: usize },
    #[error("sequence {seq}: window floor {floor} is after its first position {first}")]
    FloorAfterStart {
        seq: usize,
        floor: usize,
        first: usize,
    },
    #[error("the checkpoint has no MTP block (mtp.0.*): it cannot draft tokens")]
    NoMtp,
    #[error("the cache has {layers} layers: none for the MTP block's window")]
    NoMtpCache { layers: usize },
    #[error("the MTP block got {floats} floats of hidden state; the batch needs {expected}")]
    HiddenLength { floats: usize, expected: usize },
}

/// Scratch kept between forwards (see [`Workspace`]).
#[derive(Default)]
pub(super) struct Scratch {
    pub ws: Workspace,
    /// V4.1's Engram table rows of the step, per Engram layer.
    pub engram_rows: Vec<Vec<u64>>,
    pub row_seq: Vec<(usize, usize, usize)>,
    /// The rayon pool whose threads have their scratch reserved (its id).
    reserved_pool: Option<usize>,
    /// Whether products give a row the same bits whatever batch it is in (see
    /// [`Model::set_batch_invariant`]); set on every thread of the pool with the scratch.
    pub batch_variant: bool,
}

/// A job whose ranks each hold the whole model and split long prefills by position.
#[derive(Clone, Debug)]
pub struct ContextSplit {
    pub comm: Arc<dyn Collectives>,
    /// The shortest step that is split.
    pub min_tokens: usize,
}

/// What a forward pass hands back besides the logits.
#[derive(Default)]
pub struct ForwardExtras<'a> {
    /// Receives the final residual streams `[N, hc, D]` of every row, before the hyper
    /// head: what the MTP block drafts from. The buffer is swapped in, not copied.
    pub hidden: Option<&'a mut Vec<f32>>,
    /// Receives the streams after every layer (how a mismatch with the reference is found).
    pub trace: Option<&'a mut Vec<Vec<f32>>>,
    /// Called around every main layer ([`LayerHook`]).
    pub layers: Option<&'a mut dyn LayerHook>,
}

/// What runs around each main layer of a forward pass: context parallelism brings in the
/// cache state of earlier positions that another process computed before the layer reads
/// it, and passes its own on after the layer wrote it.
pub trait LayerHook {
    fn before(&mut self, layer: usize, cache: &mut dyn CacheView);
    fn after(&mut self, layer: usize, cache: &mut dyn CacheView);
}

pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    pub(super) rope_main: Rope,
    pub(super) rope_compress: Rope,
    pub(super) scratch: Scratch,
    memory_plan: String,
    /// Split over ranks (this is rank 0 of each): tells the others to stop when the model
    /// goes, its own group's first, then the context-parallel ranks.
    _split: Vec<SplitGuard>,
    /// Context parallelism (rank 0 of a job whose ranks each hold the whole model).
    context: Option<ContextSplit>,
    /// V4.1's n-gram hashing, when the model has Engram layers.
    engram: Option<EngramHashing>,
    /// The DSpark drafter, when the checkpoint ships one (split over ranks, its stage
    /// experts are shared out by id and the rest stays here).
    pub dspark: Option<DsparkWeights>,
    /// The vision tower, when the config declares one and the checkpoint ships it: images
    /// become input embeddings ([`ForwardBatch::embed_rows`]) on the process that runs it.
    pub vision: Option<Arc<VisionTower>>,
}

fn rope_table(c: &ModelConfig, p: &RopeParams) -> Rope {
    let yarn = p.yarn.as_ref().map(|y| YarnParams {
        factor: y.factor,
        original_max_position_embeddings: y.original_max_position_embeddings,
        beta_fast: y.beta_fast,
        beta_slow: y.beta_slow,
    });
    Rope::new(c.qk_rope_head_dim, p.theta, yarn)
}

impl Model {
    pub fn new(config: ModelConfig, weights: ModelWeights) -> Self {
        let rope_main = rope_table(&config, &config.rope_main);
        let rope_compress = rope_table(&config, &config.rope_compress);
        Self {
            config,
            weights,
            rope_main,
            rope_compress,
            scratch: Scratch::default(),
            memory_plan: "every weight resident".into(),
            _split: Vec::new(),
            context: None,
            engram: None,
            dspark: None,
            vision: None,
        }
    }

    /// Loads `config.json` and the safetensors checkpoint in `dir` (either name layout).
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        Self::load_with_progress(dir, |_, _| {})
    }

    /// Like [`Self::load`], reporting `(done, total)` loading steps (see
    /// [`ModelWeights::load_with_progress`]).
    pub fn load_with_progress(
        dir: &Path,
        progress: impl FnMut(usize, usize),
    ) -> Result<Self, ModelError> {
        Self::load_with(dir, &MemoryPlan::default(), progress)
    }

    /// Like [`Self::load_with_progress`], holding the routed experts as `memory` decides
    /// (resident, or streamed from disk through a cache); the choice and its reason are
    /// logged and kept in [`Self::memory_plan`].
    pub fn load_with(
        dir: &Path,
        memory: &MemoryPlan,
        progress: impl FnMut(usize, usize),
    ) -> Result<Self, ModelError> {
        Self::load_placed(dir, memory, None, progress)
    }

    /// Like [`Self::load_with`] as rank 0 of a model split over ranks as `placement` says
    /// (each other rank runs a [`Worker`](super::Worker)): this process loads everything
    /// but the other ranks' shares, and the memory plan counts what it loads.
    pub fn load_split(
        dir: &Path,
        memory: &MemoryPlan,
        placement: Placement,
        progress: impl FnMut(usize, usize),
    ) -> Result<Self, ModelError> {
        Self::load_placed(dir, memory, Some(placement), progress)
    }

    fn load_placed(
        dir: &Path,
        memory: &MemoryPlan,
        placement: Option<Placement>,
        progress: impl FnMut(usize, usize),
    ) -> Result<Self, ModelError> {
        let ck = Checkpoint::open(dir)?;
        let (config, _) = ModelConfig::of_checkpoint(dir, &ck)?;
        let engram = engram_hashing(dir, &config)?;
        let mut bytes = StoredBytes::of(&ck);
        if let Some(pl) = &placement {
            let ranks = (pl.comm.rank(), pl.comm.size());
            bytes = bytes.share(&config, ranks, pl.tensor, pl.experts_whole());
        }
        let (plan, mut why) = memory.choose(bytes, &config)?;
        if let Some(pl) = &placement {
            why = format!("{}: {why}", describe_share(&config, pl, bytes));
        }
        tracing::info!("memory plan: {why}");
        let weights =
            ModelWeights::load_with_progress(&ck, &config, plan, placement.as_ref(), progress)?;
        // Split over ranks, the drafter's stage experts are split by id (the other ranks
        // hold them beside the target's), the rest of it stays on rank 0, and the head it
        // shares with the target is split as the target's.
        let dspark = match super::dspark::shipped(&ck, &config) {
            Some(dc) => Some(DsparkWeights::load(&ck, &config, dc, placement.as_ref())?),
            None => None,
        };
        let vision = match &config.vision {
            Some(vc) if ck.contains("vision.patch_embed.proj.weight") => {
                let image_id = config.v41.as_ref().and_then(|v| v.image_token_id);
                let image_id = image_id.unwrap_or(crate::vision::layout::V41_IMAGE_TOKEN);
                Some(Arc::new(VisionTower::load(
                    &ck,
                    vc,
                    config.hidden_size,
                    image_id,
                )?))
            }
            _ => None,
        };
        let mut model = Self::new(config, weights);
        model.engram = engram;
        model.dspark = dspark;
        model.vision = vision;
        model.memory_plan = why;
        model
            ._split
            .extend(placement.map(|pl| SplitGuard { comm: pl.comm }));
        Ok(model)
    }

    /// Splits long prefill steps over the ranks of `comm` by position (context parallelism:
    /// the engine's `dist::context`), each rank holding a copy of the model (whole, or split
    /// over its group); `min_tokens`: the shortest step that is split. The other ranks are
    /// told to stop when the model goes, after this model's own group.
    pub fn set_context_parallel(&mut self, comm: Arc<dyn Collectives>, min_tokens: usize) {
        self._split.push(SplitGuard {
            comm: Arc::clone(&comm),
        });
        self.context = Some(ContextSplit { comm, min_tokens });
    }

    /// The context-parallel setting, when [`Self::set_context_parallel`] made one.
    pub fn context_parallel(&self) -> Option<&ContextSplit> {
        self.context.as_ref()
    }

    /// Which memory plan the load chose, and why.
    pub fn memory_plan(&self) -> &str {
        &self.memory_plan
    }

    /// Makes this model instance run sequences of at most `max_len` positions (the engine's
    /// effective `max_model_len`): per-thread scratch is sized for that, not for the
    /// config's `max_position_embeddings`, and an indexer top-k beyond the entries such a
    /// sequence can have is lowered to that count (it picks the same entries).
    pub fn limit_positions(&mut self, max_len: usize) {
        let c = &mut self.config;
        c.max_position_embeddings = max_len.max(1);
        let entries = c.max_position_embeddings / c.compress_rate_csa.max(1);
        c.index_topk = c.index_topk.min(entries.max(1));
        self.scratch.reserved_pool = None;
    }

    /// Whether every product gives a row the same bits whatever else shares its step (on
    /// by default): what makes a cached prefix equal a cold prefill bit for bit. Off, the
    /// prefill-sized products sum in a faster order (within rounding of the other).
    pub fn set_batch_invariant(&mut self, on: bool) {
        self.scratch.batch_variant = !on;
        self.scratch.reserved_pool = None;
    }

    /// Computes with `numerics` from the next step on ([`Numerics`]; `official` on V4.1 is
    /// [`Numerics::OfficialV41`]); on a split model, rank 0's half of the choice (the other
    /// ranks take theirs with [`Worker::set_numerics`](super::Worker::set_numerics)).
    /// Official numerics on V4 needs a power-of-two indexer head (its Hadamard rotation),
    /// and either runs split with the experts whole only: under tensor parallelism each rank
    /// would round its part of `wo_b`'s and `w2`'s inputs, which equals rounding the whole
    /// only where parts are whole blocks, and that path is neither written for `wo_b` nor
    /// tested.
    pub fn set_numerics(&mut self, numerics: Numerics) -> Result<(), ModelError> {
        let c = &self.config;
        let numerics = numerics.for_model(c.v41.is_some());
        if numerics != Numerics::Reference {
            let csa = c.layer_types.contains(&AttnKind::Csa);
            let reason = if numerics.rotates_indexer() && csa && !c.index_head_dim.is_power_of_two()
            {
                Some("the indexer's Hadamard rotation needs a power-of-two `index_head_dim`")
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(ModelError::Numerics { numerics, reason });
            }
        }
        self.config.numerics = numerics;
        Ok(())
    }

    /// DSpark's block after `context`'s positions (`anchor`: the token at their end) into
    /// `out`; `ws` holds its buffers between calls.
    ///
    /// # Panics
    /// When the model has no drafter (the engine checks before it drafts).
    pub fn draft_into(
        &self,
        context: &DraftContext,
        anchor: u32,
        out: &mut Draft,
        ws: &mut Workspace,
    ) -> Result<(), ModelError> {
        let ds = self.dspark.as_ref().expect("a DSpark drafter");
        let target = DraftTarget {
            config: &self.config,
            embed: &self.weights.embed,
            head: &self.weights.head,
            rope: &self.rope_main,
        };
        Ok(ds.draft_into(&target, context, anchor, out, ws)?)
    }

    /// The rope table of `layer`: plain for sliding layers, the compress (YaRN) one otherwise.
    pub fn rope_for(&self, layer: usize) -> &Rope {
        match self.config.layer_types[layer] {
            AttnKind::Sliding => &self.rope_main,
            _ => &self.rope_compress,
        }
    }

    /// Checks the batch against the model and the cache, and maps rows to sequences.
    /// `paged`: whether the pass writes paged entries, so positions must lie within each
    /// sequence's reserved capacity (the MTP block only has a window ring).
    pub(super) fn rows<'a>(
        &self,
        batch: &'a ForwardBatch,
        cache: &dyn CacheView,
        mut row_seq: Vec<(usize, usize, usize)>,
        paged: bool,
    ) -> Result<BatchRows<'a>, ModelError> {
        self.check_rows(batch, cache)?;
        map_spans(batch, cache, &mut row_seq, paged)?;
        check_window_floors(batch)?;
        let rows = BatchRows::with_window_floors(
            &batch.positions,
            &batch.spans,
            row_seq,
            &batch.window_floor,
        );
        // V4-Flash-Vision-Exp's image positions see their whole span (docs/MODEL.md §8.9).
        Ok(match &self.config.vision {
            Some(v) if self.config.image_spans_see_themselves() => {
                rows.with_image_spans(&batch.image_spans, v.max_n_token)
            }
            _ => rows,
        })
    }

    /// Row-wise checks: one position per token, ids inside the vocabulary, logits rows
    /// inside the batch, a window ring as long as the model's window.
    fn check_rows(&self, batch: &ForwardBatch, cache: &dyn CacheView) -> Result<(), ModelError> {
        let (vocab, n) = (self.config.vocab_size, batch.num_tokens());
        if batch.positions.len() != n {
            return Err(ModelError::PositionsLength {
                positions: batch.positions.len(),
                tokens: n,
            });
        }
        if let Some(&id) = batch.token_ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(ModelError::TokenOutOfRange { id, vocab });
        }
        if let Some(&row) = batch.logits_rows.iter().find(|&&r| r >= n) {
            return Err(ModelError::BadLogitsRow { row, tokens: n });
        }
        let d = self.config.hidden_size;
        let given = batch.embed_rows.len();
        if batch.embed_values.len() != given * d || batch.embed_rows.iter().any(|&r| r >= n) {
            return Err(ModelError::BadEmbeds {
                rows: given,
                values: batch.embed_values.len(),
                hidden: d,
                tokens: n,
            });
        }
        if cache.window_slots() < self.config.sliding_window {
            return Err(ModelError::RingTooSmall {
                slots: cache.window_slots(),
                needed: self.config.sliding_window,
            });
        }
        Ok(())
    }

    /// Runs the batch, leaves its state in `cache`, and returns the logits of
    /// `batch.logits_rows`.
    pub fn forward(
        &mut self,
        batch: &ForwardBatch,
        cache: &mut dyn CacheView,
    ) -> Result<Logits, ModelError> {
        let mut logits = Logits {
            vocab: self.config.vocab_size,
            data: Vec::new(),
        };
        self.forward_into(batch, cache, &mut logits, ForwardExtras::default())?;
        Ok(logits)
    }

    /// [`Model::forward`], also recording the residual streams `[N, hc, D]` after every
    /// layer (how a mismatch with the reference is located).
    pub fn forward_traced(
        &mut self,
        batch: &ForwardBatch,
        cache: &mut dyn CacheView,
        trace: &mut Vec<Vec<f32>>,
    ) -> Result<Logits, ModelError> {
        let mut logits = Logits {
            vocab: self.config.vocab_size,
            data: Vec::new(),
        };
        let extras = ForwardExtras {
            trace: Some(trace),
            ..ForwardExtras::default()
        };
        self.forward_into(batch, cache, &mut logits, extras)?;
        Ok(logits)
    }

    /// [`Model::forward`] into a reused `logits` (its buffer is kept when large enough): with
    /// the model's workspace this is a forward that allocates nothing in steady state.
    pub fn forward_into(
        &mut self,
        batch: &ForwardBatch,
        cache: &mut dyn CacheView,
        logits: &mut Logits,
        extras: ForwardExtras<'_>,
    ) -> Result<(), ModelError> {
        // The step's parallel passes are short and many: see `awake` for what sleeping
        // workers cost between them.
        deepinfer_kernels::awake::with_workers_awake(|| {
            self.forward_pass(batch, cache, logits, extras)
        })
    }

    /// Once per compute pool: every thread's scratch grown to what any step can need, so
    /// steady steps allocate nothing whichever thread runs which task.
    pub(super) fn reserve_thread_scratch(&mut self) {
        let pool = rayon::current_thread_index().map(|_| rayon::current_num_threads());
        if self.scratch.reserved_pool == pool {
            return;
        }
        let c = &self.config;
        let widest = [
            c.hidden_size,
            c.num_attention_heads * c.head_dim,
            c.o_groups * c.o_lora_rank,
            c.hc_mult * c.hidden_size,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        // Two weight rows, or a decode-sized block of activations.
        let floats = 16 * widest;
        let invariant = !self.scratch.batch_variant;
        rayon::broadcast(|_| {
            deepinfer_kernels::linear::reserve_scratch(floats);
            deepinfer_kernels::linear::set_batch_invariant(invariant);
            super::attention::reserve_scratch(c);
        });
        self.scratch.reserved_pool = pool;
    }

    fn forward_pass(
        &mut self,
        batch: &ForwardBatch,
        cache: &mut dyn CacheView,
        logits: &mut Logits,
        mut extras: ForwardExtras<'_>,
    ) -> Result<(), ModelError> {
        let _p = scope(Op::Other);
        self.reserve_thread_scratch();
        let row_seq = std::mem::take(&mut self.scratch.row_seq);
        let rows = self.rows(batch, &*cache, row_seq, true)?;
        if let Some(e) = &self.engram {
            e.rows_into(batch, &mut self.scratch.engram_rows)?;
        }
        let Self {
            config: c,
            weights: w,
            rope_main,
            rope_compress,
            scratch,
            dspark,
            ..
        } = self;
        let (ws, engram_rows) = (&mut scratch.ws, &scratch.engram_rows);
        let dspark = dspark.as_ref();
        let (d, hc, n) = (c.hidden_size, c.hc_mult, batch.num_tokens());
        let mut carry = Carry::default();
        let angles_main = Angles::new(rope_main, rows.positions, ws);
        let angles_compress = Angles::new(rope_compress, rows.positions, ws);
        prefetch_hash_routed(w, c.num_experts_per_tok, &batch.token_ids);
        let mut x = ws.take(n * hc * d);
        embed_streams(&w.embed, &batch.token_ids, hc, d, &mut x);
        override_streams(batch, hc, d, &mut x);
        // The drafter's context rings, where the cache keeps them: every row's aux streams.
        let dspark = dspark.filter(|ds| ds.has_rings(c, &*cache));
        let mut aux = dspark.map(|ds| ws.take(n * ds.aux_width()));
        for (l, lw) in w.layers.iter().enumerate() {
            let (rope, angles) = match c.layer_types[l] {
                AttnKind::Sliding => (&*rope_main, &angles_main),
                _ => (&*rope_compress, &angles_compress),
            };
            let ctx = BlockCtx {
                c,
                layer: l,
                token_ids: &batch.token_ids,
                rows: &rows,
                rope,
                angles,
            };
            if let (Some(aux), Some(ds)) = (aux.as_deref_mut(), dspark) {
                capture_aux(&ds.config.aux_layers, l, &x, hc, d, aux);
            }
            if let Some(ew) = &lw.engram {
                engram(ew, c, &mut x, &engram_rows[ew.index], &batch.token_ids, ws)?;
            }
            if let Some(hook) = extras.layers.as_deref_mut() {
                hook.before(l, cache);
            }
            block_forward(lw, &ctx, &mut x, cache, &mut carry, ws)?;
            if let Some(hook) = extras.layers.as_deref_mut() {
                hook.after(l, cache);
            }
            if let Some(tr) = extras.trace.as_deref_mut() {
                tr.push(x.clone());
            }
        }
        if let (Some(mut aux), Some(ds)) = (aux.take(), dspark) {
            capture_aux(&ds.config.aux_layers, w.layers.len(), &x, hc, d, &mut aux);
            ds.store_context(c, &aux, &rows, &angles_main, cache, ws);
            ws.give(aux);
        }
        head_logits(w, c, &carry, &x, &batch.logits_rows, logits, ws);
        carry.recycle(ws);
        match extras.hidden {
            Some(hidden) => {
                std::mem::swap(hidden, &mut x);
                ws.give(x);
            }
            None => ws.give(x),
        }
        angles_main.recycle(ws);
        angles_compress.recycle(ws);
        scratch.row_seq = rows.row_seq;
        Ok(())
    }
}

/// The logits of the flat rows `rows` of the final streams `x`: collapsed by V4's hyper
/// head or the last sublayer's `pre` that `carry` holds (V4.1), normed, projected.
fn head_logits(
    w: &ModelWeights,
    c: &ModelConfig,
    carry: &Carry,
    x: &[f32],
    rows: &[usize],
    logits: &mut Logits,
    ws: &mut Workspace,
) {
    let collapse = match (&w.hc_head, &carry.pre) {
        (Some(h), _) => FinalCollapse::Hyper(h),
        (None, Some(pre)) => FinalCollapse::Pre(pre),
        (None, None) => unreachable!("a V4.1 model has layers, each leaving its weights"),
    };
    let head = Head {
        collapse,
        norm: &w.norm,
        head: &w.head,
    };
    head.logits(c, x, rows, logits, ws);
}

/// The mean of each row's streams `x: [N, hc, D]` into its slot of `aux` (`[N, targets · D]`)
/// when the streams entering layer `l` (at `l` = the layer count, the final ones) feed the
/// drafter.
fn capture_aux(targets: &[usize], l: usize, x: &[f32], hc: usize, d: usize, aux: &mut [f32]) {
    let Some(k) = targets.iter().position(|&t| t == l) else {
        return;
    };
    let width = targets.len() * d;
    for (row, out) in x.chunks_exact(hc * d).zip(aux.chunks_exact_mut(width)) {
        let out = &mut out[k * d..(k + 1) * d];
        out.fill(0.0);
        for s in row.chunks_exact(d) {
            deepinfer_kernels::vector::axpy(out, 1.0 / hc as f32, s);
        }
    }
}

/// V4.1's Engram hashing for `config`, from the checkpoint's `tokenizer.json` (the compressed
/// id map is derived from the tokenizer the tables were trained with); `None` without Engram.
fn engram_hashing(dir: &Path, c: &ModelConfig) -> Result<Option<EngramHashing>, ModelError> {
    let Some(v) = &c.v41 else { return Ok(None) };
    let Some(e) = &v.engram else { return Ok(None) };
    let map = CompressedTokenMap::from_tokenizer_file(dir.join("tokenizer.json"))?;
    let layout = EngramLayout::new(&e.params(), &map)?;
    for (i, (&rows, &want)) in layout
        .rows_per_layer()
        .iter()
        .zip(&e.num_embeddings)
        .enumerate()
    {
        if rows != want as u64 {
            return Err(ModelError::Config(ConfigError::Invalid {
                field: format!("engram_num_embeddings[{i}]"),
                value: want.to_string(),
                reason: format!("the hash layout gives {rows} rows"),
            }));
        }
    }
    Ok(Some(EngramHashing {
        layout,
        map,
        image_token_id: v.image_token_id,
    }))
}

/// What rank `pl.comm.rank()` holds of a split model, in words (the memory plan's start).
pub(super) fn describe_share(c: &ModelConfig, pl: &Placement, bytes: StoredBytes) -> String {
    let (rank, size) = (pl.comm.rank(), pl.comm.size());
    let experts = match pl.experts_whole() {
        true => {
            let held = pl.share(c.n_routed_experts);
            format!(
                "experts {}..{} of {}",
                held.start, held.end, c.n_routed_experts
            )
        }
        false => format!("1/{size} of every expert's width"),
    };
    let dense = match (rank, pl.tensor) {
        (0, false) => "the dense part",
        (0, true) => {
            "the dense part not split, its share of the heads, shared expert and vocabulary"
        }
        (_, true) => "its share of the heads, shared expert and vocabulary",
        (_, false) => "no dense weights",
    };
    format!(
        "rank {rank} of {size} holds {dense} ({} MiB) and {experts} ({} MiB)",
        bytes.dense >> 20,
        bytes.experts >> 20
    )
}

/// Starts reading the streamed experts that hash-routed layers will pick for `tokens`: their
/// choice depends on the token ids alone, so it is known before the first layer runs.
fn prefetch_hash_routed(w: &ModelWeights, k: usize, tokens: &[u32]) {
    let Some(store) = &w.expert_store else {
        return;
    };
    let wanted = w.layers.iter().enumerate().flat_map(|(l, lw)| {
        // Image positions route by score: their experts are not known ahead.
        let image = lw.ffn.routing.image.as_ref();
        let table = match &lw.ffn.routing.text {
            TextRouting::Hash(table) => table.as_slice(),
            TextRouting::Scored(_) => &[],
        };
        tokens
            .iter()
            .filter(move |&&t| !image.is_some_and(|im| im.ids.contains(&t)))
            .filter_map(move |&t| table.get(t as usize * k..(t as usize + 1) * k))
            .flatten()
            .map(move |&e| (l, e as usize))
    });
    store.prefetch(wanted);
}

/// Maps each row to `(sequence, its span's first position, its span's first row)`: spans
/// cover every row exactly once, with consecutive positions inside the reserved capacity
/// when `paged`.
fn map_spans(
    batch: &ForwardBatch,
    cache: &dyn CacheView,
    row_seq: &mut Vec<(usize, usize, usize)>,
    paged: bool,
) -> Result<(), ModelError> {
    let n = batch.num_tokens();
    let bad_span = |start, len| ModelError::BadSpan {
        start,
        len,
        tokens: n,
    };
    row_seq.clear();
    row_seq.resize(n, (usize::MAX, 0, 0));
    for (s, span) in batch.spans.iter().enumerate() {
        if span.start + span.len > n {
            return Err(bad_span(span.start, span.len));
        }
        let p0 = batch.positions.get(span.start).copied().unwrap_or(0);
        for off in 0..span.len {
            let (pos, expected) = (batch.positions[span.start + off], p0 + off);
            if pos != expected {
                return Err(ModelError::NonConsecutive {
                    seq: s,
                    offset: off,
                    pos,
                    expected,
                });
            }
            if paged && pos >= cache.capacity_tokens(s) {
                return Err(ModelError::CacheTooSmall {
                    seq: s,
                    pos,
                    capacity: cache.capacity_tokens(s),
                });
            }
            if row_seq[span.start + off].0 != usize::MAX {
                return Err(bad_span(span.start, span.len));
            }
            row_seq[span.start + off] = (s, p0, span.start);
        }
    }
    if row_seq.iter().any(|r| r.0 == usize::MAX) {
        return Err(bad_span(0, n));
    }
    Ok(())
}

/// Window floors, when given: one per span, none after its span's first position.
fn check_window_floors(batch: &ForwardBatch) -> Result<(), ModelError> {
    let floors = &batch.window_floor;
    if !floors.is_empty() && floors.len() != batch.spans.len() {
        return Err(ModelError::WindowFloors {
            floors: floors.len(),
            spans: batch.spans.len(),
        });
    }
    for (s, (span, &floor)) in batch.spans.iter().zip(floors).enumerate() {
        let first = batch.positions.get(span.start).copied().unwrap_or(0);
        if span.len > 0 && floor > first {
            return Err(ModelError::FloorAfterStart {
                seq: s,
                floor,
                first,
            });
        }
    }
    Ok(())
}
