//! `POST /v1/chat/completions`: messages rendered in the model's chat format, output parsed
//! back into `reasoning_content`, `content` and `tool_calls`, streamed or whole; and what the
//! three chat APIs share on the way in ([`ChatRequest`], [`render_options`], [`encode_chat`]).

use super::{blocking, body_bytes, sse, Shared};
use crate::chat::image_urls;
use crate::chat::{ChatDelta, ChatFormat, ChatMessage, ChatOutputParser, RenderOptions, ToolDef};
use crate::generation::{ChoiceDelta, Generation};
use crate::images::{self, ImageLimits, PlacedImage};
use crate::openai::{
    check_sequences, fields, n_samples, render_options, resolve_max_tokens, tool_choice, ApiError,
    ChatChoice, ChatCompletionResponse, ChatFields, ChatLogprob, ChatLogprobs, SamplingFields,
    TopLogprob,
};
use crate::state::{response_id, unix_now, PromptLimits};
use crate::structured::{forced_call, one_of, Forced, Requested, VllmFields};
use crate::tokenizer::{logprob_token_text, Tokenizer};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use deepinfer_engine::request::TokenLogprobs;
use deepinfer_engine::sampling_params::MAX_LOGPROBS;
use deepinfer_model::vision::VisionTower;
use serde_json::{json, Map, Value};

/// A chat request made ready for the engine.
pub(crate) struct ChatPrompt {
    /// The format it was rendered in (its answer is parsed in the same).
    pub format: ChatFormat,
    /// Image spans included.
    pub ids: Vec<u32>,
    /// The prompt's images, decoded and placed (not yet through the tower).
    pub images: Vec<PlacedImage>,
    pub thinking: bool,
    /// `None` when tool calls are not parsed (no tools, or `tool_choice: "none"`).
    pub tool_names: Option<Vec<String>>,
    /// The grammar of a forced tool call (`tool_choice` `required` or a named function).
    pub forced: Option<Requested>,
}

impl ChatPrompt {
    /// The parser of one choice's answer: the format's, reading calls of the offered tools
    /// only (none when tool calls are not parsed).
    pub fn parser(&self) -> ChatOutputParser {
        let names = self.tool_names.clone();
        let parser = self.format.parser(self.thinking, names.is_some());
        parser.with_tool_names(names.unwrap_or_default())
    }
}

/// What every chat API family translates its request into before rendering: the
/// conversation, its tools and switches, and text the answer continues (Anthropic's prefill).
pub(crate) struct ChatRequest<'a> {
    /// The model's chat format.
    pub format: ChatFormat,
    pub messages: &'a [ChatMessage],
    pub tools: &'a [ToolDef],
    pub opts: &'a RenderOptions,
    /// Whether tool calls are parsed out of the answer.
    pub parse_tools: bool,
    /// A call the answer must make (`tool_choice` forcing one).
    pub forced: Option<Forced>,
    pub prefill: &'a str,
    /// The model's vision tower, for requests with images (`None`: images are refused).
    pub vision: Option<&'a VisionTower>,
}

/// Renders and tokenizes a conversation; a rendering too long for the context is refused
/// before it is tokenized. CPU-bound for long conversations: call it through
/// [`super::blocking`].
pub(crate) fn encode_chat(
    tok: &Tokenizer,
    req: &ChatRequest,
    limits: &PromptLimits,
) -> Result<ChatPrompt, ApiError> {
    let mut text = req
        .format
        .render(req.messages, req.tools, req.opts)
        .map_err(|e| ApiError::invalid(e.param(), e.to_string()))?;
    text.push_str(req.prefill);
    limits.check_text("messages", &text)?;
    let (ids, images) = prompt_ids(tok, &text, req)?;
    let forced = match &req.forced {
        Some(f) => Some(forced_call(
            req.tools,
            f,
            req.format.markup(),
            "tool_choice",
        )?),
        None => None,
    };
    Ok(ChatPrompt {
        format: req.format,
        ids,
        images,
        thinking: req.opts.thinking_mode(),
        tool_names: (req.parse_tools && !req.tools.is_empty())
            .then(|| req.tools.iter().map(|t| t.function.name.clone()).collect()),
        forced,
    })
}

/// The rendered `text` tokenized, with the spans of the request's images where their
/// placeholders are: each image decoded (within [`ImageLimits`]) and planned by the tower.
fn prompt_ids(
    tok: &Tokenizer,
    text: &str,
    req: &ChatRequest,
) -> Result<(Vec<u32>, Vec<PlacedImage>), ApiError> {
    let urls = image_urls(req.messages);
    if urls.is_empty() {
        let ids = tok
            .encode(text, false)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
        return Ok((ids, Vec::new()));
    }
    let field = &urls[0].0;
    let tower = req.vision.ok_or_else(|| {
        ApiError::invalid(
            field,
            format!("`{field}`: this model takes no images (its checkpoint has no vision tower)"),
        )
    })?;
    let limits = ImageLimits::default();
    if urls.len() > limits.max_images {
        let n = urls.len();
        return Err(ApiError::invalid(
            "messages",
            format!(
                "the request has {n} images; at most {} are accepted",
                limits.max_images
            ),
        ));
    }
    let mut images = Vec::with_capacity(urls.len());
    for (field, url) in urls {
        let pixels = images::decode_url(url, &field, &limits)?;
        images.push((field, pixels));
    }
    images::splice(tok, text, images, tower)
}

/// 400 naming the model when `messages` hold images and the model has no vision tower.
pub(crate) fn check_takes_images(st: &Shared, messages: &[ChatMessage]) -> Result<(), ApiError> {
    match image_urls(messages).first() {
        Some((field, _)) if st.engine.vision().is_none() => Err(ApiError::invalid(
            field,
            format!(
                "`{field}`: the model `{}` takes no images (its checkpoint has no vision tower)",
                st.model_name
            ),
        )),
        _ => Ok(()),
    }
}

/// The conversation of an OpenAI chat request, rendered and tokenized (shared with
/// `/tokenize`).
pub(crate) fn chat_prompt(
    format: ChatFormat,
    tok: &Tokenizer,
    f: &ChatFields,
    limits: &PromptLimits,
    vision: Option<&VisionTower>,
) -> Result<ChatPrompt, ApiError> {
    if f.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    let parallel = f.parallel_tool_calls.unwrap_or(true);
    let (parse_tools, forced) = tool_choice(f.tool_choice.as_ref(), parallel, "function.name")?;
    let opts = render_options(
        f.reasoning_effort
            .as_deref()
            .map(|e| (e, "reasoning_effort")),
        f.chat_template_kwargs.as_ref(),
    )?;
    let req = ChatRequest {
        format,
        messages: &f.messages,
        tools: f.tools.as_deref().unwrap_or_default(),
        opts: &opts,
        parse_tools,
        forced,
        prefill: "",
        vision,
    };
    encode_chat(tok, &req, limits)
}

/// The structured-output constraint of a Chat Completions or Completions request (its
/// `response_format` or vLLM's fields), refused beside `ignore_eos` (a finished grammar
/// allows only the end, which that would ignore).
pub(crate) fn constraint_of(
    bytes: &[u8],
    sf: &SamplingFields,
) -> Result<Option<Requested>, ApiError> {
    let vf: VllmFields = fields(bytes)?;
    let requested = vf.requested()?;
    if requested.is_some() && sf.ignore_eos == Some(true) {
        return Err(ApiError::invalid(
            "ignore_eos",
            "`ignore_eos` cannot be combined with a structured output constraint",
        ));
    }
    Ok(requested)
}

pub async fn chat_completions(
    State(st): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(body)?;
    let sf: SamplingFields = fields(&bytes)?;
    let cf: ChatFields = fields(&bytes)?;
    let requested = constraint_of(&bytes, &sf)?;
    drop(bytes);
    st.check_model(sf.model.as_deref())?;
    check_takes_images(&st, &cf.messages)?;
    let opts = sf.output_options()?;
    let logprobs = match (cf.logprobs.unwrap_or(false), cf.top_logprobs) {
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` needs `logprobs` set to true",
            ))
        }
        (false, None) => None,
        (true, None) => Some(0),
        (true, Some(n)) if n < 0 => {
            return Err(ApiError::invalid(
                "top_logprobs",
                format!("`top_logprobs` must be >= 0, got {n}"),
            ))
        }
        (true, Some(n)) if n as usize > MAX_LOGPROBS => {
            return Err(ApiError::invalid(
                "top_logprobs",
                format!("`top_logprobs` must be at most {MAX_LOGPROBS}, got {n}"),
            ))
        }
        (true, Some(n)) => Some(n as usize),
    };
    // Places for every choice before the (possibly long) rendering.
    let permit = st.admit(check_sequences(1, opts.n)?)?;
    let tok = st.tokenizer.clone();
    let limits = st.prompt_limits;
    let state = st.clone();
    let (mut prompt, cf, grammar) = blocking(&st, move || {
        let vision = state.engine.vision().map(|v| &**v);
        let prompt = chat_prompt(state.chat_format, &tok, &cf, &limits, vision)?;
        let requested = one_of(requested.into_iter().chain(prompt.forced.clone()).collect())?;
        let grammar = state.grammar(requested.as_ref())?;
        Ok((prompt, cf, grammar))
    })
    .await?;
    let (requested, param) = match cf.max_completion_tokens {
        Some(m) => (Some(m), "max_completion_tokens"),
        None => (sf.max_tokens, "max_tokens"),
    };
    let max_tokens = resolve_max_tokens(
        requested,
        param,
        "messages",
        None,
        prompt.ids.len(),
        st.engine.max_model_len(),
    )?;
    let params = sf.sampling_params(max_tokens, logprobs)?;
    let engine_prompt = images::prompt(prompt.ids.clone(), std::mem::take(&mut prompt.images));
    let choices = n_samples(&params, opts.n)
        .map(|p| (engine_prompt.clone(), p))
        .collect();
    let gen = Generation::start_constrained(
        &st.engine,
        &st.tokenizer,
        permit,
        choices,
        &opts,
        grammar.as_ref().map(|g| (g, prompt.thinking)),
    )?;
    let parsers = (0..opts.n).map(|_| prompt.parser()).collect();
    let out = ChatOutput {
        head: ChatCompletionResponse {
            id: response_id("chatcmpl"),
            object: "chat.completion",
            created: unix_now(),
            model: st.model_name.clone(),
            choices: Vec::new(),
            usage: None,
        },
        tok: st.tokenizer.clone(),
        parsers,
        tool_calls: vec![0; opts.n],
        prompt_tokens: prompt.ids.len(),
        want_logprobs: logprobs.is_some(),
    };
    if opts.stream {
        Ok(out.stream(gen, opts.stream_options))
    } else {
        out.whole(gen).await
    }
}

/// Per-request output state: one parser and tool-call count per choice.
struct ChatOutput {
    head: ChatCompletionResponse,
    tok: Tokenizer,
    parsers: Vec<ChatOutputParser>,
    tool_calls: Vec<usize>,
    prompt_tokens: usize,
    want_logprobs: bool,
}

fn tool_call_json(index: usize, name: String, arguments: String) -> Value {
    json!({
        "index": index,
        "id": response_id("call"),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    })
}

fn chat_logprobs(tok: &Tokenizer, lps: &[TokenLogprobs]) -> ChatLogprobs {
    // `bytes` exact, even for part of a character; `token` its text (see
    // `logprob_token_text`).
    let entry = |id: u32| {
        let bytes = tok.token_bytes(id);
        (logprob_token_text(&bytes), bytes)
    };
    ChatLogprobs {
        content: lps
            .iter()
            .map(|lp| {
                let (token, bytes) = entry(lp.token);
                ChatLogprob {
                    token,
                    logprob: lp.logprob,
                    bytes,
                    top_logprobs: lp
                        .top
                        .iter()
                        .map(|&(id, logprob)| {
                            let (token, bytes) = entry(id);
                            TopLogprob {
                                token,
                                logprob,
                                bytes,
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

impl ChatOutput {
    /// Parser output for one engine delta (flushed on the choice's last one).
    fn parse(&mut self, i: usize, d: &ChoiceDelta) -> Vec<ChatDelta> {
        let mut deltas = self.parsers[i].push(&d.text);
        if d.finish_reason.is_some() {
            deltas.extend(self.parsers[i].finish());
        }
        deltas
    }

    /// OpenAI reports a turn that ended in tool calls as `tool_calls`.
    fn finish_reason(&self, i: usize, reason: Option<&'static str>) -> Option<&'static str> {
        match reason {
            Some("stop") if self.tool_calls[i] > 0 => Some("tool_calls"),
            r => r,
        }
    }

    async fn whole(mut self, mut gen: Generation) -> Result<Response, ApiError> {
        let n = gen.num_choices();
        let mut reasoning = vec![String::new(); n];
        let mut content = vec![String::new(); n];
        let mut calls: Vec<Vec<Value>> = vec![Vec::new(); n];
        let mut logprobs = vec![ChatLogprobs::default(); n];
        let mut finish = vec![(None, None); n];
        while let Some(item) = gen.next().await {
            let (i, d) = item?;
            if self.want_logprobs {
                logprobs[i]
                    .content
                    .extend(chat_logprobs(&self.tok, &d.logprobs).content);
            }
            for delta in self.parse(i, &d) {
                match delta {
                    ChatDelta::Reasoning(t) => reasoning[i].push_str(&t),
                    ChatDelta::Content(t) => content[i].push_str(&t),
                    ChatDelta::ToolCall {
                        index,
                        name,
                        arguments,
                    } => {
                        self.tool_calls[i] += 1;
                        let mut call = tool_call_json(index, name, arguments);
                        call.as_object_mut().expect("object").remove("index");
                        calls[i].push(call);
                    }
                }
            }
            if d.finish_reason.is_some() {
                finish[i] = (self.finish_reason(i, d.finish_reason), d.stop_reason);
            }
        }
        let mut resp = self.head.clone();
        for i in 0..n {
            let mut message = Map::new();
            message.insert("role".into(), json!("assistant"));
            let has_calls = !calls[i].is_empty();
            message.insert(
                "content".into(),
                if has_calls && content[i].is_empty() {
                    Value::Null
                } else {
                    json!(std::mem::take(&mut content[i]))
                },
            );
            message.insert(
                "reasoning_content".into(),
                if reasoning[i].is_empty() {
                    Value::Null
                } else {
                    json!(std::mem::take(&mut reasoning[i]))
                },
            );
            message.insert("tool_calls".into(), json!(std::mem::take(&mut calls[i])));
            let (finish_reason, stop_reason) = std::mem::take(&mut finish[i]);
            resp.choices.push(ChatChoice {
                index: i,
                message: Some(Value::Object(message)),
                delta: None,
                logprobs: self.want_logprobs.then(|| std::mem::take(&mut logprobs[i])),
                finish_reason,
                stop_reason,
            });
        }
        resp.usage = Some(gen.usage(self.prompt_tokens));
        Ok(Json(resp).into_response())
    }

    /// The stream chunks for one engine delta of choice `i`: one per parsed piece (reasoning,
    /// content, each tool call), logprobs on the first, the finish reason on the last.
    fn chunks(&mut self, i: usize, d: &ChoiceDelta) -> Vec<ChatCompletionResponse> {
        let mut deltas: Vec<Value> = Vec::new();
        for delta in self.parse(i, d) {
            deltas.push(match delta {
                ChatDelta::Reasoning(t) => json!({"reasoning_content": t}),
                ChatDelta::Content(t) => json!({"content": t}),
                ChatDelta::ToolCall {
                    index,
                    name,
                    arguments,
                } => {
                    self.tool_calls[i] += 1;
                    json!({"tool_calls": [tool_call_json(index, name, arguments)]})
                }
            });
        }
        let logprobs = self
            .want_logprobs
            .then(|| chat_logprobs(&self.tok, &d.logprobs));
        let finish_reason = self.finish_reason(i, d.finish_reason);
        if deltas.is_empty() && (logprobs.is_some() || finish_reason.is_some()) {
            deltas.push(json!({}));
        }
        let last = deltas.len().saturating_sub(1);
        deltas
            .into_iter()
            .enumerate()
            .map(|(k, delta)| {
                let mut c = self.head.clone();
                c.choices.push(ChatChoice {
                    index: i,
                    message: None,
                    delta: Some(delta),
                    logprobs: if k == 0 { logprobs.clone() } else { None },
                    finish_reason: if k == last { finish_reason } else { None },
                    stop_reason: if k == last {
                        d.stop_reason.clone()
                    } else {
                        None
                    },
                });
                c
            })
            .collect()
    }

    fn stream(mut self, mut gen: Generation, so: crate::openai::StreamOptions) -> Response {
        self.head.object = "chat.completion.chunk";
        let body = async_stream::stream! {
            let n = gen.num_choices();
            // The first chunk of every choice carries the role, as OpenAI's do.
            for i in 0..n {
                let mut c = self.head.clone();
                c.choices.push(ChatChoice {
                    index: i,
                    message: None,
                    delta: Some(json!({"role": "assistant", "content": ""})),
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                });
                yield sse::json_event(&c);
            }
            while let Some(item) = gen.next().await {
                let (i, d) = match item {
                    Ok(x) => x,
                    Err(e) => {
                        yield sse::json_event(&e.body());
                        break;
                    }
                };
                for c in self.chunks(i, &d) {
                    let mut c = c;
                    if so.continuous_usage_stats {
                        c.usage = Some(gen.usage(self.prompt_tokens));
                    }
                    yield sse::json_event(&c);
                }
            }
            if so.include_usage {
                let mut last = self.head.clone();
                last.usage = Some(gen.usage(self.prompt_tokens));
                yield sse::json_event(&last);
            }
            yield sse::done_event();
        };
        sse::response(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted output (a random tiny model never writes DSML): streamed in small pieces,
    /// the chunks carry the reasoning, the content and one OpenAI tool call, and the turn
    /// ends with `tool_calls`.
    #[test]
    fn streamed_chunks_turn_dsml_into_openai_tool_calls() {
        let text = "I should look it up.</think>Let me check.\n\n<｜DSML｜tool_calls>\n\
            <｜DSML｜invoke name=\"get_weather\">\n\
            <｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n\
            <｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n\
            </｜DSML｜invoke>\n</｜DSML｜tool_calls>";
        let tok = Tokenizer::from_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../assets/tokenizer"
        ))
        .unwrap();
        let mut out = ChatOutput {
            head: ChatCompletionResponse {
                id: "x".into(),
                object: "chat.completion.chunk",
                created: 0,
                model: "m".into(),
                choices: Vec::new(),
                usage: None,
            },
            tok,
            parsers: vec![ChatFormat::V4
                .parser(true, true)
                .with_tool_names(["get_weather"])],
            tool_calls: vec![0],
            prompt_tokens: 1,
            want_logprobs: false,
        };
        let chars: Vec<char> = text.chars().collect();
        let pieces: Vec<String> = chars.chunks(3).map(|c| c.iter().collect()).collect();
        let mut chunks = Vec::new();
        for (k, piece) in pieces.iter().enumerate() {
            let d = ChoiceDelta {
                text: piece.clone(),
                finish_reason: (k + 1 == pieces.len()).then_some("stop"),
                ..Default::default()
            };
            chunks.extend(out.chunks(0, &d));
        }
        let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
        for c in &chunks {
            let delta = c.choices[0].delta.as_ref().unwrap();
            if let Some(t) = delta.get("reasoning_content") {
                reasoning.push_str(t.as_str().unwrap());
            }
            if let Some(t) = delta.get("content") {
                content.push_str(t.as_str().unwrap());
            }
            if let Some(t) = delta.get("tool_calls") {
                calls.extend(t.as_array().unwrap().clone());
            }
        }
        assert_eq!(reasoning, "I should look it up.");
        assert_eq!(content, "Let me check.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["index"], 0);
        assert_eq!(calls[0]["type"], "function");
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call-"));
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        let args: Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris", "days": 3}));
        let last = &chunks.last().unwrap().choices[0];
        assert_eq!(last.finish_reason, Some("tool_calls"));
        assert!(chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c.choices[0].finish_reason.is_none()));
    }
}
