//! Why a request's messages cannot be rendered. Each message names the offending field by its
//! JSON path in the request so the server can return it as a 400 as is.

/// A conversation the model's chat format cannot express.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatError {
    #[error("messages: at least one message is required")]
    NoMessages,
    #[error(
        "messages[{index}].role: unknown role {role:?} (expected system, developer, user, \
         assistant or tool)"
    )]
    UnknownRole { index: usize, role: String },
    #[error(
        "messages[{index}].content[{part}]: content part type {kind:?} is not supported \
         (only text parts, and image_url parts in user messages)"
    )]
    UnsupportedContentPart {
        index: usize,
        part: usize,
        kind: String,
    },
    #[error("messages[{index}].content: a developer message needs non-empty content")]
    EmptyDeveloperContent { index: usize },
    #[error(
        "messages[{index}].tool_calls[{call}].type: {kind:?} is not supported (only \"function\")"
    )]
    UnsupportedToolCallType {
        index: usize,
        call: usize,
        kind: String,
    },
    #[error("messages[{index}].tool_calls[{call}].function.arguments: {reason}")]
    InvalidToolArguments {
        index: usize,
        call: usize,
        reason: String,
    },
    #[error(
        "messages[{index}]: the conversation ends with an assistant message; DeepSeek-V4 has no \
         way to continue it (the turn would be closed with end-of-sentence)"
    )]
    TrailingAssistant { index: usize },
    #[error("tools[{index}].type: {kind:?} is not supported (only \"function\")")]
    UnsupportedToolType { index: usize, kind: String },
    #[error(
        "messages[{index}]: the text holds the image placeholder <｜deepseek_image｜>; send \
         images as image parts"
    )]
    PlaceholderInText { index: usize },
    /// An effort the model's family does not take; `field` is the request field it came from.
    #[error("{field}: {reason}")]
    InvalidEffort { field: &'static str, reason: String },
}

impl ChatError {
    /// The request field a 400 for this error names.
    pub fn param(&self) -> &'static str {
        match self {
            ChatError::InvalidEffort { field, .. } => field,
            ChatError::UnsupportedToolType { .. } => "tools",
            _ => "messages",
        }
    }
}
