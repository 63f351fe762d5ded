//! What a client asks for and what it gets back, in vLLM's terms.

use crate::sampling_params::SamplingParams;
use deepinfer_model::vision::{ImagePlan, Pixels};
use std::sync::Arc;
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
    /// The prompt's images, in prompt order, their spans apart.
    pub images: Vec<PromptImage>,
}

/// A prompt as the engine takes it: token ids, and the images whose spans they hold.
#[derive(Clone, Debug, Default)]
pub struct Prompt {
    pub ids: Vec<u32>,
    pub images: Vec<PromptImage>,
}

impl From<Vec<u32>> for Prompt {
    fn from(ids: Vec<u32>) -> Self {
        Self {
            ids,
            images: Vec::new(),
        }
    }
}

/// An image's span of a prompt: the input embeddings the model reads there instead of its
/// tokens' (the vision tower's output, or the pixels the engine makes it from), and what
/// tells this image's pixels from another's.
#[derive(Clone, Debug)]
pub struct PromptImage {
    /// The span's first position in the prompt.
    pub offset: usize,
    /// Positions the span covers.
    pub len: usize,
    pub source: ImageSource,
    /// A digest of the pixels (and their size): two images' spans hit the same prefix
    /// cache entries only if their digests agree, as vLLM's multimodal hashes decide.
    pub digest: [u8; 32],
}

/// Where a span's embeddings come from.
#[derive(Clone, Debug)]
pub enum ImageSource {
    /// `[len, hidden]`: the tower's output.
    Embeds(Arc<[f32]>),
    /// Pixels, planned, that the engine puts through the model's tower before the span is
    /// prefilled, a tower step at a time between its model steps (see `crate::encoder`).
    Pixels(Arc<Pixels>, ImagePlan),
}

impl PromptImage {
    /// The span's embeddings, once the tower has made them.
    pub fn embeds(&self) -> Option<&[f32]> {
        match &self.source {
            ImageSource::Embeds(e) => Some(e),
            ImageSource::Pixels(..) => None,
        }
    }

    /// The token the prefix cache keys position `i` of the span by: one of 2³¹ values above
    /// the vocabulary's, drawn from the digest and `i`, so that a block holding any image
    /// position also holds bits of which image it is.
    pub fn key_token(&self, i: usize) -> u32 {
        let mut h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for word in self.digest.chunks_exact(8) {
            h = mix(h ^ u64::from_le_bytes(word.try_into().expect("8 bytes")));
        }
        (h >> 33) as u32 | 1 << 31
    }
}

/// SplitMix64's finaliser: every input bit moves every output bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Request {
    /// The image span (`start..end`) that a chunk or a cached prefix ending before
    /// position `end_at` would cut.
    pub fn image_cut(&self, end_at: usize) -> Option<(usize, usize)> {
        self.images
            .iter()
            .map(|im| (im.offset, im.offset + im.len))
            .find(|&(a, b)| a < end_at && end_at < b)
    }

    /// What the prefix cache keys prompt position `i` by: its token, or inside an image's
    /// span, [`PromptImage::key_token`].
    pub fn key_token(&self, i: usize) -> u32 {
        match self
            .images
            .iter()
            .find(|im| (im.offset..im.offset + im.len).contains(&i))
        {
            Some(im) => im.key_token(i - im.offset),
            None => self.prompt_ids[i],
        }
    }
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
