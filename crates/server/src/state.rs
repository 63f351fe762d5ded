//! What every handler shares: the engine handle, the tokenizer, the served name and limits.

use crate::chat::ChatFormat;
use crate::openai::responses::ResponseStore;
use crate::openai::ApiError;
use crate::structured::{Grammar, Requested, Structured};
use crate::tokenizer::Tokenizer;
use deepinfer_engine::engine::EngineHandle;
use std::sync::{Arc, OnceLock};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, SemaphorePermit};

/// What a prompt may cost before the tokenizer sees it: a prompt that cannot fit the
/// context is refused by its size alone.
#[derive(Clone, Copy, Debug)]
pub struct PromptLimits {
    pub max_model_len: usize,
    /// The most bytes any one token covers, when the tokenizer does not normalise the text
    /// first (then a text of B bytes has at least B / this many tokens).
    pub max_token_bytes: Option<usize>,
}

impl PromptLimits {
    /// 400 unless a prompt of `n` token ids leaves room for output.
    pub fn check_ids(&self, param: &str, n: usize) -> Result<(), ApiError> {
        if n >= self.max_model_len {
            return Err(ApiError::invalid(
                param,
                format!(
                    "This model's maximum context length is {} tokens. However, your prompt \
                     has {n} tokens, which leaves no room for output. Please reduce the length \
                     of the prompt.",
                    self.max_model_len
                ),
            ));
        }
        Ok(())
    }

    /// 400 when `text` surely has too many tokens for the context: checked before it is
    /// tokenized, so an oversized text costs a length check, not a tokenizer run.
    pub fn check_text(&self, param: &str, text: &str) -> Result<(), ApiError> {
        let Some(per_token) = self.max_token_bytes else {
            return Ok(());
        };
        let most = (self.max_model_len - 1).saturating_mul(per_token.max(1));
        if text.len() > most {
            return Err(ApiError::invalid(
                param,
                format!(
                    "This model's maximum context length is {} tokens. However, your prompt \
                     is {} bytes, more than any prompt of {} tokens can be (no token covers \
                     more than {per_token} bytes). Please reduce the length of the prompt.",
                    self.max_model_len,
                    text.len(),
                    self.max_model_len - 1
                ),
            ));
        }
        Ok(())
    }
}

pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    /// The model family's chat format (V4's unless [`Self::with_chat_format`] says otherwise).
    pub chat_format: ChatFormat,
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
    /// Turns at CPU-bound request preparation (tokenizing, rendering): one per core.
    prep: Semaphore,
    pub prompt_limits: PromptLimits,
    /// Unix time the server started (`created` in `/v1/models`).
    pub created: u64,
    /// Stored Responses API answers (`store: true`).
    pub responses: ResponseStore,
    /// The structured-output compiler, built at the first request that needs it (its token
    /// trie costs a fraction of a second a server without such requests need not pay).
    structured: OnceLock<Result<Structured, String>>,
}

/// The stored responses' default bound (see [`AppState::with_response_store`]).
pub const DEFAULT_RESPONSE_STORE_BYTES: usize = 64 << 20;

impl AppState {
    pub fn new(
        engine: EngineHandle,
        tokenizer: Tokenizer,
        model_name: String,
        model_root: String,
        api_key: Option<String>,
        max_pending: usize,
    ) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let prompt_limits = PromptLimits {
            max_model_len: engine.max_model_len(),
            max_token_bytes: tokenizer.max_token_bytes(),
        };
        Self {
            prep: Semaphore::new(cores),
            prompt_limits,
            engine,
            tokenizer,
            chat_format: ChatFormat::V4,
            model_name,
            model_root,
            api_key,
            admission: Arc::new(Semaphore::new(max_pending)),
            max_pending,
            created: unix_now(),
            responses: ResponseStore::new(DEFAULT_RESPONSE_STORE_BYTES),
            structured: OnceLock::new(),
        }
    }

    /// Compiles a request's structured-output constraint, if it has one (CPU-bound: call it
    /// through `routes::blocking`).
    pub fn grammar(&self, requested: Option<&Requested>) -> Result<Option<Grammar>, ApiError> {
        let Some(r) = requested else {
            return Ok(None);
        };
        let structured = self.structured.get_or_init(|| {
            let eos = self
                .tokenizer
                .eos_id()
                .ok_or("the tokenizer names no end-of-sequence token")?;
            Structured::new(&self.tokenizer, eos)
        });
        match structured {
            Ok(s) => s.compile(r).map(Some),
            Err(e) => Err(ApiError::invalid(
                r.field.clone(),
                format!("structured outputs are unavailable with this model: {e}"),
            )),
        }
    }

    /// Renders and parses chats in `format` (the checkpoint's family).
    pub fn with_chat_format(mut self, format: ChatFormat) -> Self {
        self.chat_format = format;
        self
    }

    /// Keeps at most `bytes` of stored responses (0: none are stored).
    pub fn with_response_store(mut self, bytes: usize) -> Self {
        self.responses = ResponseStore::new(bytes);
        self
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

    /// A turn at CPU-bound preparation work (see `routes::blocking`).
    pub async fn prep_turn(&self) -> SemaphorePermit<'_> {
        self.prep
            .acquire()
            .await
            .expect("the semaphore is never closed")
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
