//! OpenAI API shapes: request fields, responses, errors.

mod completions;
mod error;
mod parse;
mod sampling;

pub use completions::{
    CompletionChoice, CompletionFields, CompletionLogprobs, CompletionResponse, PromptField, Usage,
};
pub use error::ApiError;
pub use parse::{body_object, fields};
pub use sampling::{
    resolve_max_tokens, OutputOptions, SamplingFields, StopField, StreamOptions, MAX_N,
};
