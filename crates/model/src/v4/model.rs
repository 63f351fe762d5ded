//! The whole model: embedding → mHC residual streams → blocks → hyper head → norm → lm_head,
//! over a flat batch whose sequences keep their state in a [`CacheView`].

use super::block::block_forward;
use super::hyper::hc_head;
use super::workspace::Workspace;
use crate::batch::{ForwardBatch, Logits, SeqSpan};
use crate::cache::CacheView;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{AttnKind, ConfigError, ModelConfig, RopeParams};
use crate::profile::{scope, Op};
use crate::weights::ModelWeights;
use deepinfer_kernels::norm::rms_norm_rows;
use deepinfer_kernels::rope::{Rope, YarnParams};
use std::path::Path;
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("config: {0}")]
    Config(#[from] ConfigError),
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
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
    #[error("a span [{start}, {start}+{len}) does not fit the batch of {tokens} tokens")]
    BadSpan {
        start: usize,
        len: usize,
        tokens: usize,
    },
}

/// Where each flat row of a batch belongs: `(span index, the span's first position, the
/// span's first row)`, plus the batch's positions and spans.
pub struct BatchRows<'a> {
    pub positions: &'a [usize],
    pub spans: &'a [SeqSpan],
    pub row_seq: Vec<(usize, usize, usize)>,
}

/// One rope table's `(cos, sin)` at every row's position, `[N, rd/2]` each: computed once
/// per forward and shared by every head and layer that uses the table.
pub struct Angles {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Angles {
    pub fn new(rope: &Rope, positions: &[usize], ws: &mut Workspace) -> Self {
        let half = rope.dim() / 2;
        let (mut cos, mut sin) = (
            ws.take(positions.len() * half),
            ws.take(positions.len() * half),
        );
        rope.table(positions, &mut cos, &mut sin);
        Self { half, cos, sin }
    }

    pub fn row(&self, i: usize) -> (&[f32], &[f32]) {
        let r = i * self.half..(i + 1) * self.half;
        (&self.cos[r.clone()], &self.sin[r])
    }

    pub fn recycle(self, ws: &mut Workspace) {
        ws.give(self.cos);
        ws.give(self.sin);
    }
}

/// Scratch kept between forwards (see [`Workspace`]).
#[derive(Default)]
struct Scratch {
    ws: Workspace,
    row_seq: Vec<(usize, usize, usize)>,
    /// The rayon pool whose threads have their scratch reserved (its id).
    reserved_pool: Option<usize>,
}

pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    rope_main: Rope,
    rope_compress: Rope,
    /// Locked for the length of a forward; a model runs one batch at a time.
    scratch: Mutex<Scratch>,
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
            scratch: Mutex::default(),
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
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let ck = Checkpoint::open(dir)?;
        let weights = ModelWeights::load_with_progress(&ck, &config, progress)?;
        Ok(Self::new(config, weights))
    }

    /// The rope table of `layer`: plain for sliding layers, the compress (YaRN) one otherwise.
    pub fn rope_for(&self, layer: usize) -> &Rope {
        match self.config.layer_types[layer] {
            AttnKind::Sliding => &self.rope_main,
            _ => &self.rope_compress,
        }
    }

    /// Checks the batch against the model and the cache, and maps rows to sequences.
    fn rows<'a>(
        &self,
        batch: &'a ForwardBatch,
        cache: &dyn CacheView,
        mut row_seq: Vec<(usize, usize, usize)>,
    ) -> Result<BatchRows<'a>, ModelError> {
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
        if cache.window_slots() < self.config.sliding_window {
            return Err(ModelError::RingTooSmall {
                slots: cache.window_slots(),
                needed: self.config.sliding_window,
            });
        }
        row_seq.clear();
        row_seq.resize(n, (usize::MAX, 0, 0));
        for (s, span) in batch.spans.iter().enumerate() {
            if span.start + span.len > n {
                return Err(ModelError::BadSpan {
                    start: span.start,
                    len: span.len,
                    tokens: n,
                });
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
                if pos >= cache.capacity_tokens(s) {
                    return Err(ModelError::CacheTooSmall {
                        seq: s,
                        pos,
                        capacity: cache.capacity_tokens(s),
                    });
                }
                if row_seq[span.start + off].0 != usize::MAX {
                    return Err(ModelError::BadSpan {
                        start: span.start,
                        len: span.len,
                        tokens: n,
                    });
                }
                row_seq[span.start + off] = (s, p0, span.start);
            }
        }
        if row_seq.iter().any(|r| r.0 == usize::MAX) {
            return Err(ModelError::BadSpan {
                start: 0,
                len: n,
                tokens: n,
            });
        }
        Ok(BatchRows {
            positions: &batch.positions,
            spans: &batch.spans,
            row_seq,
        })
    }

    /// Runs the batch, leaves its state in `cache`, and returns the logits of
    /// `batch.logits_rows`.
    pub fn forward(
        &self,
        batch: &ForwardBatch,
        cache: &mut dyn CacheView,
    ) -> Result<Logits, ModelError> {
        let mut logits = Logits {
            vocab: self.config.vocab_size,
            data: Vec::new(),
        };
        self.forward_into(batch, cache, &mut logits, None)?;
        Ok(logits)
    }

    /// [`Model::forward`], also recording the residual streams `[N, hc, D]` after every
    /// layer (how a mismatch with the reference is located).
    pub fn forward_traced(
        &self,
        batch: &ForwardBatch,
        cache: &mut dyn CacheView,
        trace: &mut Vec<Vec<f32>>,
    ) -> Result<Logits, ModelError> {
        let mut logits = Logits {
            vocab: self.config.vocab_size,
            data: Vec::new(),
        };
        self.forward_into(batch, cache, &mut logits, Some(trace))?;
        Ok(logits)
    }

    /// [`Model::forward`] into a reused `logits` (its buffer is kept when large enough): with
    /// the model's workspace this is a forward that allocates nothing in steady state.
    pub fn forward_into(
        &self,
        batch: &ForwardBatch,
        cache: &mut dyn CacheView,
        logits: &mut Logits,
        trace: Option<&mut Vec<Vec<f32>>>,
    ) -> Result<(), ModelError> {
        // The step's parallel passes are short and many: see `awake` for what sleeping
        // workers cost between them.
        deepinfer_kernels::awake::with_workers_awake(|| {
            self.forward_pass(batch, cache, logits, trace)
        })
    }

    fn forward_pass(
        &self,
        batch: &ForwardBatch,
        cache: &mut dyn CacheView,
        logits: &mut Logits,
        mut trace: Option<&mut Vec<Vec<f32>>>,
    ) -> Result<(), ModelError> {
        let _p = scope(Op::Other);
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let scratch = &mut *guard;
        // Once per compute pool: every thread's scratch grown to what any step can need,
        // so steady steps allocate nothing whichever thread runs which task.
        let pool = rayon::current_thread_index().map(|_| rayon::current_num_threads());
        if scratch.reserved_pool != pool {
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
            rayon::broadcast(|_| {
                deepinfer_kernels::linear::reserve_scratch(floats);
                super::attention::reserve_scratch(c);
            });
            scratch.reserved_pool = pool;
        }
        let rows = self.rows(batch, &*cache, std::mem::take(&mut scratch.row_seq))?;
        let ws = &mut scratch.ws;
        let c = &self.config;
        let (d, hc, n) = (c.hidden_size, c.hc_mult, batch.num_tokens());
        let angles_main = Angles::new(&self.rope_main, rows.positions, ws);
        let angles_compress = Angles::new(&self.rope_compress, rows.positions, ws);
        let mut x = ws.take(n * hc * d);
        crate::profile::weight_read(n * self.weights.embed.stored_bytes() / c.vocab_size);
        for (i, &id) in batch.token_ids.iter().enumerate() {
            let row = &mut x[i * hc * d..(i + 1) * hc * d];
            self.weights
                .embed
                .dequantize_row(id as usize, &mut row[..d]);
            for s in 1..hc {
                row.copy_within(..d, s * d);
            }
        }
        for (l, lw) in self.weights.layers.iter().enumerate() {
            let angles = match c.layer_types[l] {
                AttnKind::Sliding => &angles_main,
                _ => &angles_compress,
            };
            block_forward(
                lw,
                c,
                l,
                &mut x,
                &batch.token_ids,
                &rows,
                cache,
                self.rope_for(l),
                angles,
                ws,
            );
            if let Some(tr) = trace.as_deref_mut() {
                tr.push(x.clone());
            }
        }
        // Only the rows that want logits go through the head.
        let w = &self.weights;
        let m = batch.logits_rows.len();
        let mut picked = ws.take(m * hc * d);
        for (o, &r) in picked.chunks_exact_mut(hc * d).zip(&batch.logits_rows) {
            o.copy_from_slice(&x[r * hc * d..(r + 1) * hc * d]);
        }
        let mut h = hc_head(
            &picked,
            m,
            &w.hc_head_fn,
            &w.hc_head_base,
            w.hc_head_scale[0],
            c,
            ws,
        );
        {
            let _p = scope(Op::NormRope);
            rms_norm_rows(&mut h, &w.norm, c.rms_norm_eps);
        }
        logits.vocab = c.vocab_size;
        logits.data.clear();
        logits.data.resize(m * c.vocab_size, 0.0);
        w.head.forward_into(&h, m, &mut logits.data);
        for v in [x, picked, h] {
            ws.give(v);
        }
        angles_main.recycle(ws);
        angles_compress.recycle(ws);
        scratch.row_seq = rows.row_seq;
        Ok(())
    }
}
