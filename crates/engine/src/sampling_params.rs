//! Per-request sampling settings, with vLLM's field names and defaults.
//!
//! The server maps OpenAI request bodies onto this struct; the engine checks it once with
//! [`SamplingParams::validate`] when a request arrives, so the sampler's hot loop can trust
//! every value (no NaN temperatures, no out-of-vocabulary ids).

use std::sync::Arc;

/// How one request picks its next tokens and when it stops.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy (argmax), which never touches the RNG.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Nucleus sampling mass in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 disables.
    pub min_p: f32,
    /// HF/vLLM repetition penalty over prompt and output tokens; 1 disables.
    pub repetition_penalty: f32,
    /// OpenAI presence penalty over output tokens, in [-2, 2].
    pub presence_penalty: f32,
    /// OpenAI frequency penalty over output tokens, in [-2, 2].
    pub frequency_penalty: f32,
    /// `(token id, bias)` pairs added to the logits; repeated ids add up. Shared: a
    /// request's `n` choices hold one copy.
    pub logit_bias: Arc<[(u32, f32)]>,
    /// Seed for the request's own RNG stream; `None` seeds from OS entropy.
    pub seed: Option<u64>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// EOS and stop ids are masked until this many tokens have been generated.
    pub min_tokens: usize,
    /// Token ids that end generation (besides the model's EOS ids).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past EOS (benchmarks want a fixed output length).
    pub ignore_eos: bool,
    /// Return this many top alternatives' logprobs; `Some(0)` returns only the chosen token's.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    /// vLLM's defaults: plain sampling at temperature 1 with every filter off.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Arc::from([]),
            seed: None,
            max_tokens: 16,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
        }
    }
}

/// The most alternatives a request may ask for, as in OpenAI's API (and vLLM's default).
pub const MAX_LOGPROBS: usize = 20;

/// A rejected sampling setting; `field` uses the struct's (and the API's) name so the server
/// can point the client at the offending parameter.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("invalid `{field}`: {message}")]
pub struct ParamError {
    pub field: &'static str,
    pub message: String,
}

fn reject(field: &'static str, message: String) -> Result<(), ParamError> {
    Err(ParamError { field, message })
}

impl SamplingParams {
    /// Checks every value against what the sampler can honour for a model with `vocab_size`
    /// tokens; the first problem found is returned.
    pub fn validate(&self, vocab_size: usize) -> Result<(), ParamError> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return reject(
                "temperature",
                format!("must be a finite number >= 0, got {t}"),
            );
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return reject("top_p", format!("must be in (0, 1], got {p}"));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return reject("min_p", format!("must be in [0, 1], got {m}"));
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return reject(
                "repetition_penalty",
                format!("must be a finite number > 0, got {r}"),
            );
        }
        for (field, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return reject(field, format!("must be in [-2, 2], got {v}"));
            }
        }
        for &(id, bias) in self.logit_bias.iter() {
            if id as usize >= vocab_size {
                return reject(
                    "logit_bias",
                    format!("token id {id} is outside the vocabulary of {vocab_size}"),
                );
            }
            if !bias.is_finite() {
                return reject(
                    "logit_bias",
                    format!("bias for token {id} must be finite, got {bias}"),
                );
            }
        }
        if let Some(&id) = self
            .stop_token_ids
            .iter()
            .find(|&&id| id as usize >= vocab_size)
        {
            return reject(
                "stop_token_ids",
                format!("token id {id} is outside the vocabulary of {vocab_size}"),
            );
        }
        if self.max_tokens == 0 {
            return reject("max_tokens", "must be at least 1, got 0".to_string());
        }
        if self.min_tokens > self.max_tokens {
            return reject(
                "min_tokens",
                format!(
                    "must be <= max_tokens ({}), got {}",
                    self.max_tokens, self.min_tokens
                ),
            );
        }
        if let Some(n) = self.logprobs {
            if n > MAX_LOGPROBS {
                return reject(
                    "logprobs",
                    format!("must be at most {MAX_LOGPROBS}, got {n}"),
                );
            }
        }
        Ok(())
    }

    /// Greedy rows take the argmax and never draw from their RNG, so a greedy request's
    /// output is independent of its seed; top_k = 1 leaves only the argmax anyway.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: usize = 100;

    fn check_rejected(p: SamplingParams, field: &str, value: &str) {
        let err = p.validate(VOCAB).expect_err("should be rejected");
        assert_eq!(err.field, field);
        let msg = err.to_string();
        assert!(msg.contains(field), "{msg:?} does not name {field}");
        assert!(msg.contains(value), "{msg:?} does not show {value}");
    }

    #[test]
    fn defaults_are_valid_and_not_greedy() {
        let p = SamplingParams::default();
        p.validate(VOCAB).unwrap();
        assert!(!p.is_greedy());
        assert_eq!(p.max_tokens, 16);
    }

    #[test]
    fn greedy_by_temperature_or_top_k_one() {
        let t0 = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        assert!(t0.is_greedy());
        let k1 = SamplingParams {
            top_k: 1,
            ..Default::default()
        };
        assert!(k1.is_greedy());
    }

    #[test]
    fn rejects_temperature() {
        for (t, shown) in [(f32::NAN, "NaN"), (-0.5, "-0.5"), (f32::INFINITY, "inf")] {
            let p = SamplingParams {
                temperature: t,
                ..Default::default()
            };
            check_rejected(p, "temperature", shown);
        }
    }

    #[test]
    fn rejects_top_p() {
        for (v, shown) in [(0.0, "0"), (1.5, "1.5"), (f32::NAN, "NaN"), (-0.1, "-0.1")] {
            let p = SamplingParams {
                top_p: v,
                ..Default::default()
            };
            check_rejected(p, "top_p", shown);
        }
    }

    #[test]
    fn rejects_min_p() {
        for (v, shown) in [(-0.1, "-0.1"), (1.1, "1.1"), (f32::NAN, "NaN")] {
            let p = SamplingParams {
                min_p: v,
                ..Default::default()
            };
            check_rejected(p, "min_p", shown);
        }
    }

    #[test]
    fn rejects_repetition_penalty() {
        for (v, shown) in [(0.0, "0"), (-1.0, "-1"), (f32::NAN, "NaN")] {
            let p = SamplingParams {
                repetition_penalty: v,
                ..Default::default()
            };
            check_rejected(p, "repetition_penalty", shown);
        }
    }

    #[test]
    fn rejects_presence_penalty() {
        let p = SamplingParams {
            presence_penalty: 2.5,
            ..Default::default()
        };
        check_rejected(p, "presence_penalty", "2.5");
    }

    #[test]
    fn rejects_frequency_penalty() {
        let p = SamplingParams {
            frequency_penalty: -2.5,
            ..Default::default()
        };
        check_rejected(p, "frequency_penalty", "-2.5");
    }

    #[test]
    fn rejects_logit_bias() {
        let p = SamplingParams {
            logit_bias: vec![(3, 1.0), (VOCAB as u32, 1.0)].into(),
            ..Default::default()
        };
        check_rejected(p, "logit_bias", "100");
        let p = SamplingParams {
            logit_bias: vec![(7, f32::NEG_INFINITY)].into(),
            ..Default::default()
        };
        check_rejected(p, "logit_bias", "-inf");
    }

    #[test]
    fn rejects_stop_token_ids() {
        let p = SamplingParams {
            stop_token_ids: vec![1, 250],
            ..Default::default()
        };
        check_rejected(p, "stop_token_ids", "250");
    }

    #[test]
    fn rejects_min_tokens() {
        let p = SamplingParams {
            max_tokens: 4,
            min_tokens: 5,
            ..Default::default()
        };
        check_rejected(p, "min_tokens", "5");
    }

    #[test]
    fn rejects_logprobs() {
        let p = SamplingParams {
            logprobs: Some(21),
            ..Default::default()
        };
        check_rejected(p, "logprobs", "21");
        let ok = SamplingParams {
            logprobs: Some(20),
            ..Default::default()
        };
        ok.validate(VOCAB).unwrap();
    }

    #[test]
    fn rejects_max_tokens() {
        let p = SamplingParams {
            max_tokens: 0,
            ..Default::default()
        };
        check_rejected(p, "max_tokens", "0");
    }

    #[test]
    fn accepts_edges() {
        let p = SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            min_p: 1.0,
            repetition_penalty: 0.01,
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            logit_bias: vec![(VOCAB as u32 - 1, -100.0)].into(),
            stop_token_ids: vec![VOCAB as u32 - 1],
            max_tokens: 3,
            min_tokens: 3,
            logprobs: Some(0),
            ..Default::default()
        };
        p.validate(VOCAB).unwrap();
    }
}
