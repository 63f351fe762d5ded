//! DeepSeek-V4 chat format: rendering OpenAI chat requests into the prompt text, and parsing
//! the model's output back into reasoning, content and tool calls.
//!
//! DeepSeek-V4 ships no Jinja chat template; the reference is DeepSeek's Python encoder as
//! vLLM carries it (`vllm/tokenizers/deepseek_v4_encoding.py`) together with vLLM's request
//! handling for it (which fields it reads, where request tools go, how `reasoning_effort` and
//! `chat_template_kwargs` pick thinking mode). `tests/fixtures/chat_cases.json`, generated from
//! that encoder by `tools/make_chat_fixtures.py`, pins the rendering byte for byte.
//!
//! * [`render_chat`] — messages + tools + [`RenderOptions`] → prompt text (BOS included,
//!   ending with the generation prompt). Tokenize it without adding special tokens.
//! * [`ChatOutputParser`] — streaming: decoded output text in, [`ChatDelta`]s out.
//! * [`parse_chat_output`] — the same for a whole output.
//!
//! The markers are single tokens of the V4 tokenizer, and only BOS/EOS are `special`, so
//! output decoded with `skip_special_tokens` still carries `<think>`, `</think>` and the DSML
//! tags the parser needs (see [`tokens`]).

mod conversation;
mod dsml;
mod error;
mod json;
mod markers;
mod messages;
mod options;
mod parser;
mod render;
pub mod tokens;
mod tools_prompt;

pub use error::ChatError;
pub use json::Json;
pub use messages::{
    image_urls, ChatMessage, ContentPart, FunctionCall, FunctionDef, MessageContent, ToolCall,
    ToolDef, TypedPart,
};
pub use options::{EncoderEffort, ReasoningEffort, RenderOptions};
pub use parser::{
    collect_deltas, parse_chat_output, ChatDelta, ChatOutputParser, ParsedOutput, ParsedToolCall,
};
pub use render::render_chat;
