//! Anthropic's error body (`{"type": "error", "error": {"type", "message"}}`) for the errors the
//! server raises in OpenAI's shape. Every error of a `/v1/messages` route is reshaped here,
//! including those raised before its handler runs (body limits, the API key), so an
//! Anthropic client always reads its own shape.

use crate::openai::ApiError;
use axum::http::StatusCode;
use serde_json::{json, Value};

/// The field names the shared OpenAI code uses, as the Messages API calls them.
fn anthropic_param(param: &str) -> &str {
    match param {
        "stop" => "stop_sequences",
        "prompt" => "messages",
        other => other,
    }
}

/// Anthropic's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 408 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// The body for `e`. Anthropic's errors carry no `param`: the field leads the message.
pub fn error_body(e: &ApiError) -> Value {
    let message = match e.param.as_deref().map(anthropic_param) {
        Some(p) if !e.message.starts_with(p) && !e.message.starts_with(&format!("`{p}`")) => {
            format!("{p}: {}", e.message)
        }
        _ => e.message.clone(),
    };
    json!({
        "type": "error",
        "error": {"type": error_type(e.status), "message": message},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_take_anthropics_shape_and_name_the_field() {
        let e = ApiError::invalid("stop", "stop strings must not be empty");
        assert_eq!(
            error_body(&e),
            json!({"type": "error", "error": {
                "type": "invalid_request_error",
                "message": "stop_sequences: stop strings must not be empty",
            }})
        );
        let e = ApiError::invalid("messages[0].content[1]", "`messages[0].content[1]`: bad");
        assert_eq!(
            error_body(&e)["error"]["message"],
            "`messages[0].content[1]`: bad"
        );
        let e = ApiError::invalid("max_tokens", "max_tokens: required");
        assert_eq!(error_body(&e)["error"]["message"], "max_tokens: required");
        assert_eq!(
            error_body(&ApiError::unauthorized())["error"]["type"],
            "authentication_error"
        );
        assert_eq!(
            error_body(&ApiError::overloaded(4, 1))["error"]["type"],
            "overloaded_error"
        );
    }
}
