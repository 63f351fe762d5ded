//! The HTTP surface: vLLM's routes, OpenAI's shapes, and Anthropic's Messages API in its own.

mod cache;
mod chat;
mod completions;
mod info;
mod messages;
mod responses;
mod sse;
mod tokenize;

use crate::body::{read_whole_body, BodyLimits};
use crate::openai::ApiError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

pub type Shared = Arc<AppState>;

/// Every route. `/v1/*`, the tokenizer routes and `/reset_prefix_cache` need the API key when one is set (as in
/// vLLM); `/health`, `/metrics` and `/version` stay open. Bodies are read whole, within
/// `body`'s limits, before any handler runs.
pub fn router(state: Shared, body: BodyLimits) -> Router {
    let max_body_bytes = body.max_bytes();
    let guarded = Router::new()
        .route("/v1/models", get(info::models))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/reset_prefix_cache", post(cache::reset_prefix_cache))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .merge(guarded)
        .route("/health", get(info::health))
        .route("/version", get(info::version))
        .route("/metrics", get(info::metrics))
        .fallback(not_found)
        // After every route: it applies to the method routers registered so far.
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn_with_state(
            Arc::new(body),
            read_whole_body,
        ))
        .layer(middleware::from_fn(anthropic_errors))
        .with_state(state)
}

/// Errors on Anthropic's routes in Anthropic's shape, wherever they were raised (the body
/// limits and the API key check run before any handler).
async fn anthropic_errors(req: Request, next: Next) -> Response {
    let anthropic = req.uri().path().starts_with("/v1/messages");
    let resp = next.run(req).await;
    match resp.extensions().get::<ApiError>() {
        Some(e) if anthropic => {
            (e.status, axum::Json(crate::anthropic::error_body(e))).into_response()
        }
        _ => resp,
    }
}

async fn require_api_key(State(st): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        // OpenAI's clients send `Authorization: Bearer`, Anthropic's `x-api-key`.
        let headers = req.headers();
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
        let ok = given.is_some_and(|given| constant_time_eq(given.as_bytes(), key.as_bytes()));
        if !ok {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// The credentials of an `Authorization: Bearer …` header; the scheme name is
/// case-insensitive (RFC 9110 §11.1), so `bearer KEY` works as clients send it.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

/// Compares without an early exit, so response timing does not leak the key's prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(
        format!("no route for {} {}", req.method(), req.uri().path()),
        None,
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::method_not_allowed(format!(
        "{} is not allowed on {}",
        req.method(),
        req.uri().path()
    ))
}

/// Runs CPU-bound request work (tokenizing prompts, rendering a chat) on tokio's blocking
/// pool: on the async workers one huge prompt would stall every other client's stream for
/// as long as it takes. At most one such job per core runs at once (the rest wait their
/// turn), so many large prompts cannot multiply the tokenizer's memory.
pub(crate) async fn blocking<T: Send + 'static>(
    st: &AppState,
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let _turn = st.prep_turn().await;
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?
}

/// The raw body, with axum's plain-text rejections (too large, unreadable) turned into
/// OpenAI error JSON.
pub(crate) fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let mut err =
            ApiError::bad_request(format!("cannot read the request body: {}", e.body_text()));
        err.status = e.status();
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            err.message =
                "the request body is larger than the server's limit (--max-request-body-mib)"
                    .into();
        }
        err
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_matches_in_any_case() {
        assert_eq!(bearer_token("Bearer k"), Some("k"));
        assert_eq!(bearer_token("bearer k"), Some("k"));
        assert_eq!(bearer_token("BEARER  k"), Some("k"));
        assert_eq!(bearer_token("Basic k"), None);
        assert_eq!(bearer_token("k"), None);
    }
}
