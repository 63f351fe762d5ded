//! Server-sent events. OpenAI streams one `data: {json}` per chunk, an error object
//! if generation fails midway, then `data: [DONE]`; Anthropic names each event.

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde::Serialize;
use std::convert::Infallible;

pub fn json_event(v: &impl Serialize) -> Result<Event, Infallible> {
    Ok(Event::default().data(serde_json::to_string(v).expect("plain data serialises")))
}

pub fn done_event() -> Result<Event, Infallible> {
    Ok(Event::default().data("[DONE]"))
}

pub fn response(
    stream: impl Stream<Item = Result<Event, Infallible>> + Send + 'static,
) -> Response {
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// An event as Anthropic streams them: `event: <type>` and the JSON, whose `type` field is
/// that name.
pub fn typed_event(v: &serde_json::Value) -> Result<Event, Infallible> {
    let name = v["type"].as_str().unwrap_or("message");
    Ok(Event::default()
        .event(name)
        .data(serde_json::to_string(v).expect("plain data serialises")))
}
