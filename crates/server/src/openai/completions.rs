//! `/v1/completions`: the fields beyond [`super::SamplingFields`] and the response shapes.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `prompt`: text or token ids, one prompt or a batch.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdBatches(Vec<Vec<u32>>),
}

#[derive(Deserialize, Debug, Default)]
pub struct CompletionFields {
    pub prompt: Option<PromptField>,
    /// Number of alternatives per token (OpenAI allows 0..=5; vLLM up to its max, 20).
    pub logprobs: Option<i64>,
    #[serde(default)]
    pub echo: bool,
    pub suffix: Option<String>,
    pub add_special_tokens: Option<bool>,
}

#[derive(Serialize, Debug, Default, Clone, PartialEq)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    pub text_offset: Vec<usize>,
}

#[derive(Serialize, Debug, Clone)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Option<serde_json::Value>,
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// Both the whole response and each streamed chunk (`object` tells them apart in OpenAI's
/// API only by `choices` being deltas; both say `text_completion`).
#[derive(Serialize, Debug, Clone)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}
