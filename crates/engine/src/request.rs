//! What a client asks for and what it gets back, in vLLM's terms.

use crate::sampling_params::SamplingParams;
use std::time::Instant;

pub type RequestId = u64;

/// A generation request as the engine sees it: token ids in, sampling parameters.
#[derive(Clone, Debug)]
pub struct Request {
    pub id: RequestId,
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
    /// When the request reached the engine's handle: queue time and TTFT count from here.
    pub arrival: Instant,
}

/// Why a request stopped generating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS or stop token was sampled.
    Stop,
    /// `max_tokens` or the model's context length was reached.
    Length,
    /// The client aborted (or went away).
    Abort,
}

impl FinishReason {
    /// OpenAI's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// The log-probability of a sampled token and of the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// The tokens of one delta: one in plain decoding, up to `k + 1` with speculation; kept
/// inline so a step's deltas allocate nothing.
pub type TokenIds = smallvec::SmallVec<[u32; 8]>;

/// One delta of a request's stream: the tokens sampled since the last delta.
#[derive(Clone, Debug)]
pub struct RequestOutput {
    pub request_id: RequestId,
    pub new_token_ids: TokenIds,
    /// Present when the request asked for logprobs; one per new token.
    pub logprobs: Option<Vec<TokenLogprobs>>,
    pub finish_reason: Option<FinishReason>,
    pub num_prompt_tokens: usize,
    /// Prompt tokens the prefix cache held when the request was admitted (OpenAI's
    /// `prompt_tokens_details.cached_tokens`).
    pub num_cached_tokens: usize,
}

/// Where a request's deltas go. The engine thread calls `send` and never blocks on it; a
/// `false` return means the receiver is gone, and the engine aborts the request and frees
/// its cache at once (a client that disconnected costs no more compute).
pub trait OutputSink: Send + 'static {
    fn send(&mut self, out: RequestOutput) -> bool;

    /// Whether the receiver can take another delta now. A running sequence whose sink has
    /// no room is not scheduled (it keeps its cache) until room frees up: a reader that
    /// falls behind pauses its own request, and the engine never waits for it.
    fn has_room(&self) -> bool {
        true
    }
}

impl OutputSink for std::sync::mpsc::Sender<RequestOutput> {
    fn send(&mut self, out: RequestOutput) -> bool {
        std::sync::mpsc::Sender::send(self, out).is_ok()
    }
}
