//! A model family's chat format, chosen once from the checkpoint: how a conversation becomes
//! the prompt, the markup its tool calls are written in, and how its output is read back.
//! Everything that renders a turn or parses an answer (the three chat APIs, `/tokenize`,
//! `deepinfer chat`, forced-call grammars) goes through the server's one [`ChatFormat`].

use super::error::ChatError;
use super::options::RenderOptions;
use super::parser::ChatOutputParser;
use super::render::{official_preamble, preview_preamble, render_v4};
use super::tokens::{
    Dsml, ASSISTANT, DSML, DSML_V4, DSML_V41, SYSTEM, THINK_END, THINK_START, USER,
};
use super::v41::render_v41;
use super::{ChatMessage, ToolDef};

/// The chat format of a model family (docs/MODEL.md §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatFormat {
    /// DeepSeek-V4 (Flash, Pro, 0731, Flash-Vision-Exp): vLLM's `deepseek_v4_encoding.py`,
    /// whose effort tiers are the 0731 encoder's (`low` none, `high` "Absolute maximum…",
    /// `max` "Beyond maximum…").
    V4,
    /// V4 with the effort tiers of the preview checkpoints' own encoder
    /// (`encoding/encoding_dsv4.py` before 0731): no "Beyond maximum" tier; `max` renders the
    /// "Absolute maximum" preamble and every other effort none (its default is `low`).
    V4Preview,
    /// DeepSeek-V4.1: vLLM's `deepseek_v41.py` and `deepseek_v41_encoding.py`.
    V41,
}

impl ChatFormat {
    /// The format of a checkpoint: V4.1's for `model_type: deepseek_v41`, else V4's with the
    /// effort tiers of the encoder the checkpoint ships (`encoding/encoding_dsv4.py`'s text,
    /// when it has one; see [`Self::v4_tiers_of`]), else vLLM 0.33's.
    pub fn for_model(is_v41: bool, v4_encoder: Option<&str>) -> Self {
        match (is_v41, v4_encoder.and_then(Self::v4_tiers_of)) {
            (true, _) => ChatFormat::V41,
            (false, Some(format)) => format,
            (false, None) => ChatFormat::V4,
        }
    }

    /// Which tiers a V4 checkpoint's own encoder defines, read off its source as SGLang reads
    /// it (`chat_encoding._detect_dsv4_reasoning_effort_profile`): a `REASONING_EFFORT_PROMPTS`
    /// table with `low`, `high` and `max` and a `low` default is the 0731 encoder's; a
    /// `REASONING_EFFORT_MAX` constant the preview's; anything else says nothing.
    pub fn v4_tiers_of(encoder_source: &str) -> Option<Self> {
        let assigns = |name: &str| {
            encoder_source.lines().any(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.trim_start().starts_with(['=', ':']))
            })
        };
        let low_default = encoder_source.lines().any(|l| {
            l.strip_prefix("DEFAULT_REASONING_EFFORT")
                .and_then(|rest| rest.split_once('='))
                .is_some_and(|(_, v)| matches!(v.trim(), "\"low\"" | "'low'"))
        });
        let table = encoder_source
            .split_once("REASONING_EFFORT_PROMPTS")
            .map_or("", |(_, rest)| {
                rest.split_once('}').map_or(rest, |(t, _)| t)
            });
        let tiers = ["low", "high", "max"]
            .iter()
            .all(|t| table.contains(&format!("\"{t}\"")) || table.contains(&format!("'{t}'")));
        if low_default && tiers {
            Some(ChatFormat::V4)
        } else if assigns("REASONING_EFFORT_MAX") {
            Some(ChatFormat::V4Preview)
        } else {
            None
        }
    }

    /// The name the start-up log prints: vLLM's tokenizer-mode name for the family.
    pub fn name(self) -> &'static str {
        match self {
            ChatFormat::V4 => "deepseek_v4",
            ChatFormat::V4Preview => "deepseek_v4 (preview efforts)",
            ChatFormat::V41 => "deepseek_v41",
        }
    }

    /// The family's tool-call markup.
    pub fn markup(self) -> &'static Dsml {
        match self {
            ChatFormat::V4 | ChatFormat::V4Preview => &DSML_V4,
            ChatFormat::V41 => &DSML_V41,
        }
    }

    /// Renders the full prompt (BOS included, ending with the generation prompt
    /// `<｜Assistant｜><think>` or `<｜Assistant｜></think>`). Encode it without adding special
    /// tokens: the BOS is already in the text.
    pub fn render(
        self,
        messages: &[ChatMessage],
        tools: &[ToolDef],
        opts: &RenderOptions,
    ) -> Result<String, ChatError> {
        for (index, tool) in tools.iter().enumerate() {
            if tool.r#type != "function" {
                return Err(ChatError::UnsupportedToolType {
                    index,
                    kind: tool.r#type.clone(),
                });
            }
        }
        if messages.last().is_some_and(|m| m.role == "assistant") {
            return Err(ChatError::TrailingAssistant {
                index: messages.len() - 1,
            });
        }
        match self {
            ChatFormat::V4 => render_v4(messages, tools, opts, official_preamble),
            ChatFormat::V4Preview => render_v4(messages, tools, opts, preview_preamble),
            ChatFormat::V41 => render_v41(messages, tools, opts),
        }
    }

    /// A streaming parser of the family's output. `thinking`: the prompt ended with `<think>`
    /// ([`RenderOptions::thinking_mode`]); `parse_tool_calls`: recognise tool calls.
    pub fn parser(self, thinking: bool, parse_tool_calls: bool) -> ChatOutputParser {
        ChatOutputParser::new(self.markup(), thinking, parse_tool_calls)
    }

    /// The markers the format's prompts and parser rely on being single tokens; a tokenizer
    /// lacking one still works (the text tokenizes as pieces) but is off the model's format.
    pub fn marker_tokens(self) -> &'static [&'static str] {
        match self {
            ChatFormat::V4 | ChatFormat::V4Preview => {
                &[USER, ASSISTANT, THINK_START, THINK_END, DSML]
            }
            ChatFormat::V41 => &[SYSTEM, USER, ASSISTANT, THINK_START, THINK_END, DSML],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiers read off a checkpoint's encoder, as SGLang reads them.
    #[test]
    fn v4_tiers_from_the_shipped_encoder() {
        let official = "DEFAULT_REASONING_EFFORT = \"low\"\nREASONING_EFFORT_PROMPTS: Dict[str, str] = {\n    \"low\": \"\",\n    \"high\": (\"a\"),\n    \"max\": (\"b\"),\n}\n";
        assert_eq!(ChatFormat::v4_tiers_of(official), Some(ChatFormat::V4));
        let preview = "REASONING_EFFORT_MAX = (\n    \"Reasoning Effort: Absolute maximum\"\n)\n";
        assert_eq!(
            ChatFormat::v4_tiers_of(preview),
            Some(ChatFormat::V4Preview)
        );
        assert_eq!(ChatFormat::v4_tiers_of("x = 1\n"), None);
        // A high default is not the 0731 table.
        let odd = official.replace("\"low\"\nREASONING", "\"high\"\nREASONING");
        assert_eq!(ChatFormat::v4_tiers_of(&odd), None);
        assert_eq!(ChatFormat::for_model(true, Some(preview)), ChatFormat::V41);
        assert_eq!(
            ChatFormat::for_model(false, Some(preview)),
            ChatFormat::V4Preview
        );
        assert_eq!(ChatFormat::for_model(false, None), ChatFormat::V4);
    }
}
