//! The request fields both generation endpoints share, and their mapping onto the engine's
//! [`SamplingParams`] with vLLM's defaults and OpenAI's limits.

use super::{ApiError, LogitBias};
use deepinfer_engine::sampling_params::SamplingParams;
use serde::Deserialize;

/// Most choices one request may ask for (`n`); each is a sequence in the engine.
pub const MAX_N: usize = 128;

/// Most sequences one request may start in all (prompts × `n`), so one request cannot fill
/// the engine or the admission queue by itself.
pub const MAX_SEQUENCES: usize = 128;

/// Most stop strings one request may give. OpenAI allows 4 and vLLM sets no limit; 64 leaves
/// room for long lists of end markers while every request's automaton stays small.
pub const MAX_STOP_STRINGS: usize = 64;

/// Longest stop string, in bytes. Text that could begin a stop is held back, so this also
/// bounds how far a stream's text may lag behind its tokens.
pub const MAX_STOP_BYTES: usize = 512;

/// Most `stop_token_ids` one request may give (the engine checks each sampled token
/// against them).
pub const MAX_STOP_TOKEN_IDS: usize = 1024;

/// The `n` choices' parameters of one prompt: distinct but reproducible streams for the
/// samples of a seeded request (choice `j` seeds with `seed + j`).
pub fn n_samples(params: &SamplingParams, n: usize) -> impl Iterator<Item = SamplingParams> + '_ {
    (0..n).map(|j| {
        let mut p = params.clone();
        p.seed = p.seed.map(|s| s.wrapping_add(j as u64));
        p
    })
}

/// 400 unless `prompts` × `n` is within [`MAX_SEQUENCES`]; the error names `n` when more
/// than one choice per prompt was asked for, else `prompt`.
pub fn check_sequences(prompts: usize, n: usize) -> Result<usize, ApiError> {
    let total = prompts.saturating_mul(n);
    if total > MAX_SEQUENCES {
        return Err(ApiError::invalid(
            if n > 1 { "n" } else { "prompt" },
            format!(
                "a request may generate at most {MAX_SEQUENCES} choices in all (prompts × n), \
                 got {prompts} × {n} = {total}"
            ),
        ));
    }
    Ok(total)
}

/// `stop`: one string or a list of them.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Debug, Clone, Copy, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
    /// vLLM's extension: a usage object on every chunk.
    #[serde(default)]
    pub continuous_usage_stats: bool,
}

/// Fields shared by `/v1/completions` and `/v1/chat/completions` (OpenAI's, plus vLLM's
/// sampling extensions). Integers are read as `i64` so a negative value gets a clear message
/// instead of a type error.
#[derive(Deserialize, Debug, Default)]
pub struct SamplingFields {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub n: Option<i64>,
    pub best_of: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<StopField>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub logit_bias: Option<LogitBias>,
    pub min_tokens: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub skip_special_tokens: Option<bool>,
    pub include_stop_str_in_output: Option<bool>,
}

/// The per-request settings outside [`SamplingParams`] that shape the text stream.
#[derive(Debug, Clone)]
pub struct OutputOptions {
    pub n: usize,
    pub stream: bool,
    pub stream_options: StreamOptions,
    pub stop: Vec<String>,
    pub skip_special_tokens: bool,
    pub include_stop_str_in_output: bool,
}

fn non_negative(param: &str, v: i64) -> Result<usize, ApiError> {
    usize::try_from(v)
        .map_err(|_| ApiError::invalid(param, format!("`{param}` must be >= 0, got {v}")))
}

impl SamplingFields {
    pub fn output_options(&self) -> Result<OutputOptions, ApiError> {
        let n = non_negative("n", self.n.unwrap_or(1))?;
        if !(1..=MAX_N).contains(&n) {
            return Err(ApiError::invalid(
                "n",
                format!("`n` must be between 1 and {MAX_N}, got {n}"),
            ));
        }
        if let Some(b) = self.best_of {
            if b != n as i64 {
                return Err(ApiError::invalid(
                    "best_of",
                    format!("`best_of` other than `n` is not supported (got best_of={b}, n={n})"),
                ));
            }
        }
        let stream = self.stream.unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` can only be set when `stream` is true",
            ));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid("stop", "stop strings must not be empty"));
        }
        if stop.len() > MAX_STOP_STRINGS {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "at most {MAX_STOP_STRINGS} stop strings are allowed, got {}",
                    stop.len()
                ),
            ));
        }
        if let Some(s) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "a stop string may be at most {MAX_STOP_BYTES} bytes long, got one of {}",
                    s.len()
                ),
            ));
        }
        Ok(OutputOptions {
            n,
            stream,
            stream_options: self.stream_options.unwrap_or_default(),
            stop,
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            include_stop_str_in_output: self.include_stop_str_in_output.unwrap_or(false),
        })
    }

    /// The engine's settings for one choice. `max_tokens` is the already resolved output
    /// budget (see [`resolve_max_tokens`]); `logprobs` the number of alternatives asked for.
    pub fn sampling_params(
        &self,
        max_tokens: usize,
        logprobs: Option<usize>,
    ) -> Result<SamplingParams, ApiError> {
        let top_k = match self.top_k.unwrap_or(0) {
            // vLLM spells "off" as -1 (and 0).
            -1 | 0 => 0,
            k if k > 0 => k as usize,
            k => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("`top_k` must be -1 (off) or >= 1, got {k}"),
                ))
            }
        };
        let mut logit_bias = Vec::new();
        for (&id, &bias) in self.logit_bias.iter().flat_map(|b| &b.0) {
            if !(-100.0..=100.0).contains(&bias) {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("`logit_bias` values must be in [-100, 100], got {bias} for {id}"),
                ));
            }
            logit_bias.push((id, bias));
        }
        Ok(SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            logit_bias: logit_bias.into(),
            seed: self.seed.map(|s| s as u64),
            max_tokens,
            min_tokens: non_negative("min_tokens", self.min_tokens.unwrap_or(0))?,
            stop_token_ids: self.stop_token_ids()?,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            logprobs,
        })
    }
}

impl SamplingFields {
    fn stop_token_ids(&self) -> Result<Vec<u32>, ApiError> {
        let ids = self.stop_token_ids.clone().unwrap_or_default();
        if ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(ApiError::invalid(
                "stop_token_ids",
                format!(
                    "at most {MAX_STOP_TOKEN_IDS} stop token ids are allowed, got {}",
                    ids.len()
                ),
            ));
        }
        Ok(ids)
    }
}

/// The output budget: the requested `max_tokens` (which must fit beside the prompt in the
/// context, else a 400 with the numbers, as vLLM words it), or `default` capped to what fits.
pub fn resolve_max_tokens(
    requested: Option<i64>,
    param: &str,
    prompt_param: &str,
    default: Option<usize>,
    prompt_len: usize,
    max_model_len: usize,
) -> Result<usize, ApiError> {
    let room = max_model_len.saturating_sub(prompt_len);
    if room == 0 {
        return Err(ApiError::invalid(
            prompt_param,
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, your \
                 prompt has {prompt_len} tokens, which leaves no room for output. Please reduce \
                 the length of the prompt."
            ),
        ));
    }
    match requested {
        None => Ok(default.map_or(room, |d| d.min(room))),
        Some(r) if r < 1 => Err(ApiError::invalid(
            param,
            format!("`{param}` must be at least 1, got {r}"),
        )),
        Some(r) => {
            let r = r as usize;
            if prompt_len + r > max_model_len {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "This model's maximum context length is {max_model_len} tokens. However, \
                         you requested {} tokens ({prompt_len} in the prompt, {r} in the \
                         completion). Please reduce the length of the prompt or completion.",
                        prompt_len.saturating_add(r)
                    ),
                ));
            }
            Ok(r)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_tokens_fits_the_context_or_is_refused_with_numbers() {
        assert_eq!(
            resolve_max_tokens(None, "max_tokens", "prompt", Some(16), 10, 100).unwrap(),
            16
        );
        assert_eq!(
            resolve_max_tokens(None, "max_tokens", "prompt", Some(16), 90, 100).unwrap(),
            10
        );
        assert_eq!(
            resolve_max_tokens(None, "max_tokens", "prompt", None, 90, 100).unwrap(),
            10
        );
        let e = resolve_max_tokens(Some(20), "max_tokens", "prompt", None, 90, 100).unwrap_err();
        assert!(
            e.message.contains("maximum context length is 100"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("110 tokens (90 in the prompt, 20"),
            "{}",
            e.message
        );
        assert!(resolve_max_tokens(Some(0), "max_tokens", "prompt", None, 1, 100).is_err());
        assert!(resolve_max_tokens(Some(-3), "max_tokens", "prompt", None, 1, 100).is_err());
        assert!(resolve_max_tokens(None, "max_tokens", "prompt", None, 100, 100).is_err());
        assert!(resolve_max_tokens(Some(i64::MAX), "max_tokens", "prompt", None, 1, 100).is_err());
    }

    #[test]
    fn maps_vllm_spellings_and_rejects_bad_values() {
        let f = SamplingFields {
            top_k: Some(-1),
            logit_bias: Some(LogitBias([(7, 5.0)].into())),
            ..Default::default()
        };
        let p = f.sampling_params(4, None).unwrap();
        assert_eq!(p.top_k, 0);
        assert_eq!(&*p.logit_bias, &[(7, 5.0)]);
        let bad = |f: SamplingFields, param: &str| {
            let e = f.sampling_params(4, None).expect_err("rejected");
            assert_eq!(e.param.as_deref(), Some(param));
        };
        bad(
            SamplingFields {
                top_k: Some(-2),
                ..Default::default()
            },
            "top_k",
        );
        bad(
            SamplingFields {
                logit_bias: Some(LogitBias([(1, 1000.0)].into())),
                ..Default::default()
            },
            "logit_bias",
        );
        bad(
            SamplingFields {
                min_tokens: Some(-1),
                ..Default::default()
            },
            "min_tokens",
        );
        let opts = |f: SamplingFields| f.output_options().unwrap_err().param.unwrap();
        assert_eq!(
            opts(SamplingFields {
                n: Some(0),
                ..Default::default()
            }),
            "n"
        );
        assert_eq!(
            opts(SamplingFields {
                n: Some(-1),
                ..Default::default()
            }),
            "n"
        );
        assert_eq!(
            opts(SamplingFields {
                n: Some(100_000),
                ..Default::default()
            }),
            "n"
        );
        assert_eq!(
            opts(SamplingFields {
                stream_options: Some(StreamOptions::default()),
                ..Default::default()
            }),
            "stream_options"
        );
        assert_eq!(
            opts(SamplingFields {
                stop: Some(StopField::Many(vec![String::new()])),
                ..Default::default()
            }),
            "stop"
        );
    }
}
