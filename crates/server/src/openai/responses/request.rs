//! OpenAI Responses request shapes (`POST /v1/responses`). Items are read loosely (one struct
//! for every item type) so the translation can refuse what it cannot serve with the item's
//! path; unknown fields (`include`, `prompt_cache_key`, `client_metadata`, `truncation`, …)
//! are ignored. Read from the body bytes, so function schemas keep their key order.

use crate::chat::Json;
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize, Debug)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Input,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// vLLM's extension, as on Chat Completions.
    pub top_k: Option<i64>,
    #[serde(default)]
    pub reasoning: Option<Reasoning>,
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    pub stream: Option<bool>,
    #[serde(default)]
    pub background: Option<bool>,
    /// `text.format`: only `{"type": "text"}` until structured outputs exist.
    #[serde(default)]
    pub text: Option<Value>,
    #[serde(default)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub chat_template_kwargs: Option<Value>,
}

/// `input`: a string (one user message) or a list of items.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<Item>),
}

/// One input item: a message (`type` "message" or absent, with `role`), a `function_call`,
/// a `function_call_output` or a `reasoning` item.
#[derive(Deserialize, Debug, Default)]
pub struct Item {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub arguments: Option<String>,
    /// `function_call_output`: a string or a list of text parts.
    #[serde(default)]
    pub output: Option<Content>,
    /// `reasoning`: its summary parts (the text is read from `content` first, as vLLM does).
    #[serde(default)]
    pub summary: Option<Vec<Part>>,
    #[serde(default)]
    pub encrypted_content: Option<String>,
}

/// Message content: a string or a list of parts.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

/// `input_text`, `output_text`, `reasoning_text`, `summary_text`, `input_image`, … parts.
#[derive(Deserialize, Debug)]
pub struct Part {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub text: Option<String>,
    /// `input_image`: the image's URL (a data URL; its `file_id` alternative is not served).
    #[serde(default)]
    pub image_url: Option<String>,
}

/// A tool: `function` (flat: name, description, parameters), or a `namespace` of functions
/// (Codex sends these). Built-in tools (`web_search`, `file_search`, …) run on OpenAI's
/// servers, not here.
#[derive(Deserialize, Debug)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Json>,
    #[serde(default)]
    pub strict: Option<bool>,
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
}

#[derive(Deserialize, Debug)]
pub struct Reasoning {
    #[serde(default)]
    pub effort: Option<String>,
}
