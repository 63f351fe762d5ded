//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`): its
//! request translated into the chat request the V4 renderer takes ([`convert`]), the chat
//! parser's output turned into Anthropic's content blocks ([`blocks`]), its response, usage
//! and error shapes. Routes live in `routes/messages.rs`.

mod blocks;
mod convert;
mod error;
mod request;
mod response;

pub use blocks::{BlockDelta, BlockEvent, BlockStart, Blocks, ContentBlock, Whole};
pub use convert::{conversation, output_format, Conversation};
pub use error::error_body;
pub use request::MessagesRequest;
pub use response::{stop_reason, MessageResponse, MessageUsage};
