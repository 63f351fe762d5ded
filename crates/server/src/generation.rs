//! One API request's generation: its choices submitted to the engine as sequences, their
//! deltas gathered on one async channel, each turned into text (incremental detokenization,
//! stop strings) before the endpoint formats it.
//!
//! Dropping a [`Generation`] (the client went away, or the handler returned early) aborts
//! every choice still running, so the engine frees their caches in its next step.
//!
//! Each choice has at most [`MAX_BUFFERED_DELTAS`] deltas waiting to be read: a full choice
//! tells the engine it has no room ([`OutputSink::has_room`]), and the engine skips that
//! sequence (it keeps its cache) until the response has caught up. A client that stops
//! reading therefore stops its own generation instead of growing the server's memory; the
//! connection's write timeout then closes it, which aborts the request.

use crate::openai::Usage;
use crate::openai::{ApiError, OutputOptions};
use crate::structured::Grammar;
use crate::tokenizer::{IncrementalDetokenizer, StopSet, StopStrings, Tokenizer};
use deepinfer_engine::engine::EngineHandle;
use deepinfer_engine::request::{
    FinishReason, OutputSink, Prompt, RequestId, RequestOutput, TokenLogprobs,
};
use deepinfer_engine::sampling_params::SamplingParams;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::OwnedSemaphorePermit;

/// Deltas of one choice that may wait unread before its sequence pauses. The engine sends
/// one delta per step, so this is how many steps a choice may run ahead of its reader.
pub const MAX_BUFFERED_DELTAS: usize = 32;

/// Routes one choice's deltas into the request's shared channel, tagged with the choice.
struct ChoiceSink {
    index: usize,
    tx: UnboundedSender<(usize, RequestOutput)>,
    /// Deltas sent and not yet read (shared with the choice's [`ChoiceText`]).
    unread: Arc<AtomicUsize>,
    /// Set when a stop string ended the choice. The response may then complete and drop
    /// the receiver before the engine has read the stop; a refused delta would make it
    /// finish the sequence as an abort, so the sink keeps saying yes until the stop lands.
    stopped: Arc<AtomicBool>,
}

impl OutputSink for ChoiceSink {
    fn send(&mut self, out: RequestOutput) -> bool {
        // `stopped` is read only after the delta is refused: the reader sets it before it
        // drops the receiver, so a read taken before the send could be older than the
        // drop it races with and turn a stop into an abort.
        let stopped = || self.stopped.load(Ordering::Acquire);
        // An engine that sends without asking `has_room` still cannot grow the buffer
        // without bound: past twice the limit the choice is given up (the engine then
        // finishes it, and that last delta always goes through).
        let full = self.unread.load(Ordering::Acquire) >= 2 * MAX_BUFFERED_DELTAS;
        if full && out.finish_reason.is_none() {
            return stopped();
        }
        self.unread.fetch_add(1, Ordering::AcqRel);
        self.tx.send((self.index, out)).is_ok() || stopped()
    }

    fn has_room(&self) -> bool {
        self.unread.load(Ordering::Acquire) < MAX_BUFFERED_DELTAS
    }
}

/// What one choice produced since its last delta.
#[derive(Debug, Default, Clone)]
pub struct ChoiceDelta {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprobs>,
    /// Set on the choice's last delta: OpenAI's finish reason.
    pub finish_reason: Option<&'static str>,
    /// vLLM's `stop_reason`: the stop string or stop token id that ended the choice.
    pub stop_reason: Option<serde_json::Value>,
}

/// The text side of one choice.
struct ChoiceText {
    request_id: RequestId,
    detok: IncrementalDetokenizer,
    stops: StopStrings,
    include_stop: bool,
    stop_token_ids: Vec<u32>,
    num_tokens: usize,
    /// The prompt's length, and how much of it the prefix cache held.
    prompt_tokens: usize,
    cached_tokens: usize,
    finished: bool,
    /// Shared with the choice's sink (see [`ChoiceSink::unread`], [`ChoiceSink::stopped`]).
    unread: Arc<AtomicUsize>,
    stopped: Arc<AtomicBool>,
}

impl ChoiceText {
    /// Applies one engine delta. Returns the text delta and whether a stop string ended the
    /// choice here (the engine does not know; the caller stops the sequence).
    fn apply(&mut self, out: RequestOutput) -> (ChoiceDelta, bool) {
        let mut delta = ChoiceDelta {
            logprobs: out.logprobs.unwrap_or_default(),
            ..Default::default()
        };
        let mut stop_hit = false;
        // An engine stop always ends on the stop token (EOS or a `stop_token_ids` id); as in
        // vLLM, its text is left out unless `include_stop_str_in_output`.
        let drop_last = out.finish_reason == Some(FinishReason::Stop) && !self.include_stop;
        let last = out.new_token_ids.len().saturating_sub(1);
        for (k, &id) in out.new_token_ids.iter().enumerate() {
            self.num_tokens += 1;
            delta.token_ids.push(id);
            if drop_last && k == last {
                continue;
            }
            let text = self.detok.push(id);
            let (emit, matched) = self.stops.push(&text);
            delta.text.push_str(&emit);
            if let Some(i) = matched {
                let stop = self.stops.stops()[i].clone();
                if self.include_stop {
                    delta.text.push_str(&stop);
                }
                delta.finish_reason = Some("stop");
                delta.stop_reason = Some(stop.into());
                stop_hit = true;
                break;
            }
        }
        if !stop_hit {
            if let Some(reason) = out.finish_reason {
                let rest = self.detok.flush();
                let (emit, matched) = self.stops.push(&rest);
                delta.text.push_str(&emit);
                if let Some(i) = matched {
                    let stop = self.stops.stops()[i].clone();
                    if self.include_stop {
                        delta.text.push_str(&stop);
                    }
                    delta.finish_reason = Some("stop");
                    delta.stop_reason = Some(stop.into());
                } else {
                    delta.text.push_str(&self.stops.flush());
                    delta.finish_reason = Some(reason.as_str());
                    if reason == FinishReason::Stop {
                        delta.stop_reason = out
                            .new_token_ids
                            .last()
                            .filter(|id| self.stop_token_ids.contains(id))
                            .map(|&id| id.into());
                    }
                }
            }
        }
        self.finished = delta.finish_reason.is_some();
        (delta, stop_hit)
    }
}

/// The choices of one request in flight.
pub struct Generation {
    engine: EngineHandle,
    rx: UnboundedReceiver<(usize, RequestOutput)>,
    choices: Vec<ChoiceText>,
    _permit: OwnedSemaphorePermit,
}

impl Generation {
    /// Submits one sequence per choice (a request's `n` samples of each of its prompts).
    pub fn start(
        engine: &EngineHandle,
        tokenizer: &Tokenizer,
        permit: OwnedSemaphorePermit,
        choices: Vec<(Prompt, SamplingParams)>,
        opts: &OutputOptions,
    ) -> Result<Self, ApiError> {
        Self::start_constrained(engine, tokenizer, permit, choices, opts, None)
    }

    /// Like [`Self::start`], each choice's output held to its own copy of a grammar
    /// (structured outputs); with `thinking` the grammar starts after the reasoning.
    pub fn start_constrained(
        engine: &EngineHandle,
        tokenizer: &Tokenizer,
        permit: OwnedSemaphorePermit,
        choices: Vec<(Prompt, SamplingParams)>,
        opts: &OutputOptions,
        grammar: Option<(&Grammar, bool)>,
    ) -> Result<Self, ApiError> {
        let (tx, rx) = unbounded_channel();
        let stops = Arc::new(StopSet::new(opts.stop.iter().cloned()));
        let mut gen = Generation {
            engine: engine.clone(),
            rx,
            choices: Vec::with_capacity(choices.len()),
            _permit: permit,
        };
        for (index, (prompt, p)) in choices.into_iter().enumerate() {
            let stop_token_ids = p.stop_token_ids.clone();
            let prompt_tokens = prompt.ids.len();
            let detok = IncrementalDetokenizer::with_prompt(
                tokenizer.clone(),
                &prompt.ids,
                opts.skip_special_tokens,
            );
            let stopped = Arc::new(AtomicBool::new(false));
            let unread = Arc::new(AtomicUsize::new(0));
            let sink = Box::new(ChoiceSink {
                index,
                tx: tx.clone(),
                unread: unread.clone(),
                stopped: stopped.clone(),
            });
            // On an error the choices already submitted are aborted by `Drop`.
            let constraint = grammar.map(|(g, thinking)| g.constraint(thinking));
            let request_id = engine.add_constrained_request_to(prompt, p, constraint, sink)?;
            gen.choices.push(ChoiceText {
                request_id,
                detok,
                stops: StopStrings::shared(stops.clone()),
                include_stop: opts.include_stop_str_in_output,
                stop_token_ids,
                num_tokens: 0,
                prompt_tokens,
                cached_tokens: 0,
                finished: false,
                unread,
                stopped,
            });
        }
        Ok(gen)
    }

    pub fn num_choices(&self) -> usize {
        self.choices.len()
    }

    /// Tokens generated so far by choice `index`.
    pub fn completion_tokens(&self, index: usize) -> usize {
        self.choices[index].num_tokens
    }

    /// Tokens generated so far by all choices.
    pub fn total_completion_tokens(&self) -> usize {
        self.choices.iter().map(|c| c.num_tokens).sum()
    }

    /// The usage of a request whose prompts have `prompt_tokens` tokens in all (each
    /// prompt once, however many choices sample it); the cached share is the choices'
    /// share of their prompts the prefix cache held.
    pub fn usage(&self, prompt_tokens: usize) -> Usage {
        let fed: usize = self.choices.iter().map(|c| c.prompt_tokens).sum();
        let cached: usize = self.choices.iter().map(|c| c.cached_tokens).sum();
        let cached = (cached as u128 * prompt_tokens as u128 / fed.max(1) as u128) as usize;
        Usage::new(prompt_tokens, self.total_completion_tokens()).with_cached(cached)
    }

    /// The next delta of any choice; `None` once every choice has finished. An engine that
    /// stops midway ends the generation with a 500.
    pub async fn next(&mut self) -> Option<Result<(usize, ChoiceDelta), ApiError>> {
        loop {
            if self.choices.iter().all(|c| c.finished) {
                return None;
            }
            let Some((index, out)) = self.rx.recv().await else {
                // Every sink was dropped without a final delta: the engine thread ended.
                for c in &mut self.choices {
                    c.finished = true;
                }
                return Some(Err(ApiError::internal(
                    "the engine stopped while generating this response",
                )));
            };
            let choice = &mut self.choices[index];
            choice.unread.fetch_sub(1, Ordering::AcqRel);
            choice.cached_tokens = out.num_cached_tokens;
            if choice.finished {
                // Deltas after a stop-string hit (up to the stop's last delta) carry nothing new.
                continue;
            }
            let (delta, stop_hit) = choice.apply(out);
            if stop_hit {
                // A normal finish, not an abort: metrics count it under "stop".
                choice.stopped.store(true, Ordering::Release);
                self.engine.stop(choice.request_id);
            }
            return Some(Ok((index, delta)));
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        for c in self.choices.iter().filter(|c| !c.finished) {
            self.engine.abort(c.request_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta() -> RequestOutput {
        RequestOutput {
            request_id: 0,
            new_token_ids: vec![1].into(),
            logprobs: None,
            finish_reason: None,
            num_prompt_tokens: 1,
            num_cached_tokens: 0,
        }
    }

    /// A gone reader refuses deltas (the engine then aborts the sequence), unless a stop
    /// string ended the choice first: then the engine's late deltas are taken until its
    /// stop lands, so the request counts as stopped.
    #[test]
    fn a_stopped_choice_takes_deltas_after_its_reader_is_gone() {
        let (tx, rx) = unbounded_channel();
        let stopped = Arc::new(AtomicBool::new(false));
        let mut sink = ChoiceSink {
            index: 0,
            tx,
            unread: Arc::new(AtomicUsize::new(0)),
            stopped: stopped.clone(),
        };
        assert!(sink.send(delta()));
        drop(rx);
        assert!(!sink.send(delta()), "a reader that went away refuses");
        stopped.store(true, Ordering::Release);
        assert!(sink.send(delta()), "a stopped choice keeps taking deltas");
        for _ in 0..3 * MAX_BUFFERED_DELTAS {
            assert!(sink.send(delta()));
        }
    }
}
