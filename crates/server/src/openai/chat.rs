//! `/v1/chat/completions`: the fields beyond [`super::SamplingFields`] and the response shapes
//! (whole responses and stream chunks share [`ChatCompletionResponse`]).

use super::{ApiError, Usage};
use crate::chat::{ChatMessage, ReasoningEffort, RenderOptions, ToolDef};
use crate::structured::Forced;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Read from the body bytes (not a `Value`), so tool schemas keep their key order.
#[derive(Deserialize, Debug)]
pub struct ChatFields {
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub tools: Option<Vec<ToolDef>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub reasoning_effort: Option<String>,
    pub chat_template_kwargs: Option<Value>,
}

#[derive(Serialize, Debug, Clone)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Serialize, Debug, Clone)]
pub struct ChatLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Serialize, Debug, Clone, Default)]
pub struct ChatLogprobs {
    pub content: Vec<ChatLogprob>,
}

/// One choice: `message` in a whole response, `delta` in a chunk (the other is absent).
#[derive(Serialize, Debug, Clone)]
pub struct ChatChoice {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<Value>,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Option<Value>,
}

#[derive(Serialize, Debug, Clone)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// The render options of a chat request of any API: its effort field (a name of
/// [`ReasoningEffort::NAMES`], as vLLM's request types take it; `(value, field)`) and
/// `chat_template_kwargs` (an object), merged as vLLM's `build_chat_params` merges them. A
/// value the model's family does not take is refused when the conversation is rendered.
pub fn render_options(
    effort: Option<(&str, &'static str)>,
    chat_template_kwargs: Option<&Value>,
) -> Result<RenderOptions, ApiError> {
    let effort = match effort {
        None => None,
        Some((name, field)) => Some(
            ReasoningEffort::parse(name)
                .map(|e| (e, field))
                .ok_or_else(|| {
                    ApiError::invalid(
                        field,
                        format!(
                            "`{field}` must be one of {}, got {name:?}",
                            ReasoningEffort::NAMES.join(", ")
                        ),
                    )
                })?,
        ),
    };
    let kwargs = match chat_template_kwargs {
        None | Some(Value::Null) => None,
        Some(v @ Value::Object(_)) => Some(v),
        Some(other) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs",
                format!("`chat_template_kwargs` must be an object, got {other}"),
            ))
        }
    };
    Ok(RenderOptions::from_openai(effort, kwargs))
}

/// `tool_choice` of Chat Completions or Responses: `"auto"` (the default), `"none"`,
/// `"required"` or a named function whose name is at `name_field` (`function.name` in Chat
/// Completions, `name` in Responses). Returns whether calls are parsed, and the call forced.
pub fn tool_choice(
    value: Option<&Value>,
    parallel: bool,
    name_field: &'static str,
) -> Result<(bool, Option<Forced>), ApiError> {
    Ok(match value {
        None => (true, None),
        Some(Value::String(s)) if s == "auto" => (true, None),
        Some(Value::String(s)) if s == "none" => (false, None),
        Some(Value::String(s)) if s == "required" => (true, Some(Forced::Any { parallel })),
        Some(v) if v.get("type").and_then(Value::as_str) == Some("function") => {
            let name = name_field
                .split('.')
                .try_fold(v, |v, key| v.get(key))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("tool_choice.{name_field}"),
                        format!("a named `tool_choice` needs `{name_field}`"),
                    )
                })?;
            (true, Some(Forced::Named(name.to_owned())))
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "`tool_choice` must be \"auto\", \"none\", \"required\" or a named function, got {other}"
                ),
            ))
        }
    })
}
