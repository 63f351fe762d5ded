//! What every handler shares: the engine handle, the tokenizer, the served name and limits.

use crate::openai::ApiError;
use crate::tokenizer::Tokenizer;
use deepinfer_engine::engine::EngineHandle;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    /// The name clients use in `model` (and `/v1/models` lists).
    pub model_name: String,
    /// Where the weights came from (`root` in `/v1/models`).
    pub model_root: String,
    pub api_key: Option<String>,
    /// Sequences in flight (waiting or running) across all clients, one permit each (a
    /// request holds one per choice: prompts × n); a full queue answers 503 instead of
    /// growing without bound.
    admission: Arc<Semaphore>,
    pub max_pending: usize,
    /// Unix time the server started (`created` in `/v1/models`).
    pub created: u64,
}

impl AppState {
    pub fn new(
        engine: EngineHandle,
        tokenizer: Tokenizer,
        model_name: String,
        model_root: String,
        api_key: Option<String>,
        max_pending: usize,
    ) -> Self {
        Self {
            engine,
            tokenizer,
            model_name,
            model_root,
            api_key,
            admission: Arc::new(Semaphore::new(max_pending)),
            max_pending,
            created: unix_now(),
        }
    }

    /// A request may name the served model or leave `model` out; anything else is a 404.
    pub fn check_model(&self, requested: Option<&str>) -> Result<(), ApiError> {
        match requested {
            None => Ok(()),
            Some(m) if m == self.model_name => Ok(()),
            Some(m) => Err(ApiError::not_found(
                format!(
                    "The model `{m}` does not exist; this server serves `{}`.",
                    self.model_name
                ),
                Some("model"),
            )),
        }
    }

    /// Places in the admission queue for `sequences` sequences, or 503 when they do not all
    /// fit now: a batch of prompts with a large `n` counts as every sequence it starts.
    pub fn admit(&self, sequences: usize) -> Result<OwnedSemaphorePermit, ApiError> {
        u32::try_from(sequences)
            .ok()
            .and_then(|n| self.admission.clone().try_acquire_many_owned(n).ok())
            .ok_or_else(|| ApiError::overloaded(self.max_pending, sequences))
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh response id: `prefix-` and 32 hex digits, as OpenAI's look. Unique within the
/// process (a counter) and across restarts (the start time); not meant to be secret.
pub fn response_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static START: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let start = *START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    format!(
        "{prefix}-{start:016x}{:016x}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
