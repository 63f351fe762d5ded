//! The chat formats of DeepSeek-V4 and V4.1: rendering OpenAI chat requests into the prompt
//! text, and parsing the model's output back into reasoning, content and tool calls.
//!
//! Neither family ships a Jinja chat template; the references are DeepSeek's Python encoders
//! as vLLM 0.33 carries them (`vllm/tokenizers/deepseek_v4_encoding.py`,
//! `deepseek_v41_encoding.py`) together with vLLM's request handling for them (which fields
//! it reads, where request tools go, how `reasoning_effort` and `chat_template_kwargs` pick
//! thinking mode and the effort). `tests/fixtures/chat_cases.json` and `chat_cases_v41.json`,
//! generated from those files by `tools/make_chat_fixtures.py` and
//! `tools/make_v41_chat_fixtures.py`, pin the rendering byte for byte.
//!
//! * [`ChatFormat`] — the family's format, chosen at load: [`ChatFormat::render`] turns
//!   messages + tools + [`RenderOptions`] into prompt text (BOS included, ending with the
//!   generation prompt; tokenize it without adding special tokens), [`ChatFormat::parser`]
//!   gives a [`ChatOutputParser`] (decoded output text in, [`ChatDelta`]s out).
//! * [`parse_chat_output`] — the parser over a whole output.
//!
//! The markers are single tokens of the V4 tokenizer, and only BOS/EOS are `special`, so
//! output decoded with `skip_special_tokens` still carries `<think>`, `</think>` and the DSML
//! tags the parser needs (see [`tokens`]).

mod conversation;
mod dsml;
mod error;
mod format;
mod json;
mod markers;
mod messages;
mod options;
mod parser;
mod render;
pub mod tokens;
mod tools_prompt;
mod v41;

pub use error::ChatError;
pub use format::ChatFormat;
pub use json::Json;
pub use messages::{
    image_urls, ChatMessage, ContentPart, FunctionCall, FunctionDef, MessageContent, ToolCall,
    ToolDef, TypedPart,
};
pub use options::{Effort, EncoderEffort, ReasoningEffort, RenderOptions, KWARGS_EFFORT};
pub use parser::{
    collect_deltas, parse_chat_output, ChatDelta, ChatOutputParser, ParsedOutput, ParsedToolCall,
};
pub use v41::effort_budget;
