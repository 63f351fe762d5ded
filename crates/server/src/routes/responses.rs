//! `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`: OpenAI's Responses API over the
//! same rendering, engine and output parser as Chat Completions, with the bounded store that
//! `previous_response_id` continues from.

use super::chat::{check_takes_images, encode_chat, ChatPrompt, ChatRequest};
use super::{blocking, body_bytes, sse, Shared};
use crate::chat::{ChatDelta, ChatMessage, ChatOutputParser};
use crate::generation::{ChoiceDelta, Generation};
use crate::openai::responses::{
    conversation, Conversation, Items, OutputItem, ResponsesRequest, Stored,
};
use crate::openai::{fields, resolve_max_tokens, ApiError, SamplingFields};
use crate::state::{response_id, unix_now, AppState};
use crate::structured::{flat_format, one_of};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

/// Request fields the response object echoes as sent (a second pass over the body).
#[derive(Deserialize, Default)]
struct Echo {
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    reasoning: Option<Value>,
    text: Option<Value>,
    metadata: Option<Value>,
    instructions: Option<Value>,
    previous_response_id: Option<Value>,
}

pub async fn create(
    State(st): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(body)?;
    let req: ResponsesRequest = fields(&bytes)?;
    let echo: Echo = fields(&bytes)?;
    drop(bytes);
    st.check_model(req.model.as_deref())?;
    let sf = SamplingFields {
        max_tokens: req.max_output_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        stream: req.stream,
        ..Default::default()
    };
    let opts = sf.output_options()?;
    let previous = previous_history(&st, req.previous_response_id.as_deref())?;
    let format = match req.text.as_ref().and_then(|t| t.get("format")) {
        Some(f) => flat_format(f, "text.format")?,
        None => None,
    };
    let permit = st.admit(1)?;
    let (tok, limits, state) = (st.tokenizer.clone(), st.prompt_limits, st.clone());
    let (prompt, conv, req, grammar) = blocking(&st, move || {
        let conv = conversation(&req, previous)?;
        let messages = conv.messages();
        check_takes_images(&state, &messages)?;
        let chat = ChatRequest {
            format: state.chat_format,
            messages: &messages,
            tools: &conv.tools,
            opts: &conv.opts,
            parse_tools: conv.parse_tools,
            forced: conv.forced.clone(),
            prefill: "",
            vision: state.engine.vision().map(|v| &**v),
        };
        let prompt = encode_chat(&tok, &chat, &limits)?;
        let requested = one_of(format.into_iter().chain(prompt.forced.clone()).collect())?;
        let grammar = state.grammar(requested.as_ref())?;
        Ok((prompt, conv, req, grammar))
    })
    .await?;
    let max_tokens = resolve_max_tokens(
        req.max_output_tokens,
        "max_output_tokens",
        "input",
        None,
        prompt.ids.len(),
        st.engine.max_model_len(),
    )?;
    let params = sf.sampling_params(max_tokens, None)?;
    let head = Head {
        id: response_id("resp").replacen('-', "_", 1),
        created_at: unix_now(),
        model: st.model_name.clone(),
        max_output_tokens: req.max_output_tokens,
        temperature: params.temperature,
        top_p: params.top_p,
        store: req.store.unwrap_or(true),
        echo,
    };
    let thinking = prompt.thinking;
    let out = ResponseOutput::new(&prompt, conv, head, st.clone());
    let engine_prompt = crate::images::prompt(prompt.ids, prompt.images);
    let gen = Generation::start_constrained(
        &st.engine,
        &st.tokenizer,
        permit,
        vec![(engine_prompt, params)],
        &opts,
        grammar.as_ref().map(|g| (g, thinking)),
    )?;
    if opts.stream {
        Ok(out.stream(gen))
    } else {
        out.whole(gen).await
    }
}

/// The stored conversation a request continues (`previous_response_id`); a 400 naming the
/// field when it is not (or no longer) stored.
fn previous_history(st: &AppState, id: Option<&str>) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(id) = id else {
        return Ok(Vec::new());
    };
    st.responses.get(id).map(|s| s.history).ok_or_else(|| {
        ApiError::invalid(
            "previous_response_id",
            format!("previous response {id:?} not found (never stored, deleted, or dropped from the server's store)"),
        )
    })
}

pub async fn retrieve(
    State(st): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    st.responses
        .get(&id)
        .map(|s| Json(s.response))
        .ok_or_else(|| not_found(&id))
}

pub async fn delete(
    State(st): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if !st.responses.delete(&id) {
        return Err(not_found(&id));
    }
    Ok(Json(
        json!({"id": id, "object": "response", "deleted": true}),
    ))
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(
        format!("no stored response {id:?} (stored only with `store: true`, and the oldest are dropped past --responses-store-mib)"),
        Some("response_id"),
    )
}

/// What every form of the response object carries.
struct Head {
    id: String,
    created_at: u64,
    model: String,
    max_output_tokens: Option<i64>,
    temperature: f32,
    top_p: f32,
    store: bool,
    echo: Echo,
}

impl Head {
    fn object(&self, status: &str, output: &[OutputItem], usage: Option<Value>) -> Value {
        let e = &self.echo;
        let effort = e.reasoning.as_ref().and_then(|r| r.get("effort")).cloned();
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": false,
            "error": null,
            "incomplete_details": (status == "incomplete").then(|| json!({"reason": "max_output_tokens"})),
            "instructions": e.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": e.parallel_tool_calls.unwrap_or(true),
            "previous_response_id": e.previous_response_id,
            "reasoning": {"effort": effort, "summary": null},
            "store": self.store,
            "temperature": self.temperature,
            "text": e.text.clone().unwrap_or_else(|| json!({"format": {"type": "text"}})),
            "tool_choice": e.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            "tools": e.tools.clone().unwrap_or_else(|| json!([])),
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": null,
            "metadata": e.metadata.clone().unwrap_or_else(|| json!({})),
        })
    }
}

/// One answer in flight: the parser, the output items it feeds, what it is counted as.
struct ResponseOutput {
    parser: ChatOutputParser,
    items: Items,
    /// The conversation rendered (without the system message), kept with the answer.
    history: Vec<ChatMessage>,
    prompt_tokens: usize,
    reasoning_tokens: usize,
    /// `incomplete` once the output budget ran out.
    status: &'static str,
    head: Head,
    st: Shared,
}

impl ResponseOutput {
    fn new(prompt: &ChatPrompt, conv: Conversation, head: Head, st: Shared) -> Self {
        Self {
            parser: prompt.parser(),
            items: Items::new(conv.names, conv.single_tool_call),
            history: conv.history,
            prompt_tokens: prompt.ids.len(),
            reasoning_tokens: 0,
            status: "completed",
            head,
            st,
        }
    }

    /// The item events of one engine delta (the open item finished on the last). A delta
    /// that produced only reasoning counts its tokens as reasoning tokens.
    fn events(&mut self, d: &ChoiceDelta) -> Vec<Value> {
        let mut deltas = self.parser.push(&d.text);
        if d.finish_reason.is_some() {
            deltas.extend(self.parser.finish());
        }
        let reasoning = |x: &ChatDelta| matches!(x, ChatDelta::Reasoning(t) if !t.is_empty());
        if !deltas.is_empty() && deltas.iter().all(reasoning) {
            self.reasoning_tokens += d.token_ids.len();
        }
        let mut events = Vec::new();
        for delta in deltas {
            self.items.push(delta, &mut events);
        }
        if let Some(reason) = d.finish_reason {
            if reason == "length" {
                self.status = "incomplete";
            }
            self.items.close(self.status, &mut events);
        }
        events
    }

    /// The finished response object; stored when asked.
    fn finish(self, gen: &Generation) -> Value {
        let u = gen.usage(self.prompt_tokens);
        let usage = json!({
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": u.total_tokens,
        });
        let response = self
            .head
            .object(self.status, &self.items.items, Some(usage));
        if self.head.store {
            let mut history = self.history;
            history.push(self.items.assistant_message());
            let stored = Stored {
                response: response.clone(),
                history,
            };
            if !self.st.responses.put(self.head.id.clone(), stored) {
                tracing::warn!(id = %self.head.id, "a response larger than --responses-store-mib was not stored");
            }
        }
        response
    }

    async fn whole(mut self, mut gen: Generation) -> Result<Response, ApiError> {
        while let Some(item) = gen.next().await {
            let (_, d) = item?;
            self.events(&d);
        }
        Ok(Json(self.finish(&gen)).into_response())
    }

    /// OpenAI's event sequence, each event numbered.
    fn stream(mut self, mut gen: Generation) -> Response {
        let body = async_stream::stream! {
            let mut seq = 0u64;
            let mut numbered = |mut e: Value| {
                e["sequence_number"] = json!(seq);
                seq += 1;
                sse::typed_event(&e)
            };
            let start = self.head.object("in_progress", &[], None);
            yield numbered(json!({"type": "response.created", "response": start}));
            yield numbered(json!({"type": "response.in_progress", "response": start}));
            while let Some(item) = gen.next().await {
                let d = match item {
                    Ok((_, d)) => d,
                    Err(e) => {
                        let b = e.body();
                        yield numbered(json!({"type": "error", "code": b["error"]["type"],
                            "message": b["error"]["message"], "param": b["error"]["param"]}));
                        return;
                    }
                };
                for e in self.events(&d) {
                    yield numbered(e);
                }
            }
            // `response.completed` even when the budget ran out (the object then says
            // `incomplete`), as vLLM sends it: the SDK's stream helper and Codex wait for it.
            let response = self.finish(&gen);
            yield numbered(json!({"type": "response.completed", "response": response}));
        };
        sse::response(body)
    }
}
