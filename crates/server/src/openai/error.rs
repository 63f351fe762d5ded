//! OpenAI's error body (`{"error": {"message", "type", "param", "code"}}`) and the HTTP status
//! that goes with it. Every handler returns `Result<_, ApiError>`, so no failure reaches the
//! client as a bare string or a dropped connection.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use deepinfer_engine::engine::EngineError;
use serde::Serialize;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: u16,
}

impl ApiError {
    /// 400 for a bad value of `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
        }
    }

    /// 400 without a single parameter to blame (e.g. malformed JSON).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
        }
    }

    pub fn not_found(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "not_found_error",
            param: param.map(Into::into),
        }
    }

    /// 405: the route exists, the method does not.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
        }
    }

    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or invalid API key (send `Authorization: Bearer <key>` or `x-api-key: <key>`)".into(),
            kind: "authentication_error",
            param: None,
        }
    }

    /// 503: admitting `asked` more sequences would pass the limit on sequences in flight.
    pub fn overloaded(limit: usize, asked: usize) -> Self {
        let message = if asked > limit {
            format!(
                "this request needs {asked} sequences, more than the server's limit of {limit} \
                 sequences in flight (--max-pending-requests)"
            )
        } else {
            format!(
                "the server is at its limit of {limit} sequences in flight; retry later \
                 (this request needs {asked})"
            )
        };
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message,
            kind: "server_overloaded",
            param: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "internal_server_error",
            param: None,
        }
    }

    /// The JSON body (also sent as an SSE `data:` line when a stream fails midway).
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.status.as_u16(),
            },
        })
        .expect("plain data serialises")
    }
}

impl IntoResponse for ApiError {
    /// The error rides along as an extension, so another API family's shape can be put on
    /// it by the router (see `crate::anthropic::error_body`).
    fn into_response(self) -> Response {
        let mut resp = (self.status, Json(self.body())).into_response();
        resp.extensions_mut().insert(self);
        resp
    }
}

/// Maps the engine's refusals onto the API: bad input is the client's 400 (naming the
/// field), a stopped engine is our 503.
impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match &e {
            EngineError::Param(p) => ApiError::invalid(p.field, e.to_string()),
            EngineError::TokenOutOfRange { .. } | EngineError::EmptyPrompt => {
                ApiError::invalid("prompt", e.to_string())
            }
            EngineError::PromptTooLong { .. } => ApiError::invalid("prompt", e.to_string()),
            EngineError::Stopped => Self {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: "the engine has stopped; the server cannot generate".into(),
                kind: "service_unavailable",
                param: None,
            },
            _ => ApiError::internal(e.to_string()),
        }
    }
}
