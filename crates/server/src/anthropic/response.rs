//! Anthropic Messages response shapes: the message, its usage, its stop reason.

use super::blocks::ContentBlock;
use crate::openai::Usage;
use serde::Serialize;
use serde_json::Value;

#[derive(Serialize, Debug)]
pub struct MessageResponse {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<ContentBlock>,
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: MessageUsage,
}

impl MessageResponse {
    pub fn new(id: String, model: String, usage: MessageUsage) -> Self {
        Self {
            id,
            kind: "message",
            role: "assistant",
            model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage,
        }
    }
}

/// Anthropic counts the prompt in three parts: read from the cache, written to it, and the
/// rest (`input_tokens`). Our prefix cache is automatic, so nothing is "written" on request;
/// the tokens the cache held are `cache_read_input_tokens`.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageUsage {
    pub input_tokens: usize,
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
    pub output_tokens: usize,
}

impl From<Usage> for MessageUsage {
    fn from(u: Usage) -> Self {
        let cached = u.prompt_tokens_details.cached_tokens;
        Self {
            input_tokens: u.prompt_tokens - cached,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached,
            output_tokens: u.completion_tokens,
        }
    }
}

/// Anthropic's `stop_reason` and `stop_sequence` for how the answer ended: a stop string is
/// `stop_sequence`; the output budget is `max_tokens`, or `model_context_window_exceeded`
/// when the budget was cut to the context left; a turn with calls is `tool_use`.
pub fn stop_reason(
    finish_reason: Option<&str>,
    stop: Option<&Value>,
    tool_calls: usize,
    cut_to_context: bool,
) -> (&'static str, Option<String>) {
    match (finish_reason, stop) {
        (Some("stop"), Some(Value::String(s))) => ("stop_sequence", Some(s.clone())),
        (Some("length"), _) if cut_to_context => ("model_context_window_exceeded", None),
        (Some("length"), _) => ("max_tokens", None),
        _ if tool_calls > 0 => ("tool_use", None),
        _ => ("end_turn", None),
    }
}
