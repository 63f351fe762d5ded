//! `POST /v1/completions`: text in, text out; one or several prompts (text or token ids),
//! `n` choices each, streamed or whole.

use super::{blocking, body_bytes, sse, Shared};
use crate::generation::{ChoiceDelta, Generation};
use crate::openai::{
    check_sequences, fields, n_samples, resolve_max_tokens, ApiError, CompletionChoice,
    CompletionFields, CompletionLogprobs, CompletionResponse, PromptField, SamplingFields,
};
use crate::state::{response_id, unix_now};
use crate::structured::{Grammar, Requested};
use crate::tokenizer::{logprob_token_text, Tokenizer};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use deepinfer_engine::request::TokenLogprobs;
use deepinfer_engine::sampling_params::SamplingParams;

/// vLLM's (and OpenAI's) default output budget for completions.
const DEFAULT_MAX_TOKENS: usize = 16;

pub async fn completions(
    State(st): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(body)?;
    let sf: SamplingFields = fields(&bytes)?;
    let mut cf: CompletionFields = fields(&bytes)?;
    let requested = super::chat::constraint_of(&bytes, &sf)?;
    drop(bytes);
    st.check_model(sf.model.as_deref())?;
    let opts = sf.output_options()?;
    let (prompt, logprobs, sequences) = checked_prompt(&mut cf, opts.n, &st)?;
    // Places for every sequence before any tokenizing: an overloaded server refuses work
    // cheaply, and the queue bounds the tokenizer's work too.
    let permit = st.admit(sequences)?;
    let add_special = cf.add_special_tokens.unwrap_or(true);
    let (prompts, grammar) = tokenized(&st, prompt, add_special, cf.echo, requested).await?;
    if prompts.iter().any(|p| p.0.is_empty()) {
        return Err(ApiError::invalid("prompt", "the prompt must not be empty"));
    }
    let choices = choices(&st, &sf, &prompts, opts.n, logprobs)?;
    let prompt_tokens: usize = prompts.iter().map(|p| p.0.len()).sum();
    let echo: Vec<String> = prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.1.clone(), opts.n))
        .collect();
    let choices = choices
        .into_iter()
        .map(|(ids, p)| (ids.into(), p))
        .collect();
    let gen = Generation::start_constrained(
        &st.engine,
        &st.tokenizer,
        permit,
        choices,
        &opts,
        grammar.as_ref().map(|g| (g, false)),
    )?;
    let head = CompletionResponse {
        id: response_id("cmpl"),
        object: "text_completion",
        created: unix_now(),
        model: st.model_name.clone(),
        choices: Vec::new(),
        usage: None,
    };
    let tok = st.tokenizer.clone();
    if opts.stream {
        Ok(stream(
            gen,
            head,
            tok,
            echo,
            prompt_tokens,
            logprobs.is_some(),
            opts.stream_options,
        ))
    } else {
        whole(gen, head, &tok, echo, prompt_tokens, logprobs.is_some()).await
    }
}

/// The request's checks before any work: unsupported fields, `logprobs`, the prompt's form
/// and size (measured before anything is tokenized or decoded, so a prompt that cannot fit
/// costs only this) and the sequences it asks for. Returns the prompt, the logprobs count
/// and the number of sequences.
fn checked_prompt(
    cf: &mut CompletionFields,
    n: usize,
    st: &Shared,
) -> Result<(PromptField, Option<usize>, usize), ApiError> {
    if cf.suffix.is_some() {
        return Err(ApiError::invalid("suffix", "`suffix` is not supported"));
    }
    let logprobs = match cf.logprobs {
        None => None,
        Some(n) if n < 0 => {
            return Err(ApiError::invalid(
                "logprobs",
                format!("`logprobs` must be >= 0, got {n}"),
            ))
        }
        Some(n) => Some(n as usize),
    };
    if cf.echo && logprobs.is_some() {
        return Err(ApiError::invalid(
            "echo",
            "`echo` together with `logprobs` (prompt logprobs) is not supported",
        ));
    }
    let num_prompts = match &cf.prompt {
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(PromptField::Text(_) | PromptField::Ids(_)) => 1,
        Some(PromptField::Texts(v)) => v.len(),
        Some(PromptField::IdBatches(v)) => v.len(),
    };
    if num_prompts == 0 {
        return Err(ApiError::invalid("prompt", "the prompt must not be empty"));
    }
    let sequences = check_sequences(num_prompts, n)?;
    let prompt = cf.prompt.take().expect("checked above");
    let limits = st.prompt_limits;
    match &prompt {
        PromptField::Text(t) => limits.check_text("prompt", t)?,
        PromptField::Texts(ts) => ts.iter().try_for_each(|t| limits.check_text("prompt", t))?,
        PromptField::Ids(ids) => limits.check_ids("prompt", ids.len())?,
        PromptField::IdBatches(b) => b
            .iter()
            .try_for_each(|ids| limits.check_ids("prompt", ids.len()))?,
    }
    Ok((prompt, logprobs, sequences))
}

/// (token ids, echo text) per prompt, and the structured-output grammar, on the blocking
/// pool. Token-id prompts are decoded only to be echoed.
async fn tokenized(
    st: &Shared,
    prompt: PromptField,
    add_special: bool,
    echo: bool,
    requested: Option<Requested>,
) -> Result<(Vec<(Vec<u32>, String)>, Option<Grammar>), ApiError> {
    let tok = st.tokenizer.clone();
    let state = st.clone();
    blocking(st, move || {
        let grammar = state.grammar(requested.as_ref())?;
        let encode = |text: String| {
            tok.encode(&text, add_special)
                .map(|ids| (ids, if echo { text } else { String::new() }))
                .map_err(|e| ApiError::invalid("prompt", e.to_string()))
        };
        let decode = |ids: Vec<u32>| {
            let text = if echo {
                tok.decode(&ids, false)
            } else {
                String::new()
            };
            (ids, text)
        };
        let prompts: Vec<(Vec<u32>, String)> = match prompt {
            PromptField::Text(t) => vec![encode(t)?],
            PromptField::Texts(ts) => ts.into_iter().map(encode).collect::<Result<_, _>>()?,
            PromptField::Ids(ids) => vec![decode(ids)],
            PromptField::IdBatches(b) => b.into_iter().map(decode).collect(),
        };
        Ok((prompts, grammar))
    })
    .await
}

/// Every choice's prompt and sampling parameters: `n` per prompt, each seeded apart.
fn choices(
    st: &Shared,
    sf: &SamplingFields,
    prompts: &[(Vec<u32>, String)],
    n: usize,
    logprobs: Option<usize>,
) -> Result<Vec<(Vec<u32>, SamplingParams)>, ApiError> {
    let max_model_len = st.engine.max_model_len();
    let mut choices = Vec::with_capacity(prompts.len() * n);
    for (ids, _) in prompts {
        let max_tokens = resolve_max_tokens(
            sf.max_tokens,
            "max_tokens",
            "prompt",
            Some(DEFAULT_MAX_TOKENS),
            ids.len(),
            max_model_len,
        )?;
        let params = sf.sampling_params(max_tokens, logprobs)?;
        choices.extend(n_samples(&params, n).map(|p| (ids.clone(), p)));
    }
    Ok(choices)
}

/// Where each token starts in a choice's text (`text_offset`, in characters), counted on the
/// tokens' bytes: a token holding part of a character is placed at that character.
#[derive(Debug, Default)]
struct TextOffsets {
    /// Bytes of a character not yet complete.
    pending: Vec<u8>,
    chars: usize,
}

impl TextOffsets {
    /// The offset of a token with `bytes`, then moves past it.
    fn advance(&mut self, bytes: &[u8]) -> usize {
        let at = self.chars;
        self.pending.extend_from_slice(bytes);
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    self.chars += s.chars().count();
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    self.chars += std::str::from_utf8(&rest[..valid])
                        .expect("valid up to here")
                        .chars()
                        .count();
                    match e.error_len() {
                        // An incomplete character at the end: wait for its other bytes.
                        None => {
                            rest = &rest[valid..];
                            break;
                        }
                        // Bytes that can never be a character decode as one U+FFFD.
                        Some(n) => {
                            self.chars += 1;
                            rest = &rest[valid + n..];
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        self.pending.drain(..self.pending.len() - keep);
        at
    }
}

/// Builds OpenAI's per-token logprobs for one delta; `offsets` tracks the choice's text.
fn logprobs_of(
    tok: &Tokenizer,
    lps: &[TokenLogprobs],
    offsets: &mut TextOffsets,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    let text = |id: u32| logprob_token_text(&tok.token_bytes(id));
    for lp in lps {
        let bytes = tok.token_bytes(lp.token);
        out.text_offset.push(offsets.advance(&bytes));
        out.tokens.push(logprob_token_text(&bytes));
        out.token_logprobs.push(lp.logprob);
        out.top_logprobs
            .push(lp.top.iter().map(|&(id, l)| (text(id), l)).collect());
    }
    out
}

async fn whole(
    mut gen: Generation,
    mut resp: CompletionResponse,
    tok: &Tokenizer,
    echo: Vec<String>,
    prompt_tokens: usize,
    want_logprobs: bool,
) -> Result<Response, ApiError> {
    let n = gen.num_choices();
    resp.choices = (0..n)
        .map(|i| CompletionChoice {
            index: i,
            text: echo[i].clone(),
            logprobs: want_logprobs.then(CompletionLogprobs::default),
            finish_reason: None,
            stop_reason: None,
        })
        .collect();
    let mut offsets: Vec<TextOffsets> = (0..n).map(|_| TextOffsets::default()).collect();
    while let Some(item) = gen.next().await {
        let (i, d) = item?;
        let c = &mut resp.choices[i];
        if let Some(acc) = &mut c.logprobs {
            let lp = logprobs_of(tok, &d.logprobs, &mut offsets[i]);
            acc.tokens.extend(lp.tokens);
            acc.token_logprobs.extend(lp.token_logprobs);
            acc.top_logprobs.extend(lp.top_logprobs);
            acc.text_offset.extend(lp.text_offset);
        }
        c.text.push_str(&d.text);
        if d.finish_reason.is_some() {
            c.finish_reason = d.finish_reason;
            c.stop_reason = d.stop_reason;
        }
    }
    resp.usage = Some(gen.usage(prompt_tokens));
    Ok(Json(resp).into_response())
}

fn stream(
    mut gen: Generation,
    head: CompletionResponse,
    tok: Tokenizer,
    mut echo: Vec<String>,
    prompt_tokens: usize,
    want_logprobs: bool,
    so: crate::openai::StreamOptions,
) -> Response {
    let body = async_stream::stream! {
        let mut offsets: Vec<TextOffsets> =
            (0..gen.num_choices()).map(|_| TextOffsets::default()).collect();
        while let Some(item) = gen.next().await {
            let (i, d): (usize, ChoiceDelta) = match item {
                Ok(x) => x,
                Err(e) => {
                    yield sse::json_event(&e.body());
                    break;
                }
            };
            let mut chunk = head.clone();
            let text = std::mem::take(&mut echo[i]) + &d.text;
            chunk.choices.push(CompletionChoice {
                index: i,
                text,
                logprobs: want_logprobs.then(|| logprobs_of(&tok, &d.logprobs, &mut offsets[i])),
                finish_reason: d.finish_reason,
                stop_reason: d.stop_reason,
            });
            if so.continuous_usage_stats {
                chunk.usage = Some(gen.usage(prompt_tokens));
            }
            yield sse::json_event(&chunk);
        }
        if so.include_usage {
            let mut last = head.clone();
            last.usage = Some(gen.usage(prompt_tokens));
            yield sse::json_event(&last);
        }
        yield sse::done_event();
    };
    sse::response(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_offsets_count_characters_across_split_tokens() {
        let mut o = TextOffsets::default();
        let crab = "🦀".as_bytes();
        assert_eq!(o.advance(b"ab"), 0);
        assert_eq!(o.advance(&crab[..1]), 2);
        assert_eq!(o.advance(&crab[1..3]), 2);
        assert_eq!(o.advance(&crab[3..]), 2);
        assert_eq!(o.advance("你".as_bytes()), 3);
        assert_eq!(o.advance(&[0xFF, b'x']), 4);
        assert_eq!(o.advance(b"y"), 6);
    }
}
