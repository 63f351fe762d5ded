//! The engine: one thread owns every piece of mutable serving state (sequences, scheduler,
//! model runner, cache pools, sampler); callers talk to it through channels only, so the hot
//! path takes no locks.

use crate::cache::disk::DiskConfig;
use crate::cache::{CacheConfig, CacheError, CacheManager, CacheSizes};
use crate::constraint::{Constraint, TokenMask};
use crate::encoder::ImageEncoder;
use crate::metrics::{secs, EngineMetrics};
use crate::request::{
    FinishReason, ImageSource, OutputSink, Prompt, PromptImage, Request, RequestId, RequestOutput,
    TokenIds, TokenLogprobs,
};
use crate::runner::{ModelRunner, RunnerError, StepSeq};
use crate::sampler::{SampleRow, Sampler};
use crate::sampling_params::{ParamError, SamplingParams};
use crate::scheduler::{ScheduledSeq, Scheduler, SchedulerConfig, SchedulerOutput};
use crate::scripted::ScriptedOutput;
use crate::sequence::Sequence;
use crate::spec::{SpecMethod, SpeculativeConfig, Speculator, StepRecord, StepTiming};
use deepinfer_model::config::ModelConfig;
use deepinfer_model::v4::Model;
use deepinfer_model::vision::VisionTower;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub scheduler: SchedulerConfig,
    pub cache: CacheConfig,
    /// The `model_name` label of every metric (the served model name).
    pub model_name: String,
    /// Test hook, `None` in production: a sequence whose prompt the script matches generates
    /// exactly its turn's tokens, then EOS, whatever the model says (see [`Sampler::scripted`]).
    /// It lets end-to-end tests see tool calls and reasoning from a model with random weights
    /// through the whole serving path, and agents finish a tool round trip.
    pub forced_output: Option<ScriptedOutput>,
    /// Speculative decoding (`None`: off).
    pub speculative: Option<SpeculativeConfig>,
    /// The prefix cache's disk tier (`None`: memory only).
    pub prefix_disk: Option<DiskConfig>,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Runner(#[from] RunnerError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("invalid sampling parameter: {0}")]
    Param(#[from] ParamError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("prompt token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("the prompt has {prompt} tokens, but the maximum context length is {max_model_len} (prompt and output together)")]
    PromptTooLong { prompt: usize, max_model_len: usize },
    #[error("max_model_len {max_model_len} does not fit the cache, which holds at most {fits} tokens of one sequence; raise the cache budget or lower max_model_len")]
    CacheTooSmall { max_model_len: usize, fits: usize },
    #[error("invalid engine setting {field}: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    #[error("image {index}: {reason}")]
    BadImage { index: usize, reason: String },
    #[error("the engine has stopped")]
    Stopped,
    #[error("cannot start the compute threads: {0}")]
    ThreadPool(String),
}

mod masks;

enum Command {
    Add(
        Box<Request>,
        Option<Box<dyn Constraint>>,
        Box<dyn OutputSink>,
    ),
    Abort(RequestId),
    /// Finished by a rule the engine does not see (a stop string in the text).
    Stop(RequestId),
    /// Reply once nothing is waiting or running (tests, shutdown).
    Drain(Sender<()>),
    /// Empty the prefix cache (and its disk tier with `disk`); reply with the blocks freed.
    ResetPrefixCache {
        disk: bool,
        reply: Sender<usize>,
    },
    Shutdown,
}

/// A cheap, clonable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    next_id: Arc<AtomicU64>,
    vocab: usize,
    hidden: usize,
    max_model_len: usize,
    vision: Option<Arc<VisionTower>>,
    alive: Arc<AtomicBool>,
    pub metrics: Arc<EngineMetrics>,
}

impl EngineHandle {
    /// Queues a request; its outputs arrive on the returned channel, the last one carrying a
    /// finish reason. Invalid input is refused here, before it reaches the engine.
    pub fn add_request(
        &self,
        prompt_ids: Vec<u32>,
        params: SamplingParams,
    ) -> Result<(RequestId, Receiver<RequestOutput>), EngineError> {
        let (tx, rx) = mpsc::channel();
        let id = self.add_request_to(prompt_ids, params, Box::new(tx))?;
        Ok((id, rx))
    }

    /// Like [`Self::add_request`], with the deltas going to any sink (the server's async
    /// channels). If the sink is dropped without a final delta, the engine has stopped.
    pub fn add_request_to(
        &self,
        prompt_ids: Vec<u32>,
        params: SamplingParams,
        sink: Box<dyn OutputSink>,
    ) -> Result<RequestId, EngineError> {
        self.add_constrained_request_to(prompt_ids, params, None, sink)
    }

    /// Like [`Self::add_request_to`], with the output held to `constraint`'s grammar
    /// (structured outputs).
    pub fn add_constrained_request_to(
        &self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
        constraint: Option<Box<dyn Constraint>>,
        sink: Box<dyn OutputSink>,
    ) -> Result<RequestId, EngineError> {
        let arrival = Instant::now();
        let Prompt {
            ids: prompt_ids,
            images,
        } = prompt.into();
        if !self.is_running() {
            return Err(EngineError::Stopped);
        }
        if prompt_ids.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if let Some(&id) = prompt_ids.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(EngineError::TokenOutOfRange {
                id,
                vocab: self.vocab,
            });
        }
        if prompt_ids.len() >= self.max_model_len {
            return Err(EngineError::PromptTooLong {
                prompt: prompt_ids.len(),
                max_model_len: self.max_model_len,
            });
        }
        params.validate(self.vocab)?;
        self.check_images(prompt_ids.len(), &images)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.tx
            .send(Command::Add(
                Box::new(Request {
                    id,
                    prompt_ids,
                    params,
                    arrival,
                    images,
                }),
                constraint,
                sink,
            ))
            .map_err(|_| EngineError::Stopped)?;
        Ok(id)
    }

    /// Images in prompt order, each span inside the prompt and apart from the others, with
    /// one embedding of the model's width per position.
    fn check_images(&self, len: usize, images: &[PromptImage]) -> Result<(), EngineError> {
        let mut end = 0;
        for (i, im) in images.iter().enumerate() {
            let reason = if im.offset < end || im.offset + im.len > len {
                Some(format!(
                    "its span {}..{} overlaps the previous image's or leaves the {len}-token prompt",
                    im.offset,
                    im.offset + im.len
                ))
            } else {
                self.check_source(im)
            };
            if let Some(reason) = reason {
                return Err(EngineError::BadImage { index: i, reason });
            }
            end = im.offset + im.len;
        }
        Ok(())
    }

    /// Why `im`'s embeddings or pixels cannot fill its span, if they cannot.
    fn check_source(&self, im: &PromptImage) -> Option<String> {
        match (&im.source, &self.vision) {
            (ImageSource::Embeds(e), _) if e.len() != im.len * self.hidden => Some(format!(
                "{} embedding values for {} positions of width {}",
                e.len(),
                im.len,
                self.hidden
            )),
            (ImageSource::Embeds(_), _) => None,
            (ImageSource::Pixels(..), None) => {
                Some("the model has no vision tower to encode its pixels".into())
            }
            (ImageSource::Pixels(_, plan), Some(tower)) => {
                let n = tower.span(plan, im.offset).len();
                (n != im.len).then(|| format!("its plan makes {n} positions, not {}", im.len))
            }
        }
    }

    /// Stops a request; its stream ends with `FinishReason::Abort` and its cache is freed in
    /// the same step. Unknown or finished ids are ignored.
    pub fn abort(&self, id: RequestId) {
        let _ = self.tx.send(Command::Abort(id));
    }

    /// Ends a request the caller found finished by a rule the engine cannot see (a stop
    /// string in the detokenized text): its stream ends and its cache is freed as with
    /// [`Self::abort`], but metrics count it as `finished_reason="stop"`, not as an abort.
    /// Unknown or finished ids are ignored.
    pub fn stop(&self, id: RequestId) {
        let _ = self.tx.send(Command::Stop(id));
    }

    /// Blocks until every queued request has finished.
    pub fn drain(&self) -> Result<(), EngineError> {
        let (tx, rx) = mpsc::channel();
        self.tx
            .send(Command::Drain(tx))
            .map_err(|_| EngineError::Stopped)?;
        rx.recv().map_err(|_| EngineError::Stopped)
    }

    /// Empties the prefix cache of every prefix no running request extends, and with `disk`
    /// the disk tier; returns how many blocks memory freed.
    pub fn reset_prefix_cache(&self, disk: bool) -> Result<usize, EngineError> {
        let (reply, rx) = mpsc::channel();
        self.tx
            .send(Command::ResetPrefixCache { disk, reply })
            .map_err(|_| EngineError::Stopped)?;
        rx.recv().map_err(|_| EngineError::Stopped)
    }

    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }

    /// False once the engine thread has ended (shut down, or a model step failed).
    pub fn is_running(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The model's vision tower, shared: callers turn images into [`PromptImage`]s with it
    /// before they submit (`None`: the model takes text only).
    pub fn vision(&self) -> Option<&Arc<VisionTower>> {
        self.vision.as_ref()
    }

    /// Longest sequence (prompt + output) a request may reach.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }
}

/// Marks the engine stopped when the thread ends, however it ends (return, error, panic).
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The compute threads of a model, the calling thread being one of them: as the installed
/// placement seats them (`--threads`, `--cpu-affinity`, `--numa`), else one per core the
/// process may use. Run the forward passes inside it (`pool.install`): the parallel loops of
/// a step then start from a worker's own queue, with no cross-thread injection (which costs
/// a wake-up and, now and then, an allocation per call).
pub fn compute_pool() -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    use deepinfer_model::kernels::numa::{self, plan};
    match numa::installed() {
        Some(p) => numa::pool::build(p),
        None => {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            numa::pool::build(&plan::Plan::unplaced(n))
        }
    }
}

/// Starts the engine thread. The returned join handle yields the engine back when it stops
/// (so callers can inspect the pools).
pub fn start(
    model: Model,
    config: EngineConfig,
) -> Result<(EngineHandle, JoinHandle<Result<EngineCore, EngineError>>), EngineError> {
    let metrics = Arc::new(EngineMetrics::new(&config.model_name));
    let core = EngineCore::new(model, config, metrics.clone())?;
    let (tx, rx) = mpsc::channel();
    let alive = Arc::new(AtomicBool::new(true));
    let handle = EngineHandle {
        tx,
        next_id: Arc::new(AtomicU64::new(0)),
        vocab: core.vocab(),
        hidden: core.runner.model().config.hidden_size,
        max_model_len: core.cfg.max_model_len,
        vision: core.runner.model().vision.clone(),
        alive: alive.clone(),
        metrics,
    };
    let mut engine = EngineLoop {
        core,
        drains: Vec::new(),
    };
    let join = std::thread::Builder::new()
        .name("deepinfer-engine".into())
        .spawn(move || {
            let _alive = AliveGuard(alive);
            let result = match compute_pool() {
                Ok(pool) => pool.install(|| engine.run(rx)),
                Err(e) => Err(EngineError::ThreadPool(e.to_string())),
            };
            if let Err(e) = &result {
                tracing::error!("the engine stopped: {e}");
            }
            result.map(|()| engine.core)
        })
        .expect("spawn the engine thread");
    Ok((handle, join))
}

/// How long the engine thread waits before looking again when every running sequence is
/// paused for its reader (see [`crate::request::OutputSink::has_room`]).
const STALL_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// How often an idle engine thread looks after its housekeeping ([`EngineCore::idle`]).
const IDLE_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// The engine thread: commands in, steps while there is work.
struct EngineLoop {
    core: EngineCore,
    drains: Vec<Sender<()>>,
}

impl EngineLoop {
    fn run(&mut self, rx: Receiver<Command>) -> Result<(), EngineError> {
        loop {
            // Block only when idle; otherwise take whatever arrived and step.
            if !self.core.has_work() {
                for d in self.drains.drain(..) {
                    let _ = d.send(());
                }
                // Idle: now and then take in the disk tier's finished writes (its gauges,
                // its bound) while waiting.
                let cmd = loop {
                    match rx.recv_timeout(IDLE_POLL) {
                        Ok(cmd) => break cmd,
                        Err(mpsc::RecvTimeoutError::Timeout) => self.core.idle(),
                        Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
                    }
                };
                if !self.handle(cmd) {
                    return Ok(());
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            return Ok(());
                        }
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        if !self.core.has_work() {
                            return Ok(());
                        }
                        break;
                    }
                }
            }
            if self.core.has_work() {
                self.core.step()?;
                if self.core.stalled() {
                    // Every running sequence waits for its reader: wait for a command a
                    // moment instead of spinning, then look again.
                    match rx.recv_timeout(STALL_POLL) {
                        Ok(cmd) => {
                            if !self.handle(cmd) {
                                return Ok(());
                            }
                        }
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(STALL_POLL),
                    }
                }
            }
        }
    }

    /// Applies a command; false means shut down.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Add(req, constraint, out) => self.core.add_constrained(*req, constraint, out),
            Command::Abort(id) => self
                .core
                .finish(id, FinishReason::Abort, TokenIds::new(), None),
            Command::Stop(id) => self
                .core
                .finish(id, FinishReason::Stop, TokenIds::new(), None),
            Command::Drain(reply) => self.drains.push(reply),
            Command::ResetPrefixCache { disk, reply } => {
                let _ = reply.send(self.core.reset_prefix_cache(disk));
            }
            Command::Shutdown => {
                self.core.abort_all();
                return false;
            }
        }
        true
    }
}

/// Every piece of mutable serving state, stepped by one thread: sequences, scheduler, cache
/// pools, model runner, sampler, drafter. [`start`] runs one on its own thread; tests and
/// benchmarks may drive one directly.
pub struct EngineCore {
    runner: ModelRunner,
    cache: CacheManager,
    scheduler: Scheduler,
    seqs: HashMap<RequestId, Sequence>,
    sampler: Sampler,
    spec: Option<Speculator>,
    cfg: SchedulerConfig,
    eos: Vec<u32>,
    metrics: Arc<EngineMetrics>,
    /// This step's plan and what each scheduled sequence committed (reused buffers).
    plan: SchedulerOutput,
    records: Vec<StepRecord>,
    /// Seconds the drafter took to propose the drafts the next step verifies.
    draft_s: f64,
    /// This step's structured-output masks, per constrained sequence (see `masks.rs`).
    masks: HashMap<RequestId, Vec<TokenMask>>,
    /// The vision tower's queued work, when the model has one.
    encoder: Option<ImageEncoder>,
}

/// Refuses engine settings that cannot work, naming the field.
fn validate(config: &EngineConfig, model: &Model) -> Result<(), EngineError> {
    let s = &config.scheduler;
    let invalid = |field, reason: String| Err(EngineError::InvalidConfig { field, reason });
    if s.max_num_seqs == 0 {
        return invalid("max_num_seqs", "must be at least 1".into());
    }
    if s.max_num_batched_tokens == 0 {
        return invalid("max_num_batched_tokens", "must be at least 1".into());
    }
    if s.prefill_chunk == Some(0) {
        return invalid("prefill_chunk", "must be at least 1".into());
    }
    if s.max_model_len < 2 {
        return invalid(
            "max_model_len",
            "must leave room for a prompt token and an output token".into(),
        );
    }
    let vocab = model.config.vocab_size;
    if let Some(id) = config
        .forced_output
        .iter()
        .flat_map(ScriptedOutput::tokens)
        .find(|&id| id as usize >= vocab)
    {
        return invalid(
            "forced_output",
            format!("token id {id} is outside the vocabulary of {vocab}"),
        );
    }
    if let Some(spec) = &config.speculative {
        if spec.method == SpecMethod::Mtp && !model.has_mtp() {
            return invalid(
                "speculative_config",
                "method \"mtp\" needs the checkpoint's MTP block (mtp.0.*), and this one has none"
                    .into(),
            );
        }
        if spec.method == SpecMethod::Dspark {
            let Some(ds) = &model.dspark else {
                return invalid(
                    "speculative_config",
                    "method \"dspark\" needs a checkpoint with its DSpark drafter (dspark_* in \
                     config.json, mtp.0.main_proj.*), and this model has none"
                        .into(),
                );
            };
            if spec.num_speculative_tokens > ds.config.block_size {
                return invalid(
                    "speculative_config",
                    format!(
                        "num_speculative_tokens {} is more than the DSpark block of {}",
                        spec.num_speculative_tokens, ds.config.block_size
                    ),
                );
            }
        }
    }
    Ok(())
}

fn speculator(config: &EngineConfig) -> Option<Speculator> {
    let s = config.speculative.as_ref()?;
    Some(Speculator::new(s, config.scheduler.max_num_seqs))
}

/// The cache an engine with `config` builds for `model`. Rejected drafts are truncated away:
/// the rings keep that many extra rows; the MTP block keeps its own window ring after the
/// main layers, DSpark one context ring per stage.
fn cache_config(
    model: &ModelConfig,
    config: &EngineConfig,
    spec: Option<&Speculator>,
) -> CacheConfig {
    let mut cache = config.cache;
    if let Some(sp) = spec {
        cache.rollback_slack = cache.rollback_slack.max(sp.num_speculative_tokens());
        cache.draft_layers = cache.draft_layers.max(sp.draft_layers(model));
    }
    cache
}

/// The longest sequence (prompt + output) the cache of an engine with `config` holds for
/// `model`: what [`EngineCore::new`] checks `max_model_len` against. Computed without
/// allocating the cache, so a caller can pick a length before starting the engine.
pub fn max_model_len_that_fits(
    model: &ModelConfig,
    config: &EngineConfig,
) -> Result<usize, EngineError> {
    let cache = cache_config(model, config, speculator(config).as_ref());
    Ok(CacheManager::max_tokens_for(model, cache)?)
}

/// What the cache of an engine with `config` costs whatever its budget (one sequence's
/// state, the pools' least), so a caller can size the budget and `max_num_seqs` first.
pub fn cache_sizes(model: &ModelConfig, config: &EngineConfig) -> Result<CacheSizes, EngineError> {
    let cache = cache_config(model, config, speculator(config).as_ref());
    Ok(CacheManager::sizes_for(model, cache)?)
}

impl EngineCore {
    pub fn new(
        model: Model,
        config: EngineConfig,
        metrics: Arc<EngineMetrics>,
    ) -> Result<Self, EngineError> {
        validate(&config, &model)?;
        let spec = speculator(&config);
        let mut cache = CacheManager::new(
            &model.config,
            cache_config(&model.config, &config, spec.as_ref()),
        )?;
        if let Some(disk) = &config.prefix_disk {
            cache.attach_disk(&model.config, disk, Default::default())?;
        }
        let max_model_len = config.scheduler.max_model_len;
        let fits = cache.max_tokens_per_seq();
        if fits < max_model_len {
            return Err(EngineError::CacheTooSmall {
                max_model_len,
                fits,
            });
        }
        let mut model = model;
        model.limit_positions(max_model_len);
        // Resuming from a cached prefix is exact only if no row depends on its batch.
        model.set_batch_invariant(config.cache.prefix_caching);
        metrics.set_cache_usage(cache.pool_usage());
        let sampler = match config.forced_output {
            Some(script) => Sampler::scripted(script),
            None => Sampler::new(),
        };
        let whole_images = model.config.image_spans_see_themselves();
        Ok(Self {
            eos: model.config.eos_token_ids.clone(),
            encoder: model.vision.clone().map(ImageEncoder::new),
            runner: ModelRunner::new(model),
            cache,
            scheduler: Scheduler {
                whole_images,
                ..Scheduler::default()
            },
            seqs: HashMap::new(),
            sampler,
            spec,
            cfg: config.scheduler,
            metrics,
            plan: SchedulerOutput::default(),
            records: Vec::new(),
            draft_s: 0.0,
            masks: HashMap::new(),
        })
    }

    /// Gives the model back (benchmarks run several engines on one loaded model).
    pub fn into_model(self) -> deepinfer_model::v4::Model {
        self.runner.into_model()
    }

    pub fn vocab(&self) -> usize {
        self.runner.model().config.vocab_size
    }

    pub fn cache(&self) -> &CacheManager {
        &self.cache
    }

    /// Evicts every cached prefix no running request extends (vLLM's
    /// `/reset_prefix_cache`), and with `disk` the disk tier's entries; returns how many
    /// blocks went from memory.
    pub fn reset_prefix_cache(&mut self, disk: bool) -> usize {
        let n = self.cache.reset_prefix_cache(disk);
        self.update_gauges();
        n
    }

    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    /// Housekeeping while nothing runs: the disk tier's finished writes are taken in (its
    /// gauges and its bound), and the gauges brought up to date.
    pub fn idle(&mut self) {
        self.cache.poll_disk();
        self.update_gauges();
    }

    pub fn has_work(&self) -> bool {
        self.scheduler.has_work() || self.encoding()
    }

    /// Whether images wait for the tower.
    fn encoding(&self) -> bool {
        self.encoder.as_ref().is_some_and(ImageEncoder::has_work)
    }

    /// Whether the last step ran nothing although there is work: every running sequence
    /// waits for its reader to catch up.
    pub fn stalled(&self) -> bool {
        self.plan.scheduled.is_empty() && self.scheduler.has_work() && !self.encoding()
    }

    /// Queues an already validated request (see [`EngineHandle::add_request_to`]).
    pub fn add_request(&mut self, req: Request, out: Box<dyn OutputSink>) {
        self.add_constrained(req, None, out);
    }

    /// Queues a request whose output follows `constraint` (structured outputs).
    pub fn add_constrained(
        &mut self,
        req: Request,
        constraint: Option<Box<dyn Constraint>>,
        out: Box<dyn OutputSink>,
    ) {
        let id = req.id;
        // While it waits, what it will resume from is read ahead from the disk tier.
        let read_ahead = self
            .cache
            .prefetch(req.prompt_ids.len(), &|i| req.key_token(i));
        let mut seq = Sequence::new(req, out);
        seq.read_ahead = read_ahead;
        seq.constraint = constraint;
        let mut encoding = false;
        for im in &seq.request.images {
            if let ImageSource::Pixels(pixels, plan) = &im.source {
                let encoder = self
                    .encoder
                    .as_mut()
                    .expect("the handle refuses pixels without a tower");
                encoder.submit(id, im.digest, pixels, *plan);
                encoding = true;
            }
        }
        self.seqs.insert(id, seq);
        // A request with pixels joins the scheduler once the tower has encoded them.
        if !encoding {
            self.scheduler.add(id);
        }
    }

    /// Runs this step's share of the vision tower's work (see `crate::encoder`); a request
    /// whose last image it finished joins the scheduler.
    fn encode_images(&mut self) {
        let Some(encoder) = self.encoder.as_mut().filter(|e| e.has_work()) else {
            return;
        };
        for done in encoder.step(self.cfg.max_num_batched_tokens) {
            let tower = encoder.tower();
            for id in done.waiters {
                let Some(seq) = self.seqs.get_mut(&id) else {
                    continue;
                };
                for im in &mut seq.request.images {
                    if let (ImageSource::Pixels(_, plan), true) =
                        (&im.source, im.digest == done.digest)
                    {
                        let slots = tower.span(plan, im.offset);
                        let embeds = tower.span_embeddings(&slots, &done.image);
                        im.source = ImageSource::Embeds(embeds.into());
                    }
                }
                if seq.request.images.iter().all(|im| im.embeds().is_some()) {
                    self.scheduler.add(id);
                }
            }
        }
    }

    /// Ends every request as aborted (shutdown).
    pub fn abort_all(&mut self) {
        let ids: Vec<RequestId> = self.seqs.keys().copied().collect();
        for id in ids {
            self.finish(id, FinishReason::Abort, TokenIds::new(), None);
        }
    }

    /// One engine step: schedule, run the target model, sample or verify, send the deltas,
    /// then let the drafter propose the next step's drafts.
    pub fn step(&mut self) -> Result<(), EngineError> {
        self.encode_images();
        self.scheduler
            .schedule(&self.cfg, &mut self.seqs, &mut self.cache, &mut self.plan)?;
        self.metrics
            .num_preemptions
            .inc_by(self.plan.preempted.len() as u64);
        self.metrics
            .prefix_cache_queries
            .inc_by(self.plan.prefix_queries as u64);
        self.metrics
            .prefix_cache_hits
            .inc_by(self.plan.prefix_hits as u64);
        if self.plan.scheduled.is_empty() {
            return Ok(());
        }
        // Before any output of this step is sent: a client that sees its first token and
        // then reads /metrics must find its request counted as running.
        self.update_gauges();
        self.mark_scheduled();
        let t0 = Instant::now();
        self.forward_with_masks()?;
        let target_s = t0.elapsed().as_secs_f64();
        self.metrics
            .iteration_tokens
            .observe(self.plan.num_tokens() as f64);
        self.commit()?;
        self.spec_observe(target_s);
        self.draft()?;
        self.update_gauges();
        Ok(())
    }

    fn mark_scheduled(&mut self) {
        let now = Instant::now();
        for s in &self.plan.scheduled {
            let seq = self.seqs.get_mut(&s.id).expect("scheduled");
            if seq.first_scheduled.is_none() {
                seq.first_scheduled = Some(now);
                self.metrics
                    .requests
                    .request_queue_time
                    .observe(secs(now - seq.request.arrival));
            }
        }
    }

    /// Runs the step's batch: each scheduled sequence's known tokens, then its drafts
    /// ([`ModelRunner::run_step`] builds it), after opening the prefix cache's capture of
    /// the positions it computes.
    fn forward(&mut self) -> Result<(), EngineError> {
        for s in &self.plan.scheduled {
            let seq = &self.seqs[&s.id];
            let cache = seq.cache.expect("scheduled sequences hold a cache");
            let start = seq.num_computed;
            self.cache
                .begin_capture(cache, start, start + s.num_tokens)?;
        }
        let seqs = &self.seqs;
        let work = self.plan.scheduled.iter().map(|s| {
            let seq = &seqs[&s.id];
            let (start, known) = (seq.num_computed, s.num_tokens - s.num_draft);
            let back = start.saturating_sub(deepinfer_model::batch::LOOKBACK)..start;
            StepSeq {
                seq: seq.cache.expect("scheduled sequences hold a cache"),
                start,
                tokens: (start..start + known)
                    .map(|i| seq.token(i))
                    .chain(seq.spec.draft_ids[..s.num_draft].iter().copied()),
                num_logits: s.num_logits,
                history: back.map(|i| seq.token(i)),
                images: &seq.request.images,
            }
        });
        let keep_hidden = self.spec.as_ref().is_some_and(Speculator::needs_hidden);
        self.runner.run_step(&mut self.cache, work, keep_hidden)?;
        Ok(())
    }

    /// Advances every scheduled sequence past the tokens it computed, samples (or
    /// verifies drafts) where the step produced logits, sends the deltas, and records what
    /// each sequence committed for the drafter.
    fn commit(&mut self) -> Result<(), EngineError> {
        self.records.clear();
        let (mut row, mut logits_row) = (0, 0);
        for i in 0..self.plan.scheduled.len() {
            let s = self.plan.scheduled[i];
            let seq = self.seqs.get_mut(&s.id).expect("scheduled");
            let start = seq.num_computed;
            seq.num_computed += s.num_tokens - s.num_draft;
            let accepted = if s.num_logits > 0 {
                self.emit(s, logits_row)?
            } else {
                0
            };
            // Blocks this step completed go to the prefix cache (a sequence that finished
            // in `emit` did so as it was freed).
            if let Some(seq) = self.seqs.get(&s.id) {
                let cache = seq.cache.expect("scheduled sequences hold a cache");
                let token = |i: usize| seq.key_token(i);
                self.cache.commit_prefix(cache, seq.num_computed, &token)?;
            }
            self.records.push(StepRecord {
                id: s.id,
                row,
                start,
                committed: s.num_tokens - s.num_draft + accepted,
                drafted: s.num_draft,
                accepted,
            });
            row += s.num_tokens;
            logits_row += s.num_logits;
        }
        Ok(())
    }

    /// Samples a sequence's new tokens from its logits rows (verifying its drafts first, if
    /// any), rolls rejected draft rows back, and sends the delta or finishes the request.
    /// Returns the drafts accepted.
    fn emit(&mut self, s: ScheduledSeq, first_row: usize) -> Result<usize, EngineError> {
        let logits = self.runner.logits();
        let masks = self.masks.get(&s.id);
        let seq = self.seqs.get_mut(&s.id).expect("scheduled");
        let mut new_tokens = TokenIds::new();
        let mut logprobs = seq.request.params.logprobs.map(|_| Vec::new());
        let (mut accepted, mut finish) = (0, None);
        for j in 0..s.num_logits {
            let draft = seq
                .spec
                .draft_ids
                .get(j)
                .copied()
                .filter(|_| j < s.num_draft);
            let mut row = SampleRow {
                params: &seq.request.params,
                prompt_ids: &seq.request.prompt_ids,
                output_ids: &seq.output_ids,
                eos_ids: &self.eos,
                rng: &mut seq.rng,
                mask: masks.and_then(|m| m.get(j)),
            };
            let raw = logits.row(first_row + j);
            let (sample, hit) = match draft {
                Some(d) => self.sampler.verify_row(raw, &mut row, d),
                None => (self.sampler.sample_row(raw, &mut row), false),
            };
            seq.output_ids.push(sample.token);
            new_tokens.push(sample.token);
            if let Some(lp) = &mut logprobs {
                lp.push(TokenLogprobs {
                    token: sample.token,
                    logprob: sample.logprob,
                    top: sample.top_logprobs,
                });
            }
            accepted += usize::from(hit);
            finish = seq.finish_reason(&self.eos, self.cfg.max_model_len);
            if finish.is_some() || !hit {
                break;
            }
        }
        if let Some(c) = &mut seq.constraint {
            c.accept(&new_tokens);
        }
        if s.num_draft > 0 {
            self.metrics.spec_decode_round(s.num_draft, accepted);
            seq.num_computed += accepted;
            if finish.is_none() && accepted < s.num_draft {
                let cache = seq.cache.expect("scheduled sequences hold a cache");
                self.cache.truncate(cache, seq.num_computed)?;
            }
        }
        self.record_tokens(s.id, new_tokens.len());
        let seq = self.seqs.get_mut(&s.id).expect("scheduled");
        match finish {
            Some(reason) => self.finish(s.id, reason, new_tokens, logprobs),
            None => {
                let out = RequestOutput {
                    request_id: s.id,
                    new_token_ids: new_tokens,
                    logprobs,
                    finish_reason: None,
                    num_prompt_tokens: seq.request.prompt_ids.len(),
                    num_cached_tokens: seq.num_cached_tokens.unwrap_or(0),
                };
                if !seq.out.send(out) {
                    // The client went away: stop spending compute on it.
                    self.finish(s.id, FinishReason::Abort, TokenIds::new(), None);
                }
            }
        }
        Ok(accepted)
    }

    /// Token counters and latencies for `n` new tokens of a request (TTFT at its first,
    /// one inter-token latency per delta, as vLLM counts them).
    fn record_tokens(&mut self, id: RequestId, n: usize) {
        let now = Instant::now();
        let seq = self.seqs.get_mut(&id).expect("scheduled");
        self.metrics.generation_tokens.inc_by(n as u64);
        match seq.last_token_at {
            None => {
                seq.first_token_at = Some(now);
                self.metrics
                    .requests
                    .time_to_first_token
                    .observe(secs(now - seq.request.arrival));
                self.metrics
                    .prompt_tokens
                    .inc_by(seq.request.prompt_ids.len() as u64);
            }
            Some(prev) => self
                .metrics
                .requests
                .inter_token_latency
                .observe(secs(now - prev)),
        }
        seq.last_token_at = Some(now);
    }

    /// Lets the drafter propose the next step's drafts (timed for the policy).
    fn draft(&mut self) -> Result<(), EngineError> {
        let Some(spec) = &mut self.spec else {
            return Ok(());
        };
        let t0 = Instant::now();
        spec.propose(
            &self.records,
            &mut self.seqs,
            &mut self.runner,
            &mut self.cache,
            self.cfg.max_model_len,
        )?;
        self.draft_s = t0.elapsed().as_secs_f64();
        Ok(())
    }

    fn spec_observe(&mut self, target_s: f64) {
        let Some(spec) = &mut self.spec else {
            return;
        };
        let pure_decode = self
            .plan
            .scheduled
            .iter()
            .all(|s| s.num_tokens - s.num_draft == 1 && s.num_logits > 0);
        // `draft_s` still holds the time spent drafting what this step verified.
        let timing = StepTiming {
            target_s,
            draft_s: self.draft_s,
            pure_decode,
        };
        spec.observe(&timing, &self.records, &mut self.seqs);
    }

    fn update_gauges(&self) {
        // Waiting: queued, and waiting for the tower (outside the scheduler until encoded).
        let running = self.scheduler.running.len();
        let waiting = self.seqs.len() - running;
        self.metrics.num_requests_running.set(running as i64);
        self.metrics.num_requests_waiting.set(waiting as i64);
        self.metrics.set_cache_usage(self.cache.pool_usage());
        if let Some(d) = self.cache.disk_stats() {
            self.metrics.set_disk(d);
        }
    }

    /// Ends a request: last delta with the reason, cache freed now. Unknown ids are ignored.
    pub fn finish(
        &mut self,
        id: RequestId,
        reason: FinishReason,
        new_token_ids: TokenIds,
        logprobs: Option<Vec<TokenLogprobs>>,
    ) {
        let Some(mut seq) = self.seqs.remove(&id) else {
            return;
        };
        self.scheduler.remove(id);
        if let Some(encoder) = &mut self.encoder {
            encoder.cancel(id);
        }
        if let Some(cache) = seq.cache {
            // Its completed blocks stay for later requests (a chat's next turn).
            let token = |i: usize| seq.key_token(i);
            if let Err(e) = self.cache.commit_prefix(cache, seq.num_computed, &token) {
                tracing::error!(request = id, "caching its prefix failed: {e}");
            }
            if let Err(e) = self.cache.free_seq(cache) {
                tracing::error!(request = id, "freeing the cache failed: {e}");
            }
        }
        let _ = seq.out.send(RequestOutput {
            request_id: id,
            new_token_ids,
            logprobs,
            finish_reason: Some(reason),
            num_prompt_tokens: seq.request.prompt_ids.len(),
            num_cached_tokens: seq.num_cached_tokens.unwrap_or(0),
        });
        self.record_finished(&seq, reason);
        self.update_gauges();
    }

    fn record_finished(&self, seq: &Sequence, reason: FinishReason) {
        self.metrics.request_finished(reason);
        let m = &self.metrics.requests;
        m.request_prompt_tokens
            .observe(seq.request.prompt_ids.len() as f64);
        m.request_generation_tokens
            .observe(seq.output_ids.len() as f64);
        if let Some(last) = seq.last_token_at {
            m.e2e_request_latency
                .observe(secs(last - seq.request.arrival));
        }
        if let (Some(first), Some(last)) = (seq.first_token_at, seq.last_token_at) {
            if seq.output_ids.len() > 1 {
                let decode = secs(last - first) / (seq.output_ids.len() - 1) as f64;
                m.request_time_per_output_token.observe(decode);
            }
        }
    }
}
