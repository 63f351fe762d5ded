//! Why a request's messages cannot be rendered. Each message names the offending field by its
//! JSON path in the request so the server can return it as a 400 as is.

/// A conversation the V4 format cannot express.
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
}
