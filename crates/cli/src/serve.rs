//! `deepinfer serve`: the OpenAI-compatible server. Without `--model` it serves a small
//! synthetic model with the real tokenizer (written once into the cache directory), so the
//! first command on a fresh machine works without downloading anything.

use crate::chat_format_args::ChatFormatArgs;
use crate::engine_args::EngineArgs;
use crate::script_args::ScriptArgs;
use anyhow::{Context, Result};
use clap::Args;
use deepinfer_engine::engine;
use deepinfer_model::kernels::numa;
use deepinfer_model::synth::{preset, write_checkpoint};
use deepinfer_model::v4::Model;
use deepinfer_server::tokenizer::Tokenizer;
use deepinfer_server::{AppState, ServeConfig};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The default model: the `tiny` preset at seed 0. Bump the suffix when the preset or the
/// writer changes, so an old cached copy is not served as the new one.
const DEFAULT_MODEL: &str = "tiny-seed0-v2";
pub(crate) const DEFAULT_MODEL_NAME: &str = "deepinfer-tiny";

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Checkpoint directory (safetensors + config.json + tokenizer.json) or a Hugging Face
    /// repo id (org/name: from the local hub cache, else downloaded into it). Default: a small
    /// synthetic model with the real tokenizer, built on first use in the cache directory.
    #[arg(long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    chat_format: ChatFormatArgs,
    /// Address to bind; loopback unless told otherwise.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to bind (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on /v1 routes.
    #[arg(long)]
    api_key: Option<String>,
    /// Name clients put in `model` (default: the --model path as given, as vLLM does).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Most generations queued or running; beyond it requests get 503.
    #[arg(long, default_value_t = 1024)]
    max_pending_requests: usize,
    /// Largest request body accepted, in MiB (larger ones get 413, a declared length before
    /// the body is read). At most four such bodies are in hand at once (then 503).
    #[arg(long, default_value_t = 32)]
    max_request_body_mib: usize,
    /// Most client connections open at once; more wait in the listen backlog. Capped below
    /// the process's open-file limit.
    #[arg(long, default_value_t = 4096)]
    max_connections: usize,
    /// A client must send a request's headers within this (an idle keep-alive connection
    /// is closed after it too).
    #[arg(long, default_value_t = 10)]
    header_read_timeout_secs: u64,
    /// A client must send a request's body within this (else 408).
    #[arg(long, default_value_t = 60)]
    body_read_timeout_secs: u64,
    /// A client that accepts no response bytes for this long is disconnected and its
    /// request aborted (until then a stream it does not read is paused, not buffered).
    #[arg(long, default_value_t = 60)]
    write_timeout_secs: u64,
    /// On Ctrl-C (or SIGTERM), how long in-flight requests get to finish before they are
    /// aborted and the process exits; a second Ctrl-C aborts them at once.
    #[arg(long, default_value_t = 30)]
    shutdown_timeout_secs: u64,
    /// Memory for stored Responses API answers (`store: true`, what `previous_response_id`
    /// and `GET /v1/responses/{id}` read), in MiB; the oldest are dropped first. 0 stores
    /// none.
    #[arg(long, default_value_t = 64)]
    responses_store_mib: usize,
    #[command(flatten)]
    script: ScriptArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// `$DEEPINFER_CACHE_DIR`, else `$XDG_CACHE_HOME/deepinfer`, else `~/.cache/deepinfer`.
fn cache_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("DEEPINFER_CACHE_DIR") {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(d).join("deepinfer"));
    }
    let home = std::env::var_os("HOME")
        .context("cannot find a cache directory: set DEEPINFER_CACHE_DIR or HOME")?;
    Ok(PathBuf::from(home).join(".cache/deepinfer"))
}

/// The default model's directory, written first if missing. It is built in a scratch
/// directory and renamed into place, so an interrupted build never leaves a half model.
pub(crate) fn default_model() -> Result<PathBuf> {
    let dir = cache_dir()?.join("models").join(DEFAULT_MODEL);
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    let parent = dir.parent().expect("has a parent");
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    let tmp = parent.join(format!(".{DEFAULT_MODEL}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes}")?
            .progress_chars("=> "),
    );
    bar.set_message("building the default model (once)");
    write_checkpoint(&preset("tiny")?, &tmp, 0, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .with_context(|| format!("writing the default model to {}", tmp.display()))?;
    bar.finish_and_clear();
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => {}
        // Another process won the race; use its copy.
        Err(_) if dir.join("config.json").is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot move the default model to {}", dir.display()))
        }
    }
    Ok(dir)
}

/// Loads the weights with a bar that moves layer by layer, then for the embedding and head
/// (a real checkpoint takes minutes; a spinner would not say whether it is moving).
pub(crate) fn load_model(dir: &Path, engine: &EngineArgs) -> Result<Model> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} {elapsed}")?
            .progress_chars("=> "),
    );
    bar.set_message(format!("loading {}", dir.display()));
    bar.enable_steady_tick(Duration::from_millis(200));
    let model = engine.load_model(dir, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    model
}

pub fn run(args: ServeArgs) -> Result<()> {
    let (dir, default_name) = match &args.model {
        Some(d) => (args.engine.load.resolve(d)?, d.display().to_string()),
        None => (default_model()?, DEFAULT_MODEL_NAME.to_string()),
    };
    let name = args.served_model_name.clone().unwrap_or(default_name);
    let tokenizer = Tokenizer::from_dir(&dir)?;
    let start = Instant::now();
    let model = load_model(&dir, &args.engine)?;
    let format = args.chat_format.resolve(&dir, &model.config, &tokenizer)?;
    warn_larger_vocab(&tokenizer, model.config.vocab_size);
    let mut config = args.engine.config(&model.config, &name)?;
    args.script.apply(&mut config, &tokenizer)?;
    let (handle, join) = engine::start(model, config)?;
    eprintln!(
        "loaded {} in {:.1} s",
        dir.display(),
        start.elapsed().as_secs_f64()
    );
    let state = Arc::new(
        AppState::new(
            handle.clone(),
            tokenizer,
            name.clone(),
            dir.display().to_string(),
            args.api_key.clone(),
            args.max_pending_requests,
        )
        .with_response_store(args.responses_store_mib.saturating_mul(1 << 20))
        .with_chat_format(format),
    );
    // On the cores no compute thread is pinned to, when there are such (--cpu-affinity
    // naming fewer than all, or --threads below it): requests are parsed and tokenised there
    // without taking a core from the forward passes.
    let spare = numa::installed().map_or(Vec::new(), |p| p.spare.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(move || {
            if !spare.is_empty() {
                let _ = numa::pool::pin(&spare);
            }
        })
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        eprintln!("serving `{name}` on http://{addr} (Ctrl-C to stop)");
        let config = ServeConfig {
            max_body_bytes: args.max_request_body_mib << 20,
            body_budget_bytes: (args.max_request_body_mib << 20).saturating_mul(4),
            body_read_timeout: Duration::from_secs(args.body_read_timeout_secs),
            header_read_timeout: Duration::from_secs(args.header_read_timeout_secs),
            write_timeout: Duration::from_secs(args.write_timeout_secs),
            max_connections: connection_cap(args.max_connections),
            drain_timeout: Duration::from_secs(args.shutdown_timeout_secs),
        };
        // Split over ranks, a failed engine also starts the shutdown (the first signal only;
        // the second is the operator's, to cut the drain short).
        let watch = crate::ranks::world().is_some().then(|| handle.clone());
        let first = std::sync::atomic::AtomicBool::new(true);
        let shutdown = move || {
            let engine = watch
                .clone()
                .filter(|_| first.swap(false, std::sync::atomic::Ordering::Relaxed));
            async move {
                tokio::select! {
                    _ = deepinfer_server::shutdown_signal() => {}
                    _ = engine_failed(engine) => {}
                }
            }
        };
        deepinfer_server::serve(listener, state, config, shutdown)
            .await
            .context("serving HTTP")
    });
    // Tasks still running after an aborted drain (a tokenization on the blocking pool) must
    // not hold the exit.
    runtime.shutdown_timeout(Duration::from_secs(1));
    handle.shutdown();
    let engine_result = join.join();
    served?;
    match engine_result {
        Ok(Ok(core)) => {
            // The prefix cache's disk tier takes what memory cached (for the next start).
            drop(core);
            eprintln!("stopped");
            Ok(())
        }
        Ok(Err(e)) => Err(e).context("the engine failed"),
        Err(_) => anyhow::bail!("the engine thread panicked"),
    }
}

/// Warns when the tokenizer knows ids the model does not (prompts using them are refused).
fn warn_larger_vocab(tokenizer: &Tokenizer, vocab_size: usize) {
    if tokenizer.vocab_size() > vocab_size {
        tracing::warn!(
            tokenizer = tokenizer.vocab_size(),
            model = vocab_size,
            "the tokenizer knows more ids than the model's vocabulary; prompts using them are refused"
        );
    }
}

/// How long a split server answers 503 on `/health` after its engine failed before the job
/// ends: long enough for a load balancer's health check to take the replica out.
const FAILED_GRACE: Duration = Duration::from_secs(5);

/// Resolves [`FAILED_GRACE`] after the watched engine stops on its own (a failed step);
/// never when there is none. One process keeps serving 503 until it is stopped; in a job of
/// several, the failure (often another rank's) ends the job, so every rank exits with the
/// error.
async fn engine_failed(engine: Option<deepinfer_engine::engine::EngineHandle>) {
    let Some(engine) = engine else {
        return std::future::pending().await;
    };
    while engine.is_running() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "the engine stopped: /health answers 503; the job ends in {} s",
        FAILED_GRACE.as_secs()
    );
    tokio::time::sleep(FAILED_GRACE).await;
}

/// File descriptors kept for everything but client connections (shards, the listener,
/// logs).
const RESERVED_FDS: usize = 256;

/// `--max-connections`, lowered to fit the open-file limit: past it, accepting fails and
/// nobody new gets in, while below it the extra clients just wait in the backlog.
fn connection_cap(wanted: usize) -> usize {
    match open_file_limit() {
        Some(limit) if wanted + RESERVED_FDS > limit => {
            let cap = limit.saturating_sub(RESERVED_FDS).max(1);
            tracing::warn!(
                "--max-connections {wanted} lowered to {cap}: the open-file limit is {limit}"
            );
            cap
        }
        _ => wanted,
    }
}

/// The soft limit on open files (`ulimit -n`), where the system says.
fn open_file_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}
