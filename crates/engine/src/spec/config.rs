//! `--speculative-config`, spelled as vLLM spells it: a JSON object with `method` and
//! `num_speculative_tokens`.

use serde_json::{Map, Value};

/// Where draft tokens come from.
#[derive(Clone, Debug, PartialEq)]
pub enum SpecMethod {
    /// The checkpoint's own MTP block (`mtp.0.*`, docs/MODEL.md §7.1); vLLM also calls it
    /// `deepseek_mtp`.
    Mtp,
    /// The DSpark drafter of V4.1 and V4-Flash-0731-style checkpoints (`mtp.0..2.*`, spec
    /// §7.2): a block of drafts at once.
    Dspark,
    /// For measurement only: proposes the tokens a plain run produced (`script`: prompt →
    /// output), each replaced by a wrong one with probability `1 − acceptance_rate`, so the
    /// speed-up can be measured at a chosen acceptance rate.
    Replay {
        acceptance_rate: f64,
        seed: u64,
        script: Vec<(Vec<u32>, Vec<u32>)>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct SpeculativeConfig {
    pub method: SpecMethod,
    /// Most draft tokens per sequence and step (vLLM's `num_speculative_tokens`).
    pub num_speculative_tokens: usize,
    /// Whether the adaptive policy may stop drafting where it does not pay (default). Off,
    /// every decoding sequence drafts `num_speculative_tokens` every step: for tests and
    /// for measuring the cost of verification.
    pub adaptive: bool,
    /// vLLM's adaptive verification (DSpark only, off by default): each step verifies the
    /// drafts whose chance of surviving (the running product of the drafter's confidences)
    /// buys most tokens per second, the rest are dropped unverified.
    pub enable_adaptive_verification: bool,
}

/// The most draft tokens a step may verify per sequence.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("--speculative-config: {0}")]
pub struct SpecConfigError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, SpecConfigError> {
    Err(SpecConfigError(msg.into()))
}

impl SpeculativeConfig {
    /// Parses the JSON object `--speculative-config` takes. `num_speculative_tokens`
    /// defaults to `default_tokens` (1 for MTP, as vLLM's default for DeepSeek's single MTP
    /// layer). A replay config gets its script from the caller (`deepinfer bench`).
    pub fn from_json(s: &str, default_tokens: Option<usize>) -> Result<Self, SpecConfigError> {
        let v: Value = serde_json::from_str(s).or_else(|e| err(format!("not JSON: {e}")))?;
        let Some(o) = v.as_object() else {
            return err("expected a JSON object such as {\"method\": \"mtp\"}");
        };
        let method = match o.get("method").and_then(Value::as_str) {
            Some("mtp" | "deepseek_mtp") => SpecMethod::Mtp,
            Some("dspark") => SpecMethod::Dspark,
            Some("replay") => SpecMethod::Replay {
                acceptance_rate: number(o, "acceptance_rate")?.unwrap_or(0.6),
                seed: number(o, "seed")?.map_or(0, |s| s as u64),
                script: Vec::new(),
            },
            Some(other) => {
                return err(format!(
                    "method \"{other}\" is not supported (this engine drafts with \"mtp\" or \"dspark\")"
                ))
            }
            None => return err("\"method\" (a string, e.g. \"mtp\") is required"),
        };
        if let SpecMethod::Replay {
            acceptance_rate, ..
        } = method
        {
            if !(0.0..=1.0).contains(&acceptance_rate) {
                return err(format!(
                    "acceptance_rate {acceptance_rate} is not in [0, 1]"
                ));
            }
        }
        let k = match number(o, "num_speculative_tokens")? {
            Some(k) if k.fract() == 0.0 && k >= 1.0 => k as usize,
            Some(k) => {
                return err(format!(
                    "num_speculative_tokens {k} is not a positive integer"
                ))
            }
            // DSpark drafts a whole block (5 as shipped) in one pass.
            None if method == SpecMethod::Dspark => 5,
            None => default_tokens.unwrap_or(1),
        };
        if k > MAX_SPECULATIVE_TOKENS {
            return err(format!(
                "num_speculative_tokens {k} is above the limit of {MAX_SPECULATIVE_TOKENS}"
            ));
        }
        let flag = |key: &str, default: bool| match o.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => err(format!("{key} must be true or false, not {v}")),
        };
        let adaptive = flag("adaptive", true)?;
        let enable_adaptive_verification = flag("enable_adaptive_verification", false)?;
        if enable_adaptive_verification && method != SpecMethod::Dspark {
            return err(
                "enable_adaptive_verification needs the DSpark drafter's confidences \
                 (method \"dspark\")",
            );
        }
        for key in o.keys() {
            let known = [
                "method",
                "num_speculative_tokens",
                "adaptive",
                "enable_adaptive_verification",
                "acceptance_rate",
                "seed",
            ];
            if !known.contains(&key.as_str()) {
                tracing::warn!("--speculative-config: ignoring \"{key}\"");
            }
        }
        Ok(Self {
            method,
            num_speculative_tokens: k,
            adaptive,
            enable_adaptive_verification,
        })
    }
}

fn number(o: &Map<String, Value>, key: &str) -> Result<Option<f64>, SpecConfigError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => err(format!("{key} must be a number, not {v}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_spellings() {
        let c =
            SpeculativeConfig::from_json(r#"{"method": "mtp", "num_speculative_tokens": 3}"#, None)
                .unwrap();
        assert_eq!(c.method, SpecMethod::Mtp);
        assert_eq!((c.num_speculative_tokens, c.adaptive), (3, true));
        let c = SpeculativeConfig::from_json(r#"{"method": "deepseek_mtp"}"#, Some(2)).unwrap();
        assert_eq!(c.num_speculative_tokens, 2);
        let c = SpeculativeConfig::from_json(r#"{"method": "mtp"}"#, None).unwrap();
        assert_eq!(c.num_speculative_tokens, 1);
        let c = SpeculativeConfig::from_json(
            r#"{"method": "replay", "acceptance_rate": 0.3, "adaptive": false}"#,
            None,
        )
        .unwrap();
        assert!(matches!(
            c.method,
            SpecMethod::Replay { acceptance_rate, .. } if acceptance_rate == 0.3
        ));
        assert!(!c.adaptive);
        let c = SpeculativeConfig::from_json(
            r#"{"method": "dspark", "enable_adaptive_verification": true}"#,
            None,
        )
        .unwrap();
        assert!(c.enable_adaptive_verification);
        assert_eq!(c.num_speculative_tokens, 5);
    }

    #[test]
    fn bad_configs_name_the_problem() {
        for (json, needle) in [
            ("nope", "not JSON"),
            ("[1]", "JSON object"),
            ("{}", "\"method\""),
            (r#"{"method": "ngram"}"#, "not supported"),
            (
                r#"{"method": "mtp", "num_speculative_tokens": 0}"#,
                "positive",
            ),
            (
                r#"{"method": "mtp", "num_speculative_tokens": 2.5}"#,
                "positive",
            ),
            (
                r#"{"method": "mtp", "num_speculative_tokens": 99}"#,
                "limit",
            ),
            (
                r#"{"method": "mtp", "num_speculative_tokens": "3"}"#,
                "number",
            ),
            (r#"{"method": "mtp", "adaptive": 1}"#, "adaptive"),
            (
                r#"{"method": "mtp", "enable_adaptive_verification": true}"#,
                "confidences",
            ),
            (
                r#"{"method": "dspark", "enable_adaptive_verification": "yes"}"#,
                "true or false",
            ),
            (r#"{"method": "replay", "acceptance_rate": 1.5}"#, "[0, 1]"),
        ] {
            let e = SpeculativeConfig::from_json(json, None).unwrap_err();
            assert!(e.to_string().contains(needle), "{json}: {e}");
        }
    }
}
