//! An Anthropic Messages request → the chat request the V4 renderer takes (the same messages,
//! tools and options an OpenAI request is read into), validated here with Anthropic's field
//! paths. Follows vLLM's translation (`entrypoints/anthropic/serving.py`) where it has one:
//! system blocks joined, `tool_result` blocks as tool messages ahead of the user's text,
//! `thinking` blocks as the assistant's reasoning, `redacted_thinking` skipped, `image` blocks
//! as image parts of the user's message (a tool result's images as a user message right after
//! its tool message, since only user messages hold images). Beyond it:
//! the `thinking` field chooses V4's thinking mode, and a trailing assistant message is a
//! prefill the answer continues (chat mode only, as Anthropic allows).

use super::request::{Block, Content, MessagesRequest, SystemField, Tool};
use crate::chat::{
    ChatMessage, ContentPart, FunctionCall, FunctionDef, Json, MessageContent, RenderOptions,
    ToolCall, ToolDef, TypedPart,
};
use crate::openai::ApiError;
use crate::structured::{flat_format, one_of, Forced, Requested};
use serde_json::Value;

/// Claude Code starts its system prompt with a block naming a per-request hash; kept, it
/// would make every turn's prompt differ from its first token and defeat prefix caching
/// (vLLM drops it for the same reason).
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// What a Messages request renders as.
#[derive(Debug)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolDef>,
    pub opts: RenderOptions,
    /// Whether tool calls are parsed out of the answer (tools given, `tool_choice` not none).
    pub parse_tools: bool,
    /// `tool_choice.disable_parallel_tool_use`: only the first call is returned.
    pub single_tool_call: bool,
    /// A call the answer must make (`tool_choice` `any` or `tool`).
    pub forced: Option<Forced>,
    /// A trailing assistant message's text, which the answer continues.
    pub prefill: Option<String>,
}

/// The structured-output format a Messages request asks for (`output_config.format`, or the
/// beta's `output_format`).
pub fn output_format(req: &MessagesRequest) -> Result<Option<Requested>, ApiError> {
    let mut found = Vec::new();
    if let Some(f) = req.output_config.as_ref().and_then(|o| o.format.as_ref()) {
        found.extend(flat_format(f, "output_config.format")?);
    }
    if let Some(f) = &req.output_format {
        found.extend(flat_format(f, "output_format")?);
    }
    one_of(found)
}

pub fn conversation(req: &MessagesRequest) -> Result<Conversation, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    let opts = render_options(req)?;
    let tools = tools(req.tools.as_deref().unwrap_or_default())?;
    let (parse_tools, single_tool_call, forced) = tool_choice(req, &tools)?;
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    let mut system = system_text(req.system.as_ref(), "system")?;
    for (i, m) in req.messages.iter().enumerate() {
        if m.role == "system" {
            // vLLM folds system messages into the system prompt; Anthropic has none.
            system.push_str(&content_text(
                &m.content,
                &format!("messages[{i}].content"),
            )?);
        }
    }
    if !system.is_empty() {
        messages.push(plain("system", system));
    }
    for (i, m) in req.messages.iter().enumerate() {
        let path = format!("messages[{i}]");
        match m.role.as_str() {
            "system" => {}
            "user" => user_message(&m.content, &path, &mut messages)?,
            "assistant" => messages.push(assistant_message(&m.content, &path)?),
            other => {
                return Err(ApiError::invalid(
                    format!("{path}.role"),
                    format!("unknown role {other:?} (expected \"user\" or \"assistant\")"),
                ))
            }
        }
    }
    let prefill = take_prefill(&mut messages, &opts, req.messages.len() - 1)?;
    Ok(Conversation {
        messages,
        tools,
        opts,
        parse_tools,
        single_tool_call,
        forced,
        prefill,
    })
}

/// `thinking` enabled (or adaptive) is V4's thinking mode; absent or disabled is chat mode,
/// as on Anthropic's API, where thinking is off unless asked for. `output_config.effort`
/// picks the level; vLLM's `chat_template_kwargs` still override both.
fn render_options(req: &MessagesRequest) -> Result<RenderOptions, ApiError> {
    let thinking = match &req.thinking {
        None => false,
        Some(t) => match t.kind.as_str() {
            "enabled" | "adaptive" => {
                if let Some(b) = t.budget_tokens.filter(|&b| b < 1) {
                    return Err(ApiError::invalid(
                        "thinking.budget_tokens",
                        format!("`thinking.budget_tokens` must be >= 1, got {b}"),
                    ));
                }
                true
            }
            "disabled" => false,
            other => {
                return Err(ApiError::invalid(
                    "thinking.type",
                    format!("`thinking.type` must be \"enabled\", \"adaptive\" or \"disabled\", got {other:?}"),
                ))
            }
        },
    };
    let kwargs = req.chat_template_kwargs.as_ref();
    let mut opts = crate::openai::render_options(None, kwargs)?;
    // The effort field wins over the kwargs' (as a request effort does in vLLM's merge).
    if let Some(effort) = req.output_config.as_ref().and_then(|o| o.effort.as_deref()) {
        let named = crate::openai::render_options(Some((effort, "output_config.effort")), None)?;
        opts.effort = named.effort;
    }
    let chosen = |k| kwargs.is_some_and(|v| v.get(k).is_some());
    if !chosen("thinking") && !chosen("enable_thinking") {
        opts.thinking = thinking;
    }
    Ok(opts)
}

fn tools(tools: &[Tool]) -> Result<Vec<ToolDef>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
                return Err(ApiError::invalid(
                    format!("tools[{i}].type"),
                    format!("tool type {kind:?} is not supported: only client tools (\"custom\", with an `input_schema`) can run here"),
                ));
            }
            if !matches!(t.input_schema, Some(Json::Object(_))) {
                return Err(ApiError::invalid(
                    format!("tools[{i}].input_schema"),
                    format!("tool {:?} needs an `input_schema` object", t.name),
                ));
            }
            Ok(ToolDef {
                r#type: "function".into(),
                function: FunctionDef {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    parameters: t.input_schema.clone(),
                    strict: None,
                },
            })
        })
        .collect()
}

/// `(parse tool calls, only the first call, a forced call)`: `any` forces a call of some
/// tool, `tool` one of the named tool (their arguments held to the tool's schema).
fn tool_choice(
    req: &MessagesRequest,
    tools: &[ToolDef],
) -> Result<(bool, bool, Option<Forced>), ApiError> {
    let Some(tc) = &req.tool_choice else {
        return Ok((!tools.is_empty(), false, None));
    };
    let single = tc.disable_parallel_tool_use.unwrap_or(false);
    let forced = match tc.kind.as_str() {
        "auto" => None,
        "none" => return Ok((false, single, None)),
        "any" => Some(Forced::Any { parallel: !single }),
        "tool" => {
            let name = tc.name.clone().ok_or_else(|| {
                ApiError::invalid(
                    "tool_choice.name",
                    "`tool_choice` of type \"tool\" needs `name`",
                )
            })?;
            Some(Forced::Named(name))
        }
        other => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!(
                "`tool_choice.type` must be \"auto\", \"any\", \"tool\" or \"none\", got {other:?}"
            ),
            ))
        }
    };
    Ok((!tools.is_empty(), single, forced))
}

fn plain(role: &str, text: String) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content: Some(MessageContent::Text(text)),
        ..Default::default()
    }
}

/// The system prompt's text: a string, or text blocks joined as vLLM joins them (nothing
/// between), Claude Code's billing header left out.
fn system_text(system: Option<&SystemField>, path: &str) -> Result<String, ApiError> {
    match system {
        None => Ok(String::new()),
        Some(SystemField::Text(s)) => Ok(s.clone()),
        Some(SystemField::Blocks(blocks)) => {
            let mut out = String::new();
            for (j, b) in blocks.iter().enumerate() {
                let text = text_block(b, &format!("{path}[{j}]"))?;
                if !text.starts_with(BILLING_HEADER) {
                    out.push_str(text);
                }
            }
            Ok(out)
        }
    }
}

fn text_block<'a>(b: &'a Block, path: &str) -> Result<&'a str, ApiError> {
    if b.kind != "text" {
        return Err(unsupported_block(b, path));
    }
    b.text
        .as_deref()
        .ok_or_else(|| ApiError::invalid(format!("{path}.text"), "a text block needs `text`"))
}

/// Text-only content (system messages, tool results): blocks joined with newlines.
fn content_text(content: &Content, path: &str) -> Result<String, ApiError> {
    match content {
        Content::Text(s) => Ok(s.clone()),
        Content::Blocks(blocks) => {
            let texts = blocks
                .iter()
                .enumerate()
                .map(|(j, b)| text_block(b, &format!("{path}[{j}]")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(texts.join("\n"))
        }
    }
}

fn unsupported_block(b: &Block, path: &str) -> ApiError {
    let why = match b.kind.as_str() {
        "document" => "this server takes no documents",
        "image" => "images go in user messages and tool results",
        _ => "it is not a block this message can hold here",
    };
    ApiError::invalid(
        format!("{path}.type"),
        format!("content block type {:?} is not supported: {why}", b.kind),
    )
}

/// A user message: its `tool_result` blocks become tool messages (first, in their order, each
/// followed by a user message of its images), its text and image blocks one user message
/// after them.
fn user_message(content: &Content, path: &str, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let blocks = match content {
        Content::Text(s) => {
            out.push(plain("user", s.clone()));
            return Ok(());
        }
        Content::Blocks(blocks) => blocks,
    };
    let mut parts = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let bpath = format!("{path}.content[{j}]");
        match b.kind.as_str() {
            "text" => parts.push(text_part(text_block(b, &bpath)?)),
            "image" => parts.push(image_part(b, &bpath)?),
            "tool_result" => tool_result(b, &bpath, out)?,
            _ => return Err(unsupported_block(b, &bpath)),
        }
    }
    if !parts.is_empty() {
        out.push(user_parts(parts));
    }
    Ok(())
}

/// A `tool_result` block: a tool message of its text, and its images in a user message after
/// it (vLLM's `_convert_user_tool_result`).
fn tool_result(b: &Block, path: &str, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let id = b.tool_use_id.clone().ok_or_else(|| {
        ApiError::invalid(
            format!("{path}.tool_use_id"),
            "a tool_result block needs `tool_use_id`",
        )
    })?;
    let cpath = format!("{path}.content");
    let (text, images) = match &b.content {
        None => (String::new(), Vec::new()),
        Some(Content::Text(s)) => (s.clone(), Vec::new()),
        Some(Content::Blocks(blocks)) => {
            let (mut texts, mut images) = (Vec::new(), Vec::new());
            for (k, inner) in blocks.iter().enumerate() {
                let ipath = format!("{cpath}[{k}]");
                match inner.kind.as_str() {
                    "image" => images.push(image_part(inner, &ipath)?),
                    _ => texts.push(text_block(inner, &ipath)?),
                }
            }
            (texts.join("\n"), images)
        }
    };
    out.push(ChatMessage {
        tool_call_id: Some(id),
        ..plain("tool", text)
    });
    if !images.is_empty() {
        out.push(user_parts(images));
    }
    Ok(())
}

fn user_parts(parts: Vec<ContentPart>) -> ChatMessage {
    ChatMessage {
        role: "user".into(),
        content: Some(MessageContent::Parts(parts)),
        ..Default::default()
    }
}

/// An `image` block as an image part: a base64 source as a data URL, a URL source as its URL
/// (vLLM's `_convert_image_source_to_url`); the image is read where the prompt is built.
fn image_part(b: &Block, path: &str) -> Result<ContentPart, ApiError> {
    let source = b.source.as_ref().filter(|s| s.is_object()).ok_or_else(|| {
        ApiError::invalid(
            format!("{path}.source"),
            "an image block needs a `source` object",
        )
    })?;
    let field = |name: &str| source.get(name).and_then(Value::as_str);
    let url = match field("type") {
        Some("base64") => match (field("media_type"), field("data")) {
            (Some(media), Some(data)) => format!("data:{media};base64,{data}"),
            _ => {
                return Err(ApiError::invalid(
                    format!("{path}.source"),
                    "a base64 image source needs `media_type` and `data`",
                ))
            }
        },
        Some("url") => field("url")
            .ok_or_else(|| {
                ApiError::invalid(
                    format!("{path}.source.url"),
                    "a url image source needs `url`",
                )
            })?
            .to_owned(),
        _ => {
            return Err(ApiError::invalid(
                format!("{path}.source.type"),
                format!(
                    "image source type {} is not supported (\"base64\" or \"url\")",
                    source.get("type").unwrap_or(&Value::Null)
                ),
            ))
        }
    };
    Ok(ContentPart::Typed(TypedPart::image(url, path.to_owned())))
}

fn text_part(text: &str) -> ContentPart {
    ContentPart::Typed(TypedPart::text(text))
}

/// An assistant message: text blocks as content, thinking blocks as its reasoning, tool_use
/// blocks as its calls (the input object's text in the order sent).
fn assistant_message(content: &Content, path: &str) -> Result<ChatMessage, ApiError> {
    let blocks = match content {
        Content::Text(s) => return Ok(plain("assistant", s.clone())),
        Content::Blocks(blocks) => blocks,
    };
    let (mut texts, mut reasoning, mut calls) = (Vec::new(), None::<String>, Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let bpath = format!("{path}.content[{j}]");
        match b.kind.as_str() {
            "text" => texts.push(text_part(text_block(b, &bpath)?)),
            "thinking" => reasoning
                .get_or_insert_default()
                .push_str(b.thinking.as_deref().unwrap_or_default()),
            "redacted_thinking" => {}
            "tool_use" => calls.push(tool_use(b, &bpath)?),
            _ => return Err(unsupported_block(b, &bpath)),
        }
    }
    Ok(ChatMessage {
        role: "assistant".into(),
        content: Some(MessageContent::Parts(texts)),
        reasoning,
        tool_calls: calls,
        ..Default::default()
    })
}

fn tool_use(b: &Block, path: &str) -> Result<ToolCall, ApiError> {
    let name = b.name.clone().ok_or_else(|| {
        ApiError::invalid(format!("{path}.name"), "a tool_use block needs `name`")
    })?;
    let arguments = match &b.input {
        None => String::new(),
        Some(input @ Json::Object(_)) => input.to_python_json(),
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{path}.input"),
                "a tool_use block's `input` must be an object",
            ))
        }
    };
    Ok(ToolCall {
        id: b.id.clone(),
        r#type: Some("function".into()),
        function: FunctionCall { name, arguments },
    })
}

/// A trailing assistant message is a prefill: it is taken off the conversation and its text
/// appended after the assistant opener, so the answer continues it. V4 can only continue
/// plain text in chat mode (as Anthropic, which refuses a prefill with thinking on).
fn take_prefill(
    messages: &mut Vec<ChatMessage>,
    opts: &RenderOptions,
    last: usize,
) -> Result<Option<String>, ApiError> {
    if messages.last().is_none_or(|m| m.role != "assistant") {
        return Ok(None);
    }
    let m = messages.pop().expect("checked above");
    let path = format!("messages[{last}]");
    if opts.thinking_mode() {
        return Err(ApiError::invalid(
            path,
            "a final assistant message (a prefill) cannot be continued with thinking enabled",
        ));
    }
    if !m.tool_calls.is_empty() || m.reasoning.is_some() {
        return Err(ApiError::invalid(
            path,
            "a final assistant message (a prefill) may hold only text",
        ));
    }
    let text = match m.content {
        Some(MessageContent::Text(s)) => s,
        Some(MessageContent::Parts(parts)) => parts
            .into_iter()
            .filter_map(|p| match p {
                ContentPart::Typed(t) => t.text,
                ContentPart::Text(s) => Some(s),
            })
            .collect(),
        None => String::new(),
    };
    // Anthropic refuses trailing whitespace in a prefill; V4 just continues the text.
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatFormat, Effort, ReasoningEffort};
    use crate::openai::ChatFields;

    fn request(body: &str) -> MessagesRequest {
        serde_json::from_str(body).unwrap()
    }

    /// The prompt a Messages request renders, with its prefill.
    fn rendered(body: &str) -> String {
        let c = conversation(&request(body)).unwrap();
        ChatFormat::V4
            .render(&c.messages, &c.tools, &c.opts)
            .unwrap()
            + c.prefill.as_deref().unwrap_or("")
    }

    /// The prompt the same conversation renders as an OpenAI chat request: that path is
    /// pinned byte for byte to DeepSeek's encoder (tests/fixtures/chat_cases.json).
    fn rendered_openai(body: &str) -> String {
        let f: ChatFields = serde_json::from_str(body).unwrap();
        let kwargs = serde_json::from_str::<Value>(body).unwrap()["chat_template_kwargs"].clone();
        let opts = RenderOptions::from_openai(None, Some(&kwargs));
        ChatFormat::V4
            .render(&f.messages, f.tools.as_deref().unwrap_or_default(), &opts)
            .unwrap()
    }

    /// An agent's second turn: system blocks (Claude Code's billing header among them), a
    /// tool with its schema (key order kept), the assistant's reasoning, text and a call, the
    /// call's result beside the user's next words.
    #[test]
    fn an_agent_turn_renders_as_the_same_openai_conversation() {
        let anthropic = r#"{
            "model": "m", "max_tokens": 100, "thinking": {"type": "enabled", "budget_tokens": 2000},
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=9f3;"},
                       {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
                       {"type": "text", "text": " Be brief."}],
            "tools": [{"name": "read", "description": "Reads a file",
                       "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["path"]}}],
            "messages": [
                {"role": "user", "content": "Show me main.rs"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "I should read it.", "signature": "abc"},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "main.rs", "limit": 20}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "fn main() {}"}]},
                    {"type": "text", "text": "Now explain it."}]}
            ]}"#;
        let openai = r#"{
            "chat_template_kwargs": {"thinking": true},
            "tools": [{"type": "function", "function": {"name": "read", "description": "Reads a file",
                       "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["path"]}}}],
            "messages": [
                {"role": "system", "content": "You are a coding agent. Be brief."},
                {"role": "user", "content": "Show me main.rs"},
                {"role": "assistant", "reasoning_content": "I should read it.", "content": "Reading.",
                 "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "read", "arguments": "{\"path\": \"main.rs\", \"limit\": 20}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "fn main() {}"},
                {"role": "user", "content": "Now explain it."}
            ]}"#;
        let prompt = rendered(anthropic);
        assert_eq!(prompt, rendered_openai(openai));
        assert!(!prompt.contains("billing"), "{prompt}");
        assert!(prompt.ends_with("<｜Assistant｜><think>"), "{prompt}");
        let c = conversation(&request(anthropic)).unwrap();
        assert!(c.parse_tools && !c.single_tool_call && c.prefill.is_none());
    }

    /// Image blocks: a user message's beside its text, a tool result's after its tool
    /// message (vLLM's order); each keeps its Anthropic path for errors.
    #[test]
    fn images_render_as_the_openai_conversation_and_keep_their_paths() {
        let anthropic = r#"{"messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "taken"},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]},
                {"type": "text", "text": "And now?"}]}
        ]}"#;
        let openai = r#"{"chat_template_kwargs": {"thinking": false}, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "taken"},
            {"role": "user", "content": [{"type": "image_url", "image_url": "https://example.com/a.png"}]},
            {"role": "user", "content": "And now?"}
        ]}"#;
        assert_eq!(rendered(anthropic), rendered_openai(openai));
        let c = conversation(&request(anthropic)).unwrap();
        let urls = crate::chat::image_urls(&c.messages);
        assert_eq!(
            urls,
            [
                (
                    "messages[0].content[1]".to_owned(),
                    Some("data:image/png;base64,AAAA")
                ),
                (
                    "messages[2].content[0].content[1]".to_owned(),
                    Some("https://example.com/a.png")
                ),
            ]
        );
    }

    #[test]
    fn thinking_is_off_unless_asked_for_and_a_prefill_is_continued() {
        let body = r#"{"messages": [{"role": "user", "content": "Hi"},
                                    {"role": "assistant", "content": [{"type": "text", "text": "Hello, I"}]}]}"#;
        let prompt = rendered(body);
        assert!(
            prompt.ends_with("Hi<｜Assistant｜></think>Hello, I"),
            "{prompt}"
        );
        let plain = r#"{"messages": [{"role": "user", "content": "Hi"}], "thinking": {"type": "disabled"}}"#;
        assert!(rendered(plain).ends_with("Hi<｜Assistant｜></think>"));
        // vLLM's chat_template_kwargs still decide when given.
        let kw = r#"{"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"thinking": true}}"#;
        assert!(rendered(kw).ends_with("Hi<｜Assistant｜><think>"));
        let max = r#"{"messages": [{"role": "user", "content": "Hi"}], "thinking": {"type": "adaptive"},
                      "output_config": {"effort": "max"}}"#;
        assert_eq!(
            conversation(&request(max)).unwrap().opts.effort,
            Some((Effort::Named(ReasoningEffort::Max), "output_config.effort"))
        );
        let c = conversation(&request(
            r#"{"messages": [{"role": "user", "content": "Hi"}], "tools": [{"name": "t", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "none", "disable_parallel_tool_use": true}}"#,
        ))
        .unwrap();
        assert!(!c.parse_tools && c.single_tool_call);
    }

    /// Each refusal names the field by its path in the Anthropic request.
    #[test]
    fn what_cannot_be_served_is_refused_with_its_path() {
        let cases = [
            (r#"{"messages": []}"#, "messages"),
            (
                r#"{"messages": [{"role": "robot", "content": "x"}]}"#,
                "messages[0].role",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}"#,
                "messages[0].content[0].source.type",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image"}]}]}"#,
                "messages[0].content[0].source",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]}"#,
                "messages[0].content[0].source",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}"#,
                "messages[0].content[0].type",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]}"#,
                "messages[0].content[0].tool_use_id",
            ),
            (
                r#"{"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "t", "input": [1]}]}, {"role": "user", "content": "x"}]}"#,
                "messages[0].content[0].input",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "web_search"}]}"#,
                "tools[0].type",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "t"}]}"#,
                "tools[0].input_schema",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "t", "input_schema": {}}], "tool_choice": {"type": "tool"}}"#,
                "tool_choice.name",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "sometimes"}}"#,
                "thinking.type",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "output_config": {"effort": "huge"}}"#,
                "output_config.effort",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "thinking": {"type": "enabled"}}"#,
                "messages[1]",
            ),
            (
                r#"{"system": [{"type": "image"}], "messages": [{"role": "user", "content": "x"}]}"#,
                "system[0].type",
            ),
        ];
        for (body, param) in cases {
            let e = conversation(&request(body)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }
}
