//! `POST /reset_prefix_cache` (vLLM's route): empties the prefix cache, and with
//! `?disk=true` its disk tier too.

use super::Shared;
use crate::openai::ApiError;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use std::collections::HashMap;

pub async fn reset_prefix_cache(
    State(st): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<StatusCode, ApiError> {
    let disk = match query.get("disk").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "disk",
                format!("`disk` must be true or false, not {other:?}"),
            ))
        }
    };
    let engine = st.engine.clone();
    let freed = tokio::task::spawn_blocking(move || engine.reset_prefix_cache(disk))
        .await
        .map_err(|e| ApiError::internal(format!("resetting the prefix cache failed: {e}")))?
        .map_err(|e| ApiError::internal(format!("resetting the prefix cache failed: {e}")))?;
    tracing::info!(blocks = freed, disk, "prefix cache reset");
    Ok(StatusCode::OK)
}
