//! `/v1/completions`: the fields beyond [`super::SamplingFields`] and the response shapes.

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// `prompt`: text or token ids, one prompt or a batch. Read by its first element, straight
/// into its final form (an untagged enum would first copy the whole prompt into serde's
/// generic buffer and then try each shape on it).
#[derive(Debug, Clone)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdBatches(Vec<Vec<u32>>),
}

impl<'de> Deserialize<'de> for PromptField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PromptVisitor)
    }
}

struct PromptVisitor;

/// One element of a prompt list, which decides what the list is.
enum Element {
    Text(String),
    Id(u32),
    Ids(Vec<u32>),
}

impl<'de> Deserialize<'de> for Element {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Element;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, a token id or a list of token ids")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Element, E> {
                Ok(Element::Text(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Element, E> {
                Ok(Element::Text(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Element, E> {
                u32::try_from(v)
                    .map(Element::Id)
                    .map_err(|_| E::custom(format!("token id {v} does not fit in 32 bits")))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Element, A::Error> {
                Vec::<u32>::deserialize(de::value::SeqAccessDeserializer::new(seq))
                    .map(Element::Ids)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Visitor<'de> for PromptVisitor {
    type Value = PromptField;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string, a list of strings, a list of token ids or a list of such lists")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<PromptField, E> {
        Ok(PromptField::Text(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<PromptField, E> {
        Ok(PromptField::Text(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PromptField, A::Error> {
        let mismatch = || de::Error::custom("every element of `prompt` must have the same type");
        let Some(first) = seq.next_element::<Element>()? else {
            return Ok(PromptField::Texts(Vec::new()));
        };
        Ok(match first {
            Element::Text(t) => {
                let mut all = vec![t];
                while let Some(e) = seq.next_element::<Element>()? {
                    let Element::Text(t) = e else {
                        return Err(mismatch());
                    };
                    all.push(t);
                }
                PromptField::Texts(all)
            }
            Element::Id(id) => {
                let mut all = vec![id];
                while let Some(id) = seq.next_element::<u32>()? {
                    all.push(id);
                }
                PromptField::Ids(all)
            }
            Element::Ids(ids) => {
                let mut all = vec![ids];
                while let Some(e) = seq.next_element::<Element>()? {
                    let Element::Ids(ids) = e else {
                        return Err(mismatch());
                    };
                    all.push(ids);
                }
                PromptField::IdBatches(all)
            }
        })
    }
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
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's breakdown of the prompt tokens: those the prefix cache held.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails::default(),
        }
    }

    pub fn with_cached(self, cached_tokens: usize) -> Self {
        Self {
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
            ..self
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<PromptField, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn every_prompt_shape_is_read_by_its_first_element() {
        assert!(matches!(parse(r#""hi""#), Ok(PromptField::Text(t)) if t == "hi"));
        assert!(matches!(parse(r#"["a", "b"]"#), Ok(PromptField::Texts(v)) if v == ["a", "b"]));
        assert!(matches!(parse("[1, 2, 3]"), Ok(PromptField::Ids(v)) if v == [1, 2, 3]));
        assert!(
            matches!(parse("[[1], [2, 3]]"), Ok(PromptField::IdBatches(v)) if v == [vec![1], vec![2, 3]])
        );
        assert!(matches!(parse("[]"), Ok(PromptField::Texts(v)) if v.is_empty()));
        for bad in [
            "[1, \"a\"]",
            "[\"a\", 1]",
            "[[1], 2]",
            "[4294967296]",
            "[-1]",
            "[1.5]",
            "{}",
            "7",
            "null",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
