//! Read-only routes: health, version, metrics, the model list.

use super::Shared;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

/// 200 while the engine thread runs, 503 once it has stopped (a failed model step): load
/// balancers take the replica out instead of sending it requests that would fail.
pub async fn health(State(st): State<Shared>) -> StatusCode {
    if st.engine.is_running() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

pub async fn version() -> Json<serde_json::Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}

pub async fn metrics(State(st): State<Shared>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.engine.metrics.render(),
    )
}

pub async fn models(State(st): State<Shared>) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_name,
            "object": "model",
            "created": st.created,
            "owned_by": "deepinfer",
            "root": st.model_root,
            "parent": null,
            "max_model_len": st.engine.max_model_len(),
        }],
    }))
}
