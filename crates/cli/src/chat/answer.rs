//! One answer as it streams: token ids to text (the server's incremental detokenizer, so a
//! character split across tokens is never shown in halves), text to reasoning and content
//! (the server's output parser of the model's format), and the numbers shown after it.

use deepinfer_server::chat::{ChatDelta, ChatFormat, ChatOutputParser};
use deepinfer_server::tokenizer::{IncrementalDetokenizer, Tokenizer};
use std::time::Instant;

pub(super) struct AnswerText {
    detok: IncrementalDetokenizer,
    parser: ChatOutputParser,
    /// Everything parsed so far, for the history.
    pub reasoning: String,
    pub content: String,
}

impl AnswerText {
    /// `thinking`: the prompt ended with `<think>`, so the answer starts in its reasoning.
    pub fn new(tokenizer: &Tokenizer, prompt: &[u32], format: ChatFormat, thinking: bool) -> Self {
        Self {
            // BOS/EOS are the only special tokens; the V4 markers survive skipping them.
            detok: IncrementalDetokenizer::with_prompt(tokenizer.clone(), prompt, true),
            // No tools are offered, so DSML in the output is plain text.
            parser: format.parser(thinking, false),
            reasoning: String::new(),
            content: String::new(),
        }
    }

    /// Feeds new ids; `last` ends the answer (held text comes out). Returns what to show.
    pub fn push(&mut self, ids: &[u32], last: bool) -> Vec<ChatDelta> {
        let mut text = self.detok.push_all(ids);
        if last {
            text.push_str(&self.detok.flush());
        }
        let mut deltas = self.parser.push(&text);
        if last {
            deltas.extend(self.parser.finish());
        }
        for d in &deltas {
            match d {
                ChatDelta::Reasoning(t) => self.reasoning.push_str(t),
                ChatDelta::Content(t) => self.content.push_str(t),
                ChatDelta::ToolCall { .. } => {}
            }
        }
        deltas
    }

    /// The reasoning for the history (`None` when there was none).
    pub fn take(self) -> (Option<String>, String) {
        let reasoning = (!self.reasoning.is_empty()).then_some(self.reasoning);
        (reasoning, self.content)
    }
}

/// The numbers of one answer, as llama-cli prints its timings.
pub(super) struct Stats {
    pub prompt: usize,
    /// Prompt tokens the prefix cache held.
    pub cached: usize,
    pub generated: usize,
    submitted: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Stats {
    pub fn new(prompt: usize) -> Self {
        Self {
            prompt,
            cached: 0,
            generated: 0,
            submitted: Instant::now(),
            first: None,
            last: None,
        }
    }

    /// Counts a delta of `tokens` new tokens arriving now.
    pub fn add(&mut self, tokens: usize, cached: usize) {
        self.cached = cached;
        if tokens == 0 {
            return;
        }
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.generated += tokens;
    }

    /// `N prompt tokens (M cached), K generated, X tok/s`: the rate of the tokens after the
    /// first (the first one's wait is the prompt's, shown as time to first token).
    pub fn line(&self) -> String {
        let mut s = format!(
            "{} prompt tokens ({} cached), {} generated",
            self.prompt, self.cached, self.generated
        );
        if let Some(first) = self.first {
            let ttft = first.duration_since(self.submitted).as_secs_f64();
            s.push_str(&format!(", first after {:.2} s", ttft));
        }
        if let (Some(first), Some(last)) = (self.first, self.last) {
            let secs = last.duration_since(first).as_secs_f64();
            if self.generated > 1 && secs > 0.0 {
                let rate = (self.generated - 1) as f64 / secs;
                s.push_str(&format!(", {rate:.1} tok/s"));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::Stats;

    #[test]
    fn stats_line_says_tokens_and_cache() {
        let mut s = Stats::new(40);
        assert_eq!(s.line(), "40 prompt tokens (0 cached), 0 generated");
        s.add(0, 32);
        s.add(1, 32);
        let line = s.line();
        assert!(
            line.starts_with("40 prompt tokens (32 cached), 1 generated, first after "),
            "{line}"
        );
        assert!(!line.contains("tok/s"));
    }
}
