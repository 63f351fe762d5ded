//! Request-level switches of the prompt — thinking mode, reasoning effort, dropping old
//! reasoning — resolved from an OpenAI request exactly as vLLM 0.33 does for both families:
//!
//! * `chat_template_kwargs.thinking` / `.enable_thinking` (Python truthiness, either one on
//!   enables) choose thinking mode; with neither key the default is **thinking on**.
//! * A request `reasoning_effort` sets `enable_thinking = (effort != "none")` unless the client
//!   put `enable_thinking` in `chat_template_kwargs` itself (vLLM's `build_chat_params`).
//! * The effort is the request's `reasoning_effort`, else
//!   `chat_template_kwargs.reasoning_effort` (vLLM merges the two into one kwargs dict), kept
//!   as given ([`Effort`]) until the family reads it: `none` is chat mode in both; V4's
//!   levels are [`RenderOptions::encoder_effort`], V4.1's `super::v41::effort_budget`.
//! * `chat_template_kwargs.drop_thinking` (default true) drops earlier turns' reasoning.

use serde::Deserialize;

/// What the OpenAI `reasoning_effort` field can say (vLLM's list; `max` is DeepSeek's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningEffort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
    Max,
}

impl ReasoningEffort {
    /// Every name a request's `reasoning_effort` may take.
    pub const NAMES: [&'static str; 7] =
        ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

    /// The level of a request's `reasoning_effort`; `None` for a name outside [`Self::NAMES`]
    /// (the server refuses it rather than guess, as vLLM's request validation does).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "high" => Some(Self::High),
            other if Self::NAMES.contains(&other) => Some(Self::from_name(other)),
            _ => None,
        }
    }

    /// The level a free-form name selects; names the encoder does not know mean `High`, as in
    /// vLLM's mapping.
    pub fn from_name(name: &str) -> Self {
        match name {
            "none" => Self::None,
            "minimal" => Self::Minimal,
            "low" => Self::Low,
            "medium" => Self::Medium,
            "xhigh" => Self::Xhigh,
            "max" => Self::Max,
            _ => Self::High,
        }
    }
}

/// The three effort levels the V4 encoder knows; each selects a preamble before the system
/// prompt in thinking mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderEffort {
    /// No preamble.
    Low,
    High,
    Max,
}

impl EncoderEffort {
    /// The encoder's name for the level (`"low"`, `"high"`, `"max"`).
    pub fn as_str(self) -> &'static str {
        match self {
            EncoderEffort::Low => "low",
            EncoderEffort::High => "high",
            EncoderEffort::Max => "max",
        }
    }
}

/// The effort a request asked for, as the chat template receives it: vLLM merges the
/// request's effort field into `chat_template_kwargs.reasoning_effort`, which may hold any
/// JSON. Each family reads it its own way (V4 takes names only, V4.1 names and integers
/// 1–100), so it is kept as given until the family is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effort {
    /// A name of [`ReasoningEffort::NAMES`].
    Named(ReasoningEffort),
    /// Any other string.
    Unknown(String),
    /// A JSON integer (V4.1's scale is 1–100).
    Integer(i64),
    /// Any other JSON value, as JSON text (a float, a bool, an object …).
    Other(String),
}

impl Effort {
    fn from_json(v: &serde_json::Value) -> Option<Self> {
        use serde_json::Value as V;
        Some(match v {
            // Both wrappers read a null effort as none given.
            V::Null => return None,
            V::String(s) => {
                ReasoningEffort::parse(s).map_or(Effort::Unknown(s.clone()), Effort::Named)
            }
            V::Number(n) if n.is_i64() => Effort::Integer(n.as_i64().expect("checked")),
            other => Effort::Other(other.to_string()),
        })
    }
}

/// How to render a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderOptions {
    /// Thinking requested (after resolving `chat_template_kwargs`; see [`Self::from_openai`]).
    pub thinking: bool,
    /// The effort asked for, and the request field it came from (named in errors).
    pub effort: Option<(Effort, &'static str)>,
    /// Drop reasoning of assistant turns before the last user turn (ignored when tools are
    /// given: the encoder then keeps every turn's reasoning).
    pub drop_thinking: bool,
}

impl Default for RenderOptions {
    /// vLLM's defaults for a request that says nothing: thinking on, effort unset, drop on.
    fn default() -> Self {
        Self {
            thinking: true,
            effort: None,
            drop_thinking: true,
        }
    }
}

/// Where `chat_template_kwargs.reasoning_effort` is named in errors.
pub const KWARGS_EFFORT: &str = "chat_template_kwargs.reasoning_effort";

impl RenderOptions {
    /// Resolves the options from a request's effort field (a name of
    /// [`ReasoningEffort::NAMES`], and the field's name) and `chat_template_kwargs` (a JSON
    /// object; anything else is treated as absent), as vLLM's `build_chat_params` merges them.
    pub fn from_openai(
        reasoning_effort: Option<(ReasoningEffort, &'static str)>,
        chat_template_kwargs: Option<&serde_json::Value>,
    ) -> Self {
        let kwargs = chat_template_kwargs.and_then(|v| v.as_object());
        let get = |key: &str| kwargs.and_then(|m| m.get(key));
        let thinking = get("thinking");
        let mut enable_thinking = get("enable_thinking").map(python_truthy);
        if let (Some((effort, _)), None) = (reasoning_effort, get("enable_thinking")) {
            enable_thinking = Some(effort != ReasoningEffort::None);
        }
        let thinking = match (thinking, enable_thinking) {
            (None, None) => true,
            (t, e) => t.is_some_and(python_truthy) || e.unwrap_or(false),
        };
        let effort = match reasoning_effort {
            Some((effort, field)) => Some((Effort::Named(effort), field)),
            None => get("reasoning_effort")
                .and_then(Effort::from_json)
                .map(|e| (e, KWARGS_EFFORT)),
        };
        Self {
            thinking,
            effort,
            drop_thinking: get("drop_thinking").is_none_or(python_truthy),
        }
    }

    /// The options with the effort a request field named (e.g. Anthropic's
    /// `output_config.effort`) in place of any other.
    pub fn with_effort(mut self, effort: ReasoningEffort, field: &'static str) -> Self {
        self.effort = Some((Effort::Named(effort), field));
        self
    }

    /// Whether the prompt ends with `<think>` and the model starts inside its reasoning — the
    /// `thinking` flag to give [`super::ChatOutputParser::new`]. An effort of `none` is chat
    /// mode in both families.
    pub fn thinking_mode(&self) -> bool {
        self.thinking && !matches!(self.effort, Some((Effort::Named(ReasoningEffort::None), _)))
    }

    /// The effort level the V4 encoder renders (only matters in thinking mode): vLLM's
    /// `deepseek_v4.py` wrapper — a non-string effort is no effort, `max` is `max`,
    /// `low`/`minimal`/`medium` are `low`, any other string is `high`, none is `high`.
    pub fn encoder_effort(&self) -> EncoderEffort {
        use ReasoningEffort as R;
        match &self.effort {
            None | Some((Effort::Integer(_) | Effort::Other(_), _)) if self.thinking => {
                EncoderEffort::High
            }
            None | Some((Effort::Integer(_) | Effort::Other(_), _)) => EncoderEffort::Low,
            Some((Effort::Named(R::None | R::Low | R::Minimal | R::Medium), _)) => {
                EncoderEffort::Low
            }
            Some((Effort::Named(R::Max), _)) => EncoderEffort::Max,
            Some((Effort::Named(R::High | R::Xhigh) | Effort::Unknown(_), _)) => {
                EncoderEffort::High
            }
        }
    }
}

/// Python's `bool(value)` for a JSON value.
fn python_truthy(v: &serde_json::Value) -> bool {
    use serde_json::Value as V;
    match v {
        V::Null => false,
        V::Bool(b) => *b,
        V::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        V::String(s) => !s.is_empty(),
        V::Array(a) => !a.is_empty(),
        V::Object(o) => !o.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resolution_follows_vllm() {
        let o =
            |effort, kwargs: serde_json::Value| RenderOptions::from_openai(effort, Some(&kwargs));
        let d = RenderOptions::from_openai(None, None);
        assert_eq!(d, RenderOptions::default());
        assert!(d.thinking_mode());
        assert_eq!(d.encoder_effort(), EncoderEffort::High);

        let chat = o(None, json!({"thinking": false}));
        assert!(!chat.thinking_mode());
        assert_eq!(chat.encoder_effort(), EncoderEffort::Low);

        // A request effort re-enables thinking unless enable_thinking was given explicitly.
        let e = o(
            Some((ReasoningEffort::Max, "reasoning_effort")),
            json!({"thinking": false}),
        );
        assert!(e.thinking_mode());
        assert_eq!(e.encoder_effort(), EncoderEffort::Max);
        let e = o(
            Some((ReasoningEffort::Max, "reasoning_effort")),
            json!({"enable_thinking": false}),
        );
        assert!(!e.thinking_mode());

        let none = o(
            Some((ReasoningEffort::None, "reasoning_effort")),
            json!({"thinking": true}),
        );
        assert!(!none.thinking_mode());
        assert_eq!(none.encoder_effort(), EncoderEffort::Low);

        assert_eq!(
            o(
                Some((ReasoningEffort::Medium, "reasoning_effort")),
                json!({})
            )
            .encoder_effort(),
            EncoderEffort::Low
        );
        assert_eq!(
            o(
                Some((ReasoningEffort::Xhigh, "reasoning_effort")),
                json!({})
            )
            .encoder_effort(),
            EncoderEffort::High
        );
        assert!(!o(None, json!({"drop_thinking": false})).drop_thinking);
        assert!(o(None, json!({"thinking": "no"})).thinking); // Python truthiness
        assert!(!o(None, json!({"thinking": null})).thinking);
        let k = o(None, json!({"reasoning_effort": "max"}));
        assert!(k.thinking_mode());
        assert_eq!(k.encoder_effort(), EncoderEffort::Max);
        let k = o(None, json!({"reasoning_effort": "none"}));
        assert!(!k.thinking_mode());
        // V4 reads only strings; V4.1's integers are no effort to it.
        let k = o(None, json!({"reasoning_effort": 40}));
        assert_eq!(k.effort, Some((Effort::Integer(40), KWARGS_EFFORT)));
        assert_eq!(k.encoder_effort(), EncoderEffort::High);
        let k = o(None, json!({"reasoning_effort": "extreme"}));
        assert_eq!(k.encoder_effort(), EncoderEffort::High);
        assert_eq!(o(None, json!({"reasoning_effort": null})).effort, None);
        let k = o(
            Some((ReasoningEffort::Low, "reasoning_effort")),
            json!({"reasoning_effort": "max"}),
        );
        assert_eq!(k.encoder_effort(), EncoderEffort::Low);
    }
}
