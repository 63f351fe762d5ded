//! A request in flight: its tokens, how many of them the cache holds, its RNG stream, and
//! its speculative-decoding state.

use crate::cache::SeqId;
use crate::request::{FinishReason, OutputSink, Request};
use crate::sampler::SeqRng;
use crate::spec::SeqSpec;
use std::time::Instant;

pub struct Sequence {
    pub request: Request,
    pub output_ids: Vec<u32>,
    /// Tokens (prompt, then output) whose state is in the cache: the one owner of the
    /// sequence's length. Draft tokens are not counted until accepted.
    pub num_computed: usize,
    /// The cache handle while running; preemption gives it back and recomputes later.
    pub cache: Option<SeqId>,
    /// Prompt tokens found in the prefix cache when first admitted (OpenAI's
    /// `cached_tokens`); `None` before that.
    pub num_cached_tokens: Option<usize>,
    pub rng: SeqRng,
    pub out: Box<dyn OutputSink>,
    /// Draft tokens to verify in the next step, the drafter's progress, the policy's view.
    pub spec: SeqSpec,
    /// First time the scheduler gave it a step (end of its queue time).
    pub first_scheduled: Option<Instant>,
    /// When its first and latest tokens were sampled (TTFT, inter-token latency, TPOT).
    pub first_token_at: Option<Instant>,
    pub last_token_at: Option<Instant>,
    /// Its prefix being read ahead from the disk tier (see [`Self::reading_ahead`]).
    pub read_ahead: Option<crate::cache::disk::ReadAhead>,
    /// The grammar its output follows (structured outputs); lent to the mask thread during
    /// a step.
    pub constraint: Option<Box<dyn crate::constraint::Constraint>>,
}

impl Sequence {
    pub fn new(request: Request, out: Box<dyn OutputSink>) -> Self {
        let rng = SeqRng::new(request.params.seed);
        Self {
            request,
            output_ids: Vec::new(),
            num_computed: 0,
            cache: None,
            num_cached_tokens: None,
            rng,
            out,
            spec: SeqSpec::default(),
            first_scheduled: None,
            first_token_at: None,
            last_token_at: None,
            read_ahead: None,
            constraint: None,
        }
    }

    /// Whether the disk tier is still reading its prefix ahead: admitting it now would read
    /// on the engine thread what another thread is about to have in memory.
    pub fn reading_ahead(&self) -> bool {
        self.read_ahead
            .as_ref()
            .is_some_and(|done| !done.load(std::sync::atomic::Ordering::Acquire))
    }

    pub fn num_tokens(&self) -> usize {
        self.request.prompt_ids.len() + self.output_ids.len()
    }

    /// The token at absolute position `i` (prompt first, then output).
    pub fn token(&self, i: usize) -> u32 {
        let p = &self.request.prompt_ids;
        if i < p.len() {
            p[i]
        } else {
            self.output_ids[i - p.len()]
        }
    }

    /// What the prefix cache keys position `i` by: [`Request::key_token`] in the prompt,
    /// the token itself after it.
    pub fn key_token(&self, i: usize) -> u32 {
        match i < self.request.prompt_ids.len() {
            true => self.request.key_token(i),
            false => self.token(i),
        }
    }

    /// Tokens not yet in the cache: the rest of the prompt (or, after a preemption, of
    /// prompt + output), else the one just sampled.
    pub fn num_uncomputed(&self) -> usize {
        self.num_tokens() - self.num_computed
    }

    /// Whether the sequence is decoding (one sampled token to feed, so drafts can follow).
    pub fn is_decoding(&self) -> bool {
        self.num_uncomputed() == 1
    }

    /// Most draft tokens the next step may verify: a step emits up to one more token than
    /// it accepts, and neither `max_tokens` nor the context may be passed.
    pub fn max_drafts(&self, max_model_len: usize) -> usize {
        let by_output = self
            .request
            .params
            .max_tokens
            .saturating_sub(self.output_ids.len() + 1);
        let by_context = max_model_len.saturating_sub(self.num_tokens() + 1);
        by_output.min(by_context)
    }

    /// Gives up the cache for recompute: everything computed is forgotten (drafts and the
    /// drafter's state included); returns the handle to free.
    pub fn preempt(&mut self) -> Option<SeqId> {
        self.num_computed = 0;
        self.spec.reset();
        self.cache.take()
    }

    /// Whether sampling `token` (already appended) ends the request.
    pub fn finish_reason(&self, eos_ids: &[u32], max_model_len: usize) -> Option<FinishReason> {
        let p = &self.request.params;
        let last = *self.output_ids.last()?;
        if self.output_ids.len() >= p.min_tokens
            && ((!p.ignore_eos && eos_ids.contains(&last)) || p.stop_token_ids.contains(&last))
        {
            return Some(FinishReason::Stop);
        }
        if self.output_ids.len() >= p.max_tokens || self.num_tokens() >= max_model_len {
            return Some(FinishReason::Length);
        }
        None
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling_params::SamplingParams;

    fn seq(params: SamplingParams, out: &[u32]) -> Sequence {
        let (tx, _rx) = std::sync::mpsc::channel();
        let mut s = Sequence::new(
            Request {
                id: 0,
                prompt_ids: vec![5, 6, 7],
                params,
                arrival: Instant::now(),
                images: Vec::new(),
            },
            Box::new(tx),
        );
        s.output_ids = out.to_vec();
        s
    }

    #[test]
    fn stop_conditions() {
        let eos = [1];
        let p = SamplingParams {
            max_tokens: 4,
            stop_token_ids: vec![9],
            ..SamplingParams::default()
        };
        assert_eq!(seq(p.clone(), &[]).finish_reason(&eos, 100), None);
        assert_eq!(seq(p.clone(), &[3]).finish_reason(&eos, 100), None);
        assert_eq!(
            seq(p.clone(), &[3, 1]).finish_reason(&eos, 100),
            Some(FinishReason::Stop)
        );
        assert_eq!(
            seq(p.clone(), &[3, 9]).finish_reason(&eos, 100),
            Some(FinishReason::Stop)
        );
        assert_eq!(
            seq(p.clone(), &[3, 3, 3, 3]).finish_reason(&eos, 100),
            Some(FinishReason::Length)
        );
        // The context length ends a request too: 3 prompt + 2 output = 5.
        assert_eq!(
            seq(p.clone(), &[3, 3]).finish_reason(&eos, 5),
            Some(FinishReason::Length)
        );
        // ignore_eos keeps going past EOS but not past a stop id.
        let ignore = SamplingParams {
            ignore_eos: true,
            ..p.clone()
        };
        assert_eq!(seq(ignore.clone(), &[3, 1]).finish_reason(&eos, 100), None);
        assert_eq!(
            seq(ignore, &[3, 9]).finish_reason(&eos, 100),
            Some(FinishReason::Stop)
        );
        // min_tokens: an early EOS does not end the request.
        let min = SamplingParams { min_tokens: 3, ..p };
        assert_eq!(seq(min.clone(), &[1]).finish_reason(&eos, 100), None);
        assert_eq!(
            seq(min, &[3, 3, 1]).finish_reason(&eos, 100),
            Some(FinishReason::Stop)
        );
    }
}
