//! Server-sent events as OpenAI streams them: one `data: {json}` per chunk, an error object
//! if generation fails midway, then `data: [DONE]`.

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
