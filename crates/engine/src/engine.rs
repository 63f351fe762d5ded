//! The engine: one thread owns every piece of mutable serving state (sequences, scheduler,
//! model runner, cache pools, sampler); callers talk to it through channels only, so the hot
//! path takes no locks.

use crate::cache::CacheConfig;
use crate::metrics::{secs, EngineMetrics};
use crate::request::{FinishReason, OutputSink, Request, RequestId, RequestOutput, TokenLogprobs};
use crate::runner::{ModelRunner, RunnerError, SeqWork};
use crate::sampler::{SampleRow, Sampler};
use crate::sampling_params::{ParamError, SamplingParams};
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::sequence::Sequence;
use deepinfer_model::v4::Model;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// Test hook, `None` in production: every sequence generates exactly these tokens, then
    /// EOS, whatever the model says (see [`Sampler::scripted`]). It lets end-to-end tests see
    /// tool calls and reasoning from a model with random weights through the whole serving
    /// path.
    pub forced_output: Option<Vec<u32>>,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Runner(#[from] RunnerError),
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
    #[error("the engine has stopped")]
    Stopped,
    #[error("cannot start the compute threads: {0}")]
    ThreadPool(String),
}

/// Counters the engine thread updates and anyone may read.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub steps: AtomicU64,
    pub batched_tokens: AtomicU64,
    pub preemptions: AtomicU64,
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    pub finished: AtomicU64,
}

enum Command {
    Add(Request, Box<dyn OutputSink>),
    Abort(RequestId),
    /// Finished by a rule the engine does not see (a stop string in the text).
    Stop(RequestId),
    /// Reply once nothing is waiting or running (tests, shutdown).
    Drain(Sender<()>),
    Shutdown,
}

/// A cheap, clonable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    next_id: Arc<AtomicU64>,
    vocab: usize,
    max_model_len: usize,
    alive: Arc<AtomicBool>,
    pub stats: Arc<EngineStats>,
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
        let arrival = Instant::now();
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
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.tx
            .send(Command::Add(
                Request {
                    id,
                    prompt_ids,
                    params,
                    arrival,
                },
                sink,
            ))
            .map_err(|_| EngineError::Stopped)?;
        Ok(id)
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

/// Starts the engine thread. The returned join handle yields the runner back when the
/// engine stops (so callers can inspect the pools).
/// The compute threads of a model: one per core, the calling thread being one of them. Run
/// the forward passes inside it (`pool.install`): the parallel loops of a step then start
/// from a worker's own queue, with no cross-thread injection (which costs a wake-up and,
/// now and then, an allocation per call).
pub fn compute_pool() -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("deepinfer-compute-{i}"))
        .use_current_thread()
        .build()
}

pub fn start(
    model: Model,
    config: EngineConfig,
) -> Result<(EngineHandle, JoinHandle<Result<ModelRunner, EngineError>>), EngineError> {
    let s = &config.scheduler;
    let invalid = |field, reason: &str| {
        Err(EngineError::InvalidConfig {
            field,
            reason: reason.into(),
        })
    };
    if s.max_num_seqs == 0 {
        return invalid("max_num_seqs", "must be at least 1");
    }
    if s.max_num_batched_tokens == 0 {
        return invalid("max_num_batched_tokens", "must be at least 1");
    }
    if s.prefill_chunk == Some(0) {
        return invalid("prefill_chunk", "must be at least 1");
    }
    if s.max_model_len < 2 {
        return invalid(
            "max_model_len",
            "must leave room for a prompt token and an output token",
        );
    }
    let vocab = model.config.vocab_size;
    let eos = model.config.eos_token_ids.clone();
    if let Some(&id) = config
        .forced_output
        .iter()
        .flatten()
        .find(|&&id| id as usize >= vocab)
    {
        return Err(EngineError::InvalidConfig {
            field: "forced_output",
            reason: format!("token id {id} is outside the vocabulary of {vocab}"),
        });
    }
    let sampler = match config.forced_output {
        Some(script) => Sampler::scripted(script),
        None => Sampler::new(),
    };
    let runner = ModelRunner::new(model, config.cache)?;
    let max_model_len = config.scheduler.max_model_len;
    let fits = runner.cache().max_tokens_per_seq();
    if fits < max_model_len {
        return Err(EngineError::CacheTooSmall {
            max_model_len,
            fits,
        });
    }
    let (tx, rx) = mpsc::channel();
    let stats = Arc::new(EngineStats::default());
    let metrics = Arc::new(EngineMetrics::new(&config.model_name));
    metrics.set_cache_usage(&runner.cache().usage());
    let alive = Arc::new(AtomicBool::new(true));
    let handle = EngineHandle {
        tx,
        next_id: Arc::new(AtomicU64::new(0)),
        vocab,
        max_model_len,
        alive: alive.clone(),
        stats: stats.clone(),
        metrics: metrics.clone(),
    };
    let mut core = EngineCore {
        runner,
        scheduler: Scheduler::default(),
        seqs: HashMap::new(),
        sampler,
        cfg: config.scheduler,
        eos,
        stats,
        metrics,
        drains: Vec::new(),
    };
    let join = std::thread::Builder::new()
        .name("deepinfer-engine".into())
        .spawn(move || {
            let _alive = AliveGuard(alive);
            let result = match compute_pool() {
                Ok(pool) => pool.install(|| core.run(rx)),
                Err(e) => Err(EngineError::ThreadPool(e.to_string())),
            };
            if let Err(e) = &result {
                tracing::error!("the engine stopped: {e}");
            }
            result.map(|()| core.runner)
        })
        .expect("spawn the engine thread");
    Ok((handle, join))
}

struct EngineCore {
    runner: ModelRunner,
    scheduler: Scheduler,
    seqs: HashMap<RequestId, Sequence>,
    sampler: Sampler,
    cfg: SchedulerConfig,
    eos: Vec<u32>,
    stats: Arc<EngineStats>,
    metrics: Arc<EngineMetrics>,
    drains: Vec<Sender<()>>,
}

impl EngineCore {
    fn run(&mut self, rx: Receiver<Command>) -> Result<(), EngineError> {
        loop {
            // Block only when idle; otherwise take whatever arrived and step.
            if !self.scheduler.has_work() {
                for d in self.drains.drain(..) {
                    let _ = d.send(());
                }
                match rx.recv() {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            return Ok(());
                        }
                    }
                    Err(_) => return Ok(()),
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
                        if !self.scheduler.has_work() {
                            return Ok(());
                        }
                        break;
                    }
                }
            }
            if self.scheduler.has_work() {
                self.step()?;
            }
        }
    }

    /// Applies a command; false means shut down.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Add(req, out) => {
                let id = req.id;
                self.seqs.insert(id, Sequence::new(req, out));
                self.scheduler.add(id);
            }
            Command::Abort(id) => self.finish(id, FinishReason::Abort, Vec::new(), None),
            Command::Stop(id) => self.finish(id, FinishReason::Stop, Vec::new(), None),
            Command::Drain(reply) => self.drains.push(reply),
            Command::Shutdown => {
                let ids: Vec<RequestId> = self.seqs.keys().copied().collect();
                for id in ids {
                    self.finish(id, FinishReason::Abort, Vec::new(), None);
                }
                return false;
            }
        }
        true
    }

    fn step(&mut self) -> Result<(), EngineError> {
        let sched = self
            .scheduler
            .schedule(&self.cfg, &mut self.seqs, &mut self.runner)?;
        self.stats
            .preemptions
            .fetch_add(sched.preempted.len() as u64, Ordering::Relaxed);
        self.metrics
            .num_preemptions
            .inc_by(sched.preempted.len() as u64);
        if sched.scheduled.is_empty() {
            return Ok(());
        }
        // Before any output of this step is sent: a client that sees its first token and
        // then reads /metrics must find its request counted as running.
        self.update_gauges();
        let now = Instant::now();
        for &(id, _) in &sched.scheduled {
            let s = self.seqs.get_mut(&id).expect("scheduled");
            if s.first_scheduled.is_none() {
                s.first_scheduled = Some(now);
                self.metrics
                    .request_queue_time
                    .observe(secs(now - s.request.arrival));
            }
        }
        let tokens: Vec<Vec<u32>> = sched
            .scheduled
            .iter()
            .map(|&(id, n)| {
                let s = &self.seqs[&id];
                (s.num_computed..s.num_computed + n)
                    .map(|i| s.token(i))
                    .collect()
            })
            .collect();
        let work: Vec<SeqWork<'_>> = sched
            .scheduled
            .iter()
            .zip(&tokens)
            .map(|(&(id, _), t)| SeqWork {
                seq: self.seqs[&id]
                    .cache
                    .expect("scheduled sequences hold a cache"),
                tokens: t,
                all_logits: false,
            })
            .collect();
        let logits = self.runner.step(&work)?;
        let n_tok: usize = tokens.iter().map(|t| t.len()).sum();
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        self.stats
            .batched_tokens
            .fetch_add(n_tok as u64, Ordering::Relaxed);

        // Rows whose sequence now has every token computed get a new token.
        let mut rows = Vec::new();
        for (r, &(id, n)) in sched.scheduled.iter().enumerate() {
            let s = self.seqs.get_mut(&id).expect("scheduled");
            s.num_computed += n;
            if s.num_computed == s.num_tokens() {
                rows.push((r, id));
            }
        }
        let vocab = logits.vocab;
        let mut picked = Vec::with_capacity(rows.len() * vocab);
        for &(r, _) in &rows {
            picked.extend_from_slice(logits.row(r));
        }
        let samples = {
            let eos = &self.eos;
            let mut seq_refs: Vec<&mut Sequence> = Vec::with_capacity(rows.len());
            // Disjoint mutable borrows of the sampled sequences, in row order.
            let mut by_id: HashMap<RequestId, &mut Sequence> =
                self.seqs.iter_mut().map(|(k, v)| (*k, v)).collect();
            for &(_, id) in &rows {
                seq_refs.push(by_id.remove(&id).expect("distinct"));
            }
            let mut srows: Vec<SampleRow<'_>> = seq_refs
                .iter_mut()
                .map(|s| {
                    let s: &mut Sequence = s;
                    SampleRow {
                        params: &s.request.params,
                        prompt_ids: &s.request.prompt_ids,
                        output_ids: &s.output_ids,
                        eos_ids: eos,
                        rng: &mut s.rng,
                    }
                })
                .collect();
            self.sampler.sample(&picked, vocab, &mut srows)
        };
        let now = Instant::now();
        for (&(_, id), sample) in rows.iter().zip(samples) {
            let s = self.seqs.get_mut(&id).expect("sampled");
            s.output_ids.push(sample.token);
            self.metrics.generation_tokens.inc();
            match s.last_token_at {
                None => {
                    s.first_token_at = Some(now);
                    self.metrics
                        .time_to_first_token
                        .observe(secs(now - s.request.arrival));
                    self.metrics
                        .prompt_tokens
                        .inc_by(s.request.prompt_ids.len() as u64);
                }
                Some(prev) => self.metrics.inter_token_latency.observe(secs(now - prev)),
            }
            s.last_token_at = Some(now);
            let logprobs = s.request.params.logprobs.map(|_| {
                vec![TokenLogprobs {
                    token: sample.token,
                    logprob: sample.logprob,
                    top: sample.top_logprobs,
                }]
            });
            match s.finish_reason(&self.eos, self.cfg.max_model_len) {
                Some(reason) => self.finish(id, reason, vec![sample.token], logprobs),
                None => {
                    let out = RequestOutput {
                        request_id: id,
                        new_token_ids: vec![sample.token],
                        logprobs,
                        finish_reason: None,
                        num_prompt_tokens: s.request.prompt_ids.len(),
                    };
                    if !s.out.send(out) {
                        // The client went away: stop spending compute on it.
                        self.finish(id, FinishReason::Abort, Vec::new(), None);
                    }
                }
            }
        }
        self.update_gauges();
        Ok(())
    }

    fn update_gauges(&self) {
        let (running, waiting) = (self.scheduler.running.len(), self.scheduler.waiting.len());
        self.stats.running.store(running, Ordering::Relaxed);
        self.stats.waiting.store(waiting, Ordering::Relaxed);
        self.metrics.num_requests_running.set(running as i64);
        self.metrics.num_requests_waiting.set(waiting as i64);
        self.metrics.set_cache_usage(&self.runner.cache().usage());
    }

    /// Ends a request: last delta with the reason, cache freed now.
    fn finish(
        &mut self,
        id: RequestId,
        reason: FinishReason,
        new_token_ids: Vec<u32>,
        logprobs: Option<Vec<TokenLogprobs>>,
    ) {
        let Some(mut seq) = self.seqs.remove(&id) else {
            return;
        };
        self.scheduler.remove(id);
        if let Some(cache) = seq.cache {
            if let Err(e) = self.runner.free(cache) {
                tracing::error!(request = id, "freeing the cache failed: {e}");
            }
        }
        let _ = seq.out.send(RequestOutput {
            request_id: id,
            new_token_ids,
            logprobs,
            finish_reason: Some(reason),
            num_prompt_tokens: seq.request.prompt_ids.len(),
        });
        self.stats.finished.fetch_add(1, Ordering::Relaxed);
        self.record_finished(&seq, reason);
        self.update_gauges();
    }

    fn record_finished(&self, seq: &Sequence, reason: FinishReason) {
        let m = &self.metrics;
        m.request_finished(reason);
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
