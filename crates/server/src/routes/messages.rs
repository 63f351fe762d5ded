//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API over the
//! same rendering, engine and output parser as Chat Completions. Errors leave here in
//! OpenAI's shape and are reshaped for Anthropic clients by the router (see
//! `crate::anthropic::error_body`).

use super::chat::{check_takes_images, encode_chat, ChatPrompt, ChatRequest};
use super::{blocking, body_bytes, sse, Shared};
use crate::anthropic::{
    conversation, output_format, stop_reason, BlockEvent, Blocks, MessageResponse, MessageUsage,
    MessagesRequest, Whole,
};
use crate::chat::ChatOutputParser;
use crate::generation::{ChoiceDelta, Generation};
use crate::openai::{fields, resolve_max_tokens, ApiError, SamplingFields, StopField};
use crate::state::response_id;
use crate::structured::one_of;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

pub async fn messages(
    State(st): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(body)?;
    let req: MessagesRequest = fields(&bytes)?;
    drop(bytes);
    st.check_model(req.model.as_deref())?;
    let sf = sampling_fields(&req)?;
    let requested = sf.max_tokens.expect("sampling_fields requires it");
    let format = output_format(&req)?;
    let opts = sf.output_options()?;
    let permit = st.admit(1)?;
    let state = st.clone();
    let (mut prompt, single_tool_call, grammar) = blocking(&st, move || {
        let (prompt, single) = prepare(&state, &req)?;
        let requested = one_of(format.into_iter().chain(prompt.forced.clone()).collect())?;
        Ok((prompt, single, state.grammar(requested.as_ref())?))
    })
    .await?;
    // Agents send a fixed budget (Claude Code: 32 000) whatever the context; the budget is
    // cut to the context left and an answer that reaches it says so.
    let room = st.engine.max_model_len().saturating_sub(prompt.ids.len());
    let max_tokens = resolve_max_tokens(
        Some(requested.min(room as i64)),
        "max_tokens",
        "messages",
        None,
        prompt.ids.len(),
        st.engine.max_model_len(),
    )?;
    let params = sf.sampling_params(max_tokens, None)?;
    let parser = prompt.parser();
    let out = MessageOutput {
        id: response_id("msg").replacen('-', "_", 1),
        model: st.model_name.clone(),
        parser,
        blocks: Blocks::new(single_tool_call),
        prompt_tokens: prompt.ids.len(),
        cut_to_context: requested as usize > max_tokens,
    };
    let thinking = prompt.thinking;
    let images = std::mem::take(&mut prompt.images);
    let engine_prompt = crate::images::prompt(prompt.ids, images);
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

pub async fn count_tokens(
    State(st): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let bytes = body_bytes(body)?;
    let req: MessagesRequest = fields(&bytes)?;
    drop(bytes);
    st.check_model(req.model.as_deref())?;
    let state = st.clone();
    let (prompt, _) = blocking(&st, move || prepare(&state, &req)).await?;
    Ok(Json(json!({"input_tokens": prompt.ids.len()})))
}

/// The sampling fields a Messages request sets, in the shape the shared validation takes.
fn sampling_fields(req: &MessagesRequest) -> Result<SamplingFields, ApiError> {
    let Some(max_tokens) = req.max_tokens else {
        return Err(ApiError::invalid("max_tokens", "`max_tokens` is required"));
    };
    Ok(SamplingFields {
        model: req.model.clone(),
        max_tokens: Some(max_tokens),
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        stream: req.stream,
        stop: req.stop_sequences.clone().map(StopField::Many),
        ..Default::default()
    })
}

/// The request rendered and tokenized (its images decoded and their spans counted), and
/// whether only its first tool call is kept.
fn prepare(st: &Shared, req: &MessagesRequest) -> Result<(ChatPrompt, bool), ApiError> {
    let conv = conversation(req)?;
    check_takes_images(st, &conv.messages)?;
    let chat = ChatRequest {
        format: st.chat_format,
        messages: &conv.messages,
        tools: &conv.tools,
        opts: &conv.opts,
        parse_tools: conv.parse_tools,
        forced: conv.forced.clone(),
        prefill: conv.prefill.as_deref().unwrap_or_default(),
        vision: st.engine.vision().map(|v| &**v),
    };
    let prompt = encode_chat(&st.tokenizer, &chat, &st.prompt_limits)?;
    Ok((prompt, conv.single_tool_call))
}

/// One answer in flight: the parser and the content blocks it feeds.
struct MessageOutput {
    id: String,
    model: String,
    parser: ChatOutputParser,
    blocks: Blocks,
    prompt_tokens: usize,
    /// The budget was cut to the context left (see [`messages`]).
    cut_to_context: bool,
}

impl MessageOutput {
    /// The block events of one engine delta (the open block closed on the last).
    fn events(&mut self, d: &ChoiceDelta) -> Vec<BlockEvent> {
        let mut deltas = self.parser.push(&d.text);
        if d.finish_reason.is_some() {
            deltas.extend(self.parser.finish());
        }
        let mut events = Vec::new();
        for delta in deltas {
            self.blocks.push(delta, &mut events);
        }
        if d.finish_reason.is_some() {
            self.blocks.close(&mut events);
        }
        events
    }

    fn stop(&self, d: &ChoiceDelta) -> (&'static str, Option<String>) {
        stop_reason(
            d.finish_reason,
            d.stop_reason.as_ref(),
            self.blocks.tool_calls,
            self.cut_to_context,
        )
    }

    async fn whole(mut self, mut gen: Generation) -> Result<Response, ApiError> {
        let mut whole = Whole::default();
        let mut stop = ("end_turn", None);
        while let Some(item) = gen.next().await {
            let (_, d) = item?;
            for e in self.events(&d) {
                whole.apply(e);
            }
            if d.finish_reason.is_some() {
                stop = self.stop(&d);
            }
        }
        let usage = MessageUsage::from(gen.usage(self.prompt_tokens));
        let mut resp = MessageResponse::new(self.id, self.model, usage);
        resp.content = whole.blocks;
        (resp.stop_reason, resp.stop_sequence) = (Some(stop.0), stop.1);
        Ok(Json(resp).into_response())
    }

    /// Anthropic's event sequence. `message_start` waits for the first delta, which carries
    /// how much of the prompt the cache held, so its usage is exact; until then the
    /// connection's keep-alive comments hold the stream open.
    fn stream(mut self, mut gen: Generation) -> Response {
        let body = async_stream::stream! {
            let mut started = false;
            while let Some(item) = gen.next().await {
                let d = match item {
                    Ok((_, d)) => d,
                    Err(e) => {
                        yield sse::typed_event(&crate::anthropic::error_body(&e));
                        return;
                    }
                };
                if !started {
                    started = true;
                    let mut usage = MessageUsage::from(gen.usage(self.prompt_tokens));
                    usage.output_tokens = 0;
                    let message = MessageResponse::new(self.id.clone(), self.model.clone(), usage);
                    yield sse::typed_event(&json!({"type": "message_start", "message": message}));
                    yield sse::typed_event(&json!({"type": "ping"}));
                }
                for e in self.events(&d) {
                    yield sse::typed_event(&e.wire());
                }
                if d.finish_reason.is_some() {
                    let (reason, sequence) = self.stop(&d);
                    let usage = MessageUsage::from(gen.usage(self.prompt_tokens));
                    yield sse::typed_event(&json!({
                        "type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": usage,
                    }));
                    yield sse::typed_event(&json!({"type": "message_stop"}));
                }
            }
        };
        sse::response(body)
    }
}
