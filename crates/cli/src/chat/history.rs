//! The conversation so far, rendered whole in the model's chat format for every turn: the
//! earlier turns come out as the same tokens each time, so the engine's prefix cache holds
//! them and a turn computes little more than its own message.
//!
//! Earlier answers go back with their reasoning; whether it is rendered is the format's rule
//! ([`RenderOptions::drop_thinking`], on as in vLLM: in thinking mode reasoning before the
//! last user turn is dropped), not the chat's.

use anyhow::{Context, Result};
use deepinfer_server::chat::{ChatFormat, ChatMessage, MessageContent, RenderOptions};
use deepinfer_server::tokenizer::Tokenizer;

pub(super) struct History {
    format: ChatFormat,
    messages: Vec<ChatMessage>,
    options: RenderOptions,
}

impl History {
    pub fn new(format: ChatFormat, thinking: bool) -> Self {
        Self {
            format,
            messages: Vec::new(),
            options: RenderOptions {
                thinking,
                ..RenderOptions::default()
            },
        }
    }

    /// The format answers are parsed in.
    pub fn format(&self) -> ChatFormat {
        self.format
    }

    /// Whether answers start inside the reasoning (the prompt ends with `<think>`).
    pub fn thinking(&self) -> bool {
        self.options.thinking_mode()
    }

    /// Turns thinking mode on or off for the next answers; returns the new state.
    pub fn toggle_thinking(&mut self) -> bool {
        self.options.thinking = !self.options.thinking;
        self.thinking()
    }

    pub fn reset(&mut self) {
        self.messages.clear();
    }

    pub fn push_user(&mut self, text: String) {
        self.messages.push(message("user", text, None));
    }

    /// Takes back the last user message (its answer was stopped, or did not fit).
    pub fn pop_user(&mut self) {
        if self.messages.last().is_some_and(|m| m.role == "user") {
            self.messages.pop();
        }
    }

    pub fn push_answer(&mut self, reasoning: Option<String>, content: String) {
        self.messages.push(message("assistant", content, reasoning));
    }

    /// The prompt for the next answer: the whole conversation, tokenized.
    pub fn prompt_ids(&self, tokenizer: &Tokenizer) -> Result<Vec<u32>> {
        let text = (self.format)
            .render(&self.messages, &[], &self.options)
            .context("rendering the conversation")?;
        // The rendered text carries its own BOS.
        tokenizer
            .encode(&text, false)
            .context("tokenizing the conversation")
    }
}

fn message(role: &str, text: String, reasoning: Option<String>) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content: Some(MessageContent::Text(text)),
        reasoning,
        ..ChatMessage::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deepinfer_server::chat::tokens::{ASSISTANT, EOS, THINK_END, THINK_START, USER};

    fn render(h: &History) -> String {
        h.format.render(&h.messages, &[], &h.options).unwrap()
    }

    #[test]
    fn earlier_turns_keep_their_text_and_lose_reasoning_in_thinking_mode() {
        let mut h = History::new(ChatFormat::V4, true);
        h.push_user("hi".into());
        let first = render(&h);
        assert!(first.ends_with(&format!("{USER}hi{ASSISTANT}{THINK_START}")));
        h.push_answer(Some("why".into()), "hello".into());
        h.push_user("again".into());
        let second = render(&h);
        // The first prompt up to its opener is the second's prefix: the cache reuses it.
        assert!(second.starts_with(&first[..first.len() - THINK_START.len()]));
        assert!(second.contains(&format!("{THINK_END}hello{EOS}{USER}again")));
        assert!(!second.contains("why"));
    }

    #[test]
    fn chat_mode_prompts_extend_each_other() {
        let mut h = History::new(ChatFormat::V4, false);
        assert!(!h.thinking());
        h.push_user("hi".into());
        let first = render(&h);
        h.push_answer(None, "hello".into());
        h.push_user("again".into());
        assert!(render(&h).starts_with(&format!("{first}hello{EOS}")));
        assert!(h.toggle_thinking());
        h.pop_user();
        h.reset();
        h.push_user("new".into());
        assert!(!render(&h).contains("hello"));
    }
}
