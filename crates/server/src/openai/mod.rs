//! OpenAI API shapes: request fields, responses, errors.

mod chat;
mod completions;
mod error;
mod logit_bias;
mod parse;
pub mod responses;
mod sampling;

pub use chat::{
    render_options, tool_choice, ChatChoice, ChatCompletionResponse, ChatFields, ChatLogprob,
    ChatLogprobs, TopLogprob,
};
pub use completions::{
    CompletionChoice, CompletionFields, CompletionLogprobs, CompletionResponse, PromptField, Usage,
};
pub use error::ApiError;
pub use logit_bias::{LogitBias, MAX_LOGIT_BIAS};
pub use parse::fields;
pub use sampling::{
    check_sequences, n_samples, resolve_max_tokens, OutputOptions, SamplingFields, StopField,
    StreamOptions, MAX_N, MAX_SEQUENCES, MAX_STOP_BYTES, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS,
};
