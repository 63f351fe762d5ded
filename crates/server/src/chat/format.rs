//! A model family's chat format, chosen once from the checkpoint: how a conversation becomes
//! the prompt, the markup its tool calls are written in, and how its output is read back.
//! Everything that renders a turn or parses an answer (the three chat APIs, `/tokenize`,
//! `deepinfer chat`, forced-call grammars) goes through the server's one [`ChatFormat`].

use super::error::ChatError;
use super::options::RenderOptions;
use super::parser::ChatOutputParser;
use super::render::render_v4;
use super::tokens::{
    Dsml, ASSISTANT, DSML, DSML_V4, DSML_V41, SYSTEM, THINK_END, THINK_START, USER,
};
use super::v41::render_v41;
use super::{ChatMessage, ToolDef};

/// The chat format of a model family (docs/MODEL.md §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatFormat {
    /// DeepSeek-V4 (Flash, Pro, 0731, Flash-Vision-Exp): vLLM's `deepseek_v4_encoding.py`.
    V4,
    /// DeepSeek-V4.1: vLLM's `deepseek_v41.py` and `deepseek_v41_encoding.py`.
    V41,
}

impl ChatFormat {
    /// The format of a checkpoint: V4.1's for `model_type: deepseek_v41`, else V4's.
    pub fn for_model(is_v41: bool) -> Self {
        if is_v41 {
            ChatFormat::V41
        } else {
            ChatFormat::V4
        }
    }

    /// vLLM's name for the family's tokenizer mode and parsers.
    pub fn name(self) -> &'static str {
        match self {
            ChatFormat::V4 => "deepseek_v4",
            ChatFormat::V41 => "deepseek_v41",
        }
    }

    /// The family's tool-call markup.
    pub fn markup(self) -> &'static Dsml {
        match self {
            ChatFormat::V4 => &DSML_V4,
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
            ChatFormat::V4 => render_v4(messages, tools, opts),
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
            ChatFormat::V4 => &[USER, ASSISTANT, THINK_START, THINK_END, DSML],
            ChatFormat::V41 => &[SYSTEM, USER, ASSISTANT, THINK_START, THINK_END, DSML],
        }
    }
}
