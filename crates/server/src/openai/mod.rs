//! OpenAI API shapes: request fields, responses, errors.

mod chat;
mod completions;
mod error;
mod parse;
mod sampling;

pub use chat::{
    ChatChoice, ChatCompletionResponse, ChatFields, ChatLogprob, ChatLogprobs, TopLogprob,
};
pub use completions::{
    CompletionChoice, CompletionFields, CompletionLogprobs, CompletionResponse, PromptField, Usage,
};
pub use error::ApiError;
pub use parse::{body_object, fields, fields_from_bytes};
pub use sampling::{
    check_sequences, resolve_max_tokens, OutputOptions, SamplingFields, StopField, StreamOptions,
    MAX_N, MAX_SEQUENCES,
};
