//! OpenAI messages → the turn list both formats render.
//!
//! DeepSeek-V4 and V4.1 have no `tool` role: a tool result is a `<tool_result>` block inside a
//! user turn. Following the reference encoders (after vLLM's request preprocessing; V4.1's
//! differences are [`TurnRules`]):
//! * a `tool` message joins the previous turn if that is a user turn, else starts one; a `user`
//!   message likewise joins a preceding user turn as a text block (consecutive user messages
//!   become one turn whose blocks are separated by a blank line);
//! * within a user turn the tool results are reordered into the order of the calls of the last
//!   assistant message that made calls (results whose id is unknown sort first, stably);
//! * request-level tools attach to the first system message, or to an empty system message
//!   put in front when there is none;
//! * content parts are joined with `"\n\n"`, an image part being `<｜deepseek_image｜>` where
//!   it stands (V4's `flatten_content_blocks`, V4.1's `_normalize_messages`), except for V4's
//!   `tool` messages whose parts vLLM joins with `"\n"` before the encoder sees them.

use super::error::ChatError;
use super::json::Json;
use super::messages::{ChatMessage, ContentPart, MessageContent, ToolCall};
use super::tokens::IMAGE_PLACEHOLDER;
use std::collections::HashMap;

/// Where the families' message handling differs before their encoders render turns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TurnRules {
    /// Between a tool message's parts: V4 `"\n"` (vLLM's chat parsing), V4.1 `"\n\n"` (its
    /// `_normalize_messages` treats every role alike).
    pub tool_part_sep: &'static str,
    /// Call arguments that are not a JSON object: V4 refuses them (vLLM's parsing fails);
    /// V4.1 decodes a string up to twice and else wraps the text as `{"arguments": text}`
    /// (`encode_arguments_to_dsml`; `""` too).
    pub wrap_bad_arguments: bool,
    /// V4.1 refuses message text holding the image placeholder (`_reject_image_placeholder`).
    pub reject_placeholder: bool,
}

pub(crate) const V4_RULES: TurnRules = TurnRules {
    tool_part_sep: "\n",
    wrap_bad_arguments: false,
    reject_placeholder: false,
};

pub(crate) const V41_RULES: TurnRules = TurnRules {
    tool_part_sep: "\n\n",
    wrap_bad_arguments: true,
    reject_placeholder: true,
};

/// A block of a user turn.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Block {
    Text(String),
    ToolResult { call_id: String, content: String },
}

/// A tool call with its arguments parsed (key order kept).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Call {
    pub name: String,
    pub arguments: Vec<(String, Json)>,
}

/// One turn of the V4 conversation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Turn {
    /// `with_tools`: the request's tools are rendered after this system prompt.
    System {
        content: String,
        with_tools: bool,
    },
    Developer {
        content: String,
    },
    User {
        blocks: Vec<Block>,
    },
    Assistant {
        content: String,
        reasoning: Option<String>,
        calls: Vec<Call>,
        call_ids: Vec<Option<String>>,
    },
}

impl Turn {
    pub fn is_user_like(&self) -> bool {
        matches!(self, Turn::User { .. } | Turn::Developer { .. })
    }
}

/// Validates `messages` and builds the turn list (tool results merged and ordered).
pub(crate) fn build_turns(
    messages: &[ChatMessage],
    has_tools: bool,
    rules: &TurnRules,
) -> Result<Vec<Turn>, ChatError> {
    if messages.is_empty() {
        return Err(ChatError::NoMessages);
    }
    let mut turns: Vec<Turn> = Vec::with_capacity(messages.len() + 1);
    let mut tools_placed = false;
    for (index, msg) in messages.iter().enumerate() {
        if rules.reject_placeholder {
            reject_placeholder(index, msg)?;
        }
        match msg.role.as_str() {
            "system" => {
                let with_tools = has_tools && !tools_placed;
                tools_placed |= with_tools;
                turns.push(Turn::System {
                    content: content_text(index, &msg.content, "\n\n")?,
                    with_tools,
                });
            }
            "developer" => {
                let content = content_text(index, &msg.content, "\n\n")?;
                if content.is_empty() {
                    return Err(ChatError::EmptyDeveloperContent { index });
                }
                turns.push(Turn::Developer { content });
            }
            "user" => {
                let block = Block::Text(user_text(index, &msg.content)?);
                push_user_block(&mut turns, block);
            }
            "tool" => {
                let block = Block::ToolResult {
                    call_id: msg.tool_call_id.clone().unwrap_or_default(),
                    content: content_text(index, &msg.content, rules.tool_part_sep)?,
                };
                push_user_block(&mut turns, block);
            }
            "assistant" => turns.push(assistant_turn(index, msg, rules)?),
            other => {
                return Err(ChatError::UnknownRole {
                    index,
                    role: other.to_owned(),
                })
            }
        }
    }
    if has_tools && !tools_placed {
        turns.insert(
            0,
            Turn::System {
                content: String::new(),
                with_tools: true,
            },
        );
    }
    order_tool_results(&mut turns);
    Ok(turns)
}

fn push_user_block(turns: &mut Vec<Turn>, block: Block) {
    match turns.last_mut() {
        Some(Turn::User { blocks }) => blocks.push(block),
        _ => turns.push(Turn::User {
            blocks: vec![block],
        }),
    }
}

/// A user message's text: its parts in order joined with a blank line, each image part as
/// the placeholder the server later cuts the prompt at for the image's span.
fn user_text(index: usize, content: &Option<MessageContent>) -> Result<String, ChatError> {
    parts_text(index, content, "\n\n", true)
}

/// 400 for message text holding the image placeholder (V4.1): images come as image parts.
fn reject_placeholder(index: usize, msg: &ChatMessage) -> Result<(), ChatError> {
    let holds = |t: &str| t.contains(IMAGE_PLACEHOLDER);
    let in_parts = match &msg.content {
        Some(MessageContent::Text(s)) => holds(s),
        Some(MessageContent::Parts(parts)) => parts.iter().any(|p| match p {
            ContentPart::Text(s) => holds(s),
            ContentPart::Typed(t) => t.text.as_deref().is_some_and(holds),
        }),
        None => false,
    };
    if in_parts || msg.reasoning_text().is_some_and(holds) {
        return Err(ChatError::PlaceholderInText { index });
    }
    Ok(())
}

/// The text of a message's content; array parts are joined with `sep`.
fn content_text(
    index: usize,
    content: &Option<MessageContent>,
    sep: &str,
) -> Result<String, ChatError> {
    parts_text(index, content, sep, false)
}

/// [`content_text`], with image parts as placeholders where the message may hold them
/// (refused where `images` is false: the engine places images in user turns only).
fn parts_text(
    index: usize,
    content: &Option<MessageContent>,
    sep: &str,
    images: bool,
) -> Result<String, ChatError> {
    let parts = match content {
        None => return Ok(String::new()),
        Some(MessageContent::Text(s)) => return Ok(s.clone()),
        Some(MessageContent::Parts(parts)) => parts,
    };
    let mut texts: Vec<&str> = Vec::with_capacity(parts.len());
    for (part, p) in parts.iter().enumerate() {
        match p {
            ContentPart::Text(s) => texts.push(s),
            ContentPart::Typed(t)
                if matches!(t.kind.as_str(), "text" | "input_text" | "output_text") =>
            {
                // vLLM skips a text part whose text is null.
                if let Some(s) = &t.text {
                    texts.push(s);
                }
            }
            ContentPart::Typed(t) if t.kind == "image_url" && images => {
                texts.push(IMAGE_PLACEHOLDER);
            }
            ContentPart::Typed(t) => {
                return Err(ChatError::UnsupportedContentPart {
                    index,
                    part,
                    kind: t.kind.clone(),
                })
            }
        }
    }
    Ok(texts.join(sep))
}

fn assistant_turn(index: usize, msg: &ChatMessage, rules: &TurnRules) -> Result<Turn, ChatError> {
    let mut calls = Vec::with_capacity(msg.tool_calls.len());
    let mut call_ids = Vec::with_capacity(msg.tool_calls.len());
    for (call, tc) in msg.tool_calls.iter().enumerate() {
        calls.push(parse_call(index, call, tc, rules)?);
        call_ids.push(tc.id.clone());
    }
    Ok(Turn::Assistant {
        content: content_text(index, &msg.content, "\n\n")?,
        reasoning: msg.reasoning_text().map(str::to_owned),
        calls,
        call_ids,
    })
}

fn parse_call(
    index: usize,
    call: usize,
    tc: &ToolCall,
    rules: &TurnRules,
) -> Result<Call, ChatError> {
    if let Some(kind) = tc.r#type.as_deref().filter(|k| *k != "function") {
        return Err(ChatError::UnsupportedToolCallType {
            index,
            call,
            kind: kind.to_owned(),
        });
    }
    let invalid = |reason: String| ChatError::InvalidToolArguments {
        index,
        call,
        reason,
    };
    if rules.wrap_bad_arguments {
        return Ok(Call {
            name: tc.function.name.clone(),
            arguments: wrapped_arguments(&tc.function.arguments),
        });
    }
    // Empty arguments mean no arguments (vLLM turns "" into {}).
    let arguments = if tc.function.arguments.is_empty() {
        Vec::new()
    } else {
        match Json::parse(&tc.function.arguments) {
            Ok(Json::Object(entries)) => entries,
            Ok(_) => return Err(invalid("must be a JSON object".into())),
            Err(e) => return Err(invalid(format!("invalid JSON: {e}"))),
        }
    };
    Ok(Call {
        name: tc.function.name.clone(),
        arguments,
    })
}

/// V4.1's reading of call arguments: a JSON object, or a string holding one (decoded up to
/// twice), else `{"arguments": text}` with the text as given.
fn wrapped_arguments(text: &str) -> Vec<(String, Json)> {
    let mut value = Json::Str(text.to_owned());
    for _ in 0..2 {
        match &value {
            Json::Str(s) => match Json::parse(s) {
                Ok(v) => value = v,
                Err(_) => break,
            },
            _ => break,
        }
    }
    match value {
        Json::Object(entries) => entries,
        _ => vec![("arguments".to_owned(), Json::Str(text.to_owned()))],
    }
}

/// Reorders the tool results of each user turn into the call order of the most recent
/// assistant turn with calls (only when a turn has several results and the calls had ids).
fn order_tool_results(turns: &mut [Turn]) {
    let mut order: HashMap<String, usize> = HashMap::new();
    for turn in turns.iter_mut() {
        match turn {
            Turn::Assistant { call_ids, .. } if !call_ids.is_empty() => {
                order.clear();
                for (i, id) in call_ids.iter().enumerate() {
                    if let Some(id) = id.as_deref().filter(|id| !id.is_empty()) {
                        order.insert(id.to_owned(), i);
                    }
                }
            }
            Turn::User { blocks } => {
                let is_result = |b: &Block| matches!(b, Block::ToolResult { .. });
                if order.is_empty() || blocks.iter().filter(|b| is_result(b)).count() < 2 {
                    continue;
                }
                let rank = |b: &Block| match b {
                    Block::ToolResult { call_id, .. } => order.get(call_id).copied().unwrap_or(0),
                    Block::Text(_) => 0,
                };
                let mut results: Vec<Block> =
                    blocks.iter().filter(|b| is_result(b)).cloned().collect();
                results.sort_by_key(rank); // stable, like Python's sorted
                let mut results = results.into_iter();
                for b in blocks.iter_mut().filter(|b| is_result(b)) {
                    if let Some(r) = results.next() {
                        *b = r;
                    }
                }
            }
            _ => {}
        }
    }
}
