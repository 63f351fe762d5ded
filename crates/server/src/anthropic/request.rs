//! Anthropic Messages request shapes (`POST /v1/messages`, `/v1/messages/count_tokens`). Only
//! what the translation reads is kept; unknown fields (`metadata`, `service_tier`,
//! `cache_control`, `anthropic-beta` extras) are ignored, as Anthropic's own server ignores
//! what a model does not use. Read from the body bytes, so tool schemas and tool inputs keep
//! their key order (the V4 prompt embeds them as sent).

use crate::chat::Json;
use serde::Deserialize;
use serde_json::Value;

/// The fields both routes read; `count_tokens` ignores the sampling ones.
#[derive(Deserialize, Debug)]
pub struct MessagesRequest {
    pub model: Option<String>,
    #[serde(default)]
    pub system: Option<SystemField>,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default)]
    pub thinking: Option<Thinking>,
    #[serde(default)]
    pub output_config: Option<OutputConfig>,
    /// The structured-outputs beta's field (`output_config.format` in the released API).
    #[serde(default)]
    pub output_format: Option<Value>,
    /// vLLM's extension, as on Chat Completions (`thinking`, `reasoning_effort`, …).
    #[serde(default)]
    pub chat_template_kwargs: Option<Value>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
}

/// `system`: a string or a list of text blocks.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum SystemField {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Deserialize, Debug)]
pub struct Message {
    pub role: String,
    pub content: Content,
}

/// A message's `content`: a string or a list of blocks.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// One content block; `kind` says which of the optional fields it carries. Kept loose so that
/// a block of an unsupported type is refused by the translation with its path, not by serde.
#[derive(Deserialize, Debug, Default)]
pub struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    /// `text`.
    #[serde(default)]
    pub text: Option<String>,
    /// `thinking`.
    #[serde(default)]
    pub thinking: Option<String>,
    /// `tool_use`: its id, tool name and input object.
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub input: Option<Json>,
    /// `tool_result`: the call it answers and its content (a string or text blocks).
    #[serde(default)]
    pub tool_use_id: Option<String>,
    #[serde(default)]
    pub content: Option<Content>,
    /// `image`: `{"type": "base64", "media_type": …, "data": …}` or `{"type": "url", "url": …}`.
    #[serde(default)]
    pub source: Option<Value>,
}

/// A tool the model may call. Anthropic's server tools (`web_search_…`, `bash_…`) carry a
/// `type` and no schema; only client tools (`custom` or no type) can be served.
#[derive(Deserialize, Debug)]
pub struct Tool {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub input_schema: Option<Json>,
}

#[derive(Deserialize, Debug)]
pub struct ToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub disable_parallel_tool_use: Option<bool>,
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}`, `{"type": "adaptive"}` or
/// `{"type": "disabled"}`.
#[derive(Deserialize, Debug)]
pub struct Thinking {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub budget_tokens: Option<i64>,
}

/// `output_config`: `effort` (`low`, `medium`, `high`, `max`) and `format` (structured
/// outputs: `{"type": "json_schema", "schema": …}`).
#[derive(Deserialize, Debug)]
pub struct OutputConfig {
    #[serde(default)]
    pub effort: Option<String>,
    #[serde(default)]
    pub format: Option<Value>,
}
