//! Request-level switches of the V4 prompt — thinking mode, reasoning effort, dropping old
//! reasoning — resolved from an OpenAI request exactly as vLLM (0.34) does for DeepSeek-V4:
//!
//! * `chat_template_kwargs.thinking` / `.enable_thinking` (Python truthiness, either one on
//!   enables) choose thinking mode; with neither key the default is **thinking on**.
//! * A request `reasoning_effort` sets `enable_thinking = (effort != "none")` unless the client
//!   put `enable_thinking` in `chat_template_kwargs` itself (vLLM's `build_chat_params`).
//! * The effort is the request's `reasoning_effort`, else a string
//!   `chat_template_kwargs.reasoning_effort` (vLLM merges the two into one kwargs dict).
//! * The encoder's effort: absent → `high` in thinking mode; `none` → chat mode;
//!   `max` → `max`; `low`/`minimal`/`medium` → `low` (no preamble); anything else → `high`.
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

/// How to render a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderOptions {
    /// Thinking requested (after resolving `chat_template_kwargs`; see [`Self::from_openai`]).
    pub thinking: bool,
    /// The request's `reasoning_effort`; `Some(None)` forces chat mode.
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Drop reasoning of assistant turns before the last user turn (ignored when tools are
    /// given: the encoder then keeps every turn's reasoning).
    pub drop_thinking: bool,
}

impl Default for RenderOptions {
    /// vLLM's defaults for a request that says nothing: thinking on, effort unset, drop on.
    fn default() -> Self {
        Self {
            thinking: true,
            reasoning_effort: None,
            drop_thinking: true,
        }
    }
}

impl RenderOptions {
    /// Resolves the options from a request's `reasoning_effort` and `chat_template_kwargs`
    /// (a JSON object; anything else is treated as absent).
    pub fn from_openai(
        reasoning_effort: Option<ReasoningEffort>,
        chat_template_kwargs: Option<&serde_json::Value>,
    ) -> Self {
        let kwargs = chat_template_kwargs.and_then(|v| v.as_object());
        let get = |key: &str| kwargs.and_then(|m| m.get(key));
        let thinking = get("thinking");
        let mut enable_thinking = get("enable_thinking").map(python_truthy);
        if let (Some(effort), None) = (reasoning_effort, get("enable_thinking")) {
            enable_thinking = Some(effort != ReasoningEffort::None);
        }
        let thinking = match (thinking, enable_thinking) {
            (None, None) => true,
            (t, e) => t.is_some_and(python_truthy) || e.unwrap_or(false),
        };
        let reasoning_effort = reasoning_effort.or_else(|| {
            get("reasoning_effort")
                .and_then(|v| v.as_str())
                .map(ReasoningEffort::from_name)
        });
        Self {
            thinking,
            reasoning_effort,
            drop_thinking: get("drop_thinking").is_none_or(python_truthy),
        }
    }

    /// Whether the prompt ends with `<think>` and the model starts inside its reasoning — the
    /// `thinking` flag to give [`super::ChatOutputParser::new`].
    pub fn thinking_mode(&self) -> bool {
        self.thinking && self.reasoning_effort != Some(ReasoningEffort::None)
    }

    /// The effort level the encoder renders (only matters in thinking mode).
    pub fn encoder_effort(&self) -> EncoderEffort {
        use ReasoningEffort as R;
        match self.reasoning_effort {
            None if self.thinking => EncoderEffort::High,
            None | Some(R::None | R::Low | R::Minimal | R::Medium) => EncoderEffort::Low,
            Some(R::Max) => EncoderEffort::Max,
            Some(R::High | R::Xhigh) => EncoderEffort::High,
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
        let e = o(Some(ReasoningEffort::Max), json!({"thinking": false}));
        assert!(e.thinking_mode());
        assert_eq!(e.encoder_effort(), EncoderEffort::Max);
        let e = o(
            Some(ReasoningEffort::Max),
            json!({"enable_thinking": false}),
        );
        assert!(!e.thinking_mode());

        let none = o(Some(ReasoningEffort::None), json!({"thinking": true}));
        assert!(!none.thinking_mode());
        assert_eq!(none.encoder_effort(), EncoderEffort::Low);

        assert_eq!(
            o(Some(ReasoningEffort::Medium), json!({})).encoder_effort(),
            EncoderEffort::Low
        );
        assert_eq!(
            o(Some(ReasoningEffort::Xhigh), json!({})).encoder_effort(),
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
        let k = o(
            Some(ReasoningEffort::Low),
            json!({"reasoning_effort": "max"}),
        );
        assert_eq!(k.encoder_effort(), EncoderEffort::Low);
    }
}
