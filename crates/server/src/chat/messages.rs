//! OpenAI chat-completions request types: the messages and tool definitions `render_chat`
//! consumes. Only what the DeepSeek-V4 prompt uses is kept; unknown fields are ignored so any
//! OpenAI client's request deserialises. Validation that needs the message index (roles,
//! content part types, argument JSON) happens in the renderer, which names the offending field.
//!
//! Deserialise requests straight from the request bytes (`serde_json::from_slice`): tool schemas
//! and object-valued arguments keep their key order only then (a detour through
//! `serde_json::Value` sorts keys, and the prompt would no longer match the reference encoder).

use super::json::Json;
use serde::{Deserialize, Deserializer};

/// One message of an OpenAI chat request.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`; anything else is rejected by the
    /// renderer with the message index.
    pub role: String,
    /// A string, `null`/absent, or an array of content parts.
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// Assistant reasoning from an earlier turn (vLLM's name).
    #[serde(default)]
    pub reasoning: Option<String>,
    /// Assistant reasoning, DeepSeek API's name; used when `reasoning` is absent.
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// Tool calls of an assistant message; `null` reads as none.
    #[serde(default, deserialize_with = "null_as_default")]
    pub tool_calls: Vec<ToolCall>,
    /// For `tool` messages: the id of the call this result answers (orders parallel results).
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// Participant / tool name; accepted for compatibility, not rendered by V4.
    #[serde(default)]
    pub name: Option<String>,
}

impl ChatMessage {
    /// The reasoning text, preferring `reasoning` over `reasoning_content` as vLLM does.
    pub fn reasoning_text(&self) -> Option<&str> {
        self.reasoning
            .as_deref()
            .or(self.reasoning_content.as_deref())
    }
}

/// OpenAI message content: a plain string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One element of an array `content`. Strings are accepted as bare text parts (vLLM does).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ContentPart {
    Text(String),
    Typed(TypedPart),
}

/// `{"type": "text", "text": "..."}`, `{"type": "image_url", "image_url": {"url": "..."}}`
/// and friends. Other types (audio, files, …) are kept here only so the renderer can reject
/// them with a precise error.
#[derive(Debug, Clone, Deserialize)]
pub struct TypedPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    /// OpenAI's `{"url": ..., "detail": ...}`, or the bare URL string vLLM also takes.
    #[serde(default)]
    pub image_url: Option<serde_json::Value>,
    /// The request field a part converted from another API came from (an Anthropic `image`
    /// block, a Responses `input_image`): what errors about it name.
    #[serde(skip)]
    pub origin: Option<String>,
}

impl TypedPart {
    pub fn text(text: &str) -> Self {
        Self {
            kind: "text".into(),
            text: Some(text.to_owned()),
            image_url: None,
            origin: None,
        }
    }

    /// An `image_url` part converted from the request field `origin`.
    pub fn image(url: String, origin: String) -> Self {
        Self {
            kind: "image_url".into(),
            text: None,
            image_url: Some(serde_json::Value::String(url)),
            origin: Some(origin),
        }
    }

    /// The URL of an image part (`None`: not an image part, or no URL in it).
    pub fn image_url(&self) -> Option<&str> {
        match self.image_url.as_ref()? {
            serde_json::Value::String(s) => Some(s),
            v => v.get("url")?.as_str(),
        }
    }
}

/// Every image URL of `messages`, in the order their placeholders render, each with the
/// field it came from (`messages[i].content[j]`). Only user messages take images (the
/// renderer refuses them elsewhere).
pub fn image_urls(messages: &[ChatMessage]) -> Vec<(String, Option<&str>)> {
    let mut out = Vec::new();
    for (i, m) in messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == "user")
    {
        if let Some(MessageContent::Parts(parts)) = &m.content {
            for (j, p) in parts.iter().enumerate() {
                if let ContentPart::Typed(t) = p {
                    if t.kind == "image_url" {
                        let field = t
                            .origin
                            .clone()
                            .unwrap_or_else(|| format!("messages[{i}].content[{j}]"));
                        out.push((field, t.image_url()));
                    }
                }
            }
        }
    }
    out
}

/// An assistant tool call, OpenAI shape.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ToolCall {
    #[serde(default)]
    pub id: Option<String>,
    /// Must be `"function"` when present.
    #[serde(default)]
    pub r#type: Option<String>,
    pub function: FunctionCall,
}

/// The function part of a tool call.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON object text. An object sent instead of a string is accepted (vLLM does) and kept
    /// as its JSON text in the sent key order; `null`/absent means `{}`.
    #[serde(default, deserialize_with = "arguments_text")]
    pub arguments: String,
}

/// A tool definition from the request's `tools`.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolDef {
    /// Must be `"function"`.
    #[serde(default = "function_type")]
    pub r#type: String,
    pub function: FunctionDef,
}

/// A function schema. Rendered into the system prompt the way vLLM serialises its pydantic
/// model: `name`, `description` (null when absent), `parameters` (null when absent), then
/// `strict` only when given; other fields are dropped.
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// JSON schema, key order preserved.
    #[serde(default)]
    pub parameters: Option<Json>,
    #[serde(default)]
    pub strict: Option<bool>,
}

fn function_type() -> String {
    "function".into()
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn arguments_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match Option::<Json>::deserialize(d)? {
        None | Some(Json::Null) => String::new(),
        Some(Json::Str(s)) => s,
        Some(other) => other.to_python_json(),
    })
}
