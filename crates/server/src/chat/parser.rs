//! Streaming parser of DeepSeek-V4 and V4.1 output: reasoning, content and DSML tool calls
//! (each family's spelling, [`Dsml`]; V4.1's parser is vLLM's V4 parser with V4.1's terminals,
//! `parser/deepseek_v41.py`).
//!
//! Input is detokenized text as the server streams it (BOS/EOS, the only `special` tokens,
//! already skipped; `<think>`, `</think>` and `｜DSML｜` are non-special added tokens and
//! survive `skip_special_tokens`). The state machine follows vLLM's DeepSeek-V4 parser:
//!
//! * thinking mode starts inside the reasoning (the prompt ended with `<think>`); `</think>`
//!   ends it, a repeated `<think>` is swallowed, and a tool-call block opened before `</think>`
//!   ends the reasoning too; trailing whitespace of the reasoning is dropped;
//! * in content a stray `</think>` is swallowed and `<think>` starts reasoning again;
//! * a `<｜DSML｜tool_calls>` block (see [`super::markers`] for tolerated spellings) becomes
//!   tool calls; the whitespace just before it belongs to neither; a call is emitted when its
//!   `</｜DSML｜invoke>` (or the block's end, or the end of output) arrives; text after a block
//!   is dropped — a tool call ends the turn — unless another block opens;
//! * an `<｜DSML｜invoke …>` without the wrapper is recovered as a call when it closes and its
//!   name is acceptable (any name, or one of [`ChatOutputParser::with_tool_names`]); if it
//!   never closes it is given back as content.
//!
//! Nothing that might still turn into a marker is emitted: a tail of the buffer that is a
//! prefix of a marker is held until it completes or can no longer match.

use super::dsml::{invoke_arguments, tag_attr};
use super::markers::{find_first, held_tail, Found, Marker};
use super::tokens::Dsml;

/// One piece of parsed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatDelta {
    Reasoning(String),
    Content(String),
    /// A complete tool call; `arguments` is a JSON object text (parameter order kept).
    ToolCall {
        index: usize,
        name: String,
        arguments: String,
    },
}

/// A finished tool call of [`ParsedOutput`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedToolCall {
    pub name: String,
    pub arguments: String,
}

/// The whole output, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedOutput {
    /// `None` when no reasoning text was produced.
    pub reasoning: Option<String>,
    pub content: String,
    pub tool_calls: Vec<ParsedToolCall>,
}

/// Parses a complete output: the concatenation of what [`ChatOutputParser`] streams for it.
pub fn parse_chat_output(
    dsml: &'static Dsml,
    text: &str,
    thinking: bool,
    parse_tool_calls: bool,
) -> ParsedOutput {
    let mut parser = ChatOutputParser::new(dsml, thinking, parse_tool_calls);
    let mut deltas = parser.push(text);
    deltas.extend(parser.finish());
    collect_deltas(deltas)
}

/// Folds deltas into a [`ParsedOutput`].
pub fn collect_deltas(deltas: impl IntoIterator<Item = ChatDelta>) -> ParsedOutput {
    let mut out = ParsedOutput::default();
    for d in deltas {
        match d {
            ChatDelta::Reasoning(r) => out.reasoning.get_or_insert_with(String::new).push_str(&r),
            ChatDelta::Content(c) => out.content.push_str(&c),
            ChatDelta::ToolCall {
                name, arguments, ..
            } => out.tool_calls.push(ParsedToolCall { name, arguments }),
        }
    }
    out
}

/// An `<｜DSML｜invoke` tag still missing its `>` after this many bytes is not a tag.
const MAX_TAG: usize = 1024;

/// Where an invoke tag ends.
enum TagEnd {
    /// One past its `>`.
    At(usize),
    /// No `>` yet; more output may bring it.
    Wait,
    /// Not a tag (no `>` within [`MAX_TAG`] bytes or by the end): the marker is plain text.
    Invalid,
}

impl Found {
    /// The same match after `by` bytes were removed from the front of the buffer.
    fn shifted(self, by: usize) -> Found {
        Found {
            start: self.start - by,
            end: self.end - by,
            ..self
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Reasoning,
    Content,
    /// Inside or after a tool-call block, between invokes: text is dropped.
    Tools,
    /// Inside an invoke: the buffer collects its body.
    Invoke {
        name: String,
    },
    /// An invoke met in content without a wrapper; `raw` is the text consumed so far (for
    /// giving it back as content), the buffer collects the body.
    Orphan {
        name: String,
        raw: String,
    },
}

/// Streaming output parser; feed text with [`push`](Self::push), then call
/// [`finish`](Self::finish) once at the end of generation.
#[derive(Debug, Clone)]
pub struct ChatOutputParser {
    dsml: &'static Dsml,
    state: State,
    parse_tool_calls: bool,
    tool_names: Option<Vec<String>>,
    /// Unconsumed text (in `Invoke`/`Orphan`: the invoke body so far).
    buf: String,
    /// Where the next marker search in `buf` starts (earlier bytes cannot begin one).
    scan_from: usize,
    /// Trailing whitespace of reasoning/content not emitted yet (it may precede a boundary
    /// that swallows it).
    held_ws: String,
    next_index: usize,
}

impl ChatOutputParser {
    /// `dsml`: the family's markup (`ChatFormat::parser` picks it).
    /// `thinking`: the prompt ended with `<think>` (see `RenderOptions::thinking_mode`).
    /// `parse_tool_calls`: recognise DSML tool calls (off: DSML text is plain content).
    pub fn new(dsml: &'static Dsml, thinking: bool, parse_tool_calls: bool) -> Self {
        Self {
            dsml,
            state: if thinking {
                State::Reasoning
            } else {
                State::Content
            },
            parse_tool_calls,
            tool_names: None,
            buf: String::new(),
            scan_from: 0,
            held_ws: String::new(),
            next_index: 0,
        }
    }

    /// Recover an unwrapped `<｜DSML｜invoke>` only for these (the request's) tool names.
    pub fn with_tool_names<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.tool_names = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Feeds the next piece of output text.
    pub fn push(&mut self, text: &str) -> Vec<ChatDelta> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// Ends the output: flushes held text and emits an invoke left open.
    pub fn finish(&mut self) -> Vec<ChatDelta> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        out
    }

    fn wanted(&self) -> &'static [Marker] {
        use Marker::*;
        match (&self.state, self.parse_tool_calls) {
            (State::Reasoning, false) => &[ThinkEnd, ThinkStart],
            (State::Reasoning, true) => &[ThinkEnd, ThinkStart, ToolsStart],
            (State::Content, false) => &[ThinkStart, ThinkEnd],
            (State::Content, true) => &[ThinkStart, ThinkEnd, ToolsStart, InvokeStart],
            (State::Tools, _) => &[InvokeStart, ToolsEnd, ToolsStart],
            (State::Invoke { .. }, _) => &[InvokeEnd, ToolsEnd, InvokeStart],
            (State::Orphan { .. }, _) => &[InvokeEnd],
        }
    }

    /// Processes as much of the buffer as possible; returns whether to go on.
    fn step(&mut self, out: &mut Vec<ChatDelta>, finishing: bool) -> bool {
        let wanted = self.wanted();
        let from = self.scan_from.min(self.buf.len());
        match find_first(self.dsml, &self.buf, from, wanted) {
            Some(found) => {
                self.scan_from = 0;
                self.on_marker(found, out, finishing)
            }
            None => {
                let keep = if finishing {
                    0
                } else {
                    held_tail(self.dsml, &self.buf, wanted)
                };
                self.on_text(self.buf.len() - keep, out, finishing);
                false
            }
        }
    }

    /// No marker in the buffer: everything before `upto` cannot become one.
    fn on_text(&mut self, upto: usize, out: &mut Vec<ChatDelta>, finishing: bool) {
        match &mut self.state {
            State::Reasoning | State::Content => {
                let text: String = self.buf.drain(..upto).collect();
                self.emit_text(&text, out);
                if finishing {
                    self.end_text(out, self.state == State::Content);
                }
            }
            State::Tools => {
                self.buf.drain(..upto);
            }
            State::Invoke { name } => {
                if finishing {
                    let name = std::mem::take(name);
                    let body = std::mem::take(&mut self.buf);
                    self.state = State::Tools;
                    self.emit_call(name, &body, true, out);
                } else {
                    self.scan_from = upto;
                }
            }
            State::Orphan { raw, .. } => {
                if finishing {
                    let text = std::mem::take(raw) + &std::mem::take(&mut self.buf);
                    self.state = State::Content;
                    self.emit_text(&text, out);
                    self.end_text(out, true);
                } else {
                    self.scan_from = upto;
                }
            }
        }
    }

    fn on_marker(&mut self, f: Found, out: &mut Vec<ChatDelta>, finishing: bool) -> bool {
        use Marker::*;
        let before: String = self.buf[..f.start].to_owned();
        match (&self.state, f.marker) {
            (State::Reasoning, ThinkStart) | (State::Content, ThinkEnd) => {
                self.emit_text(&before, out); // swallowed marker; the text goes on
            }
            (State::Reasoning, ThinkEnd) => {
                self.emit_text(&before, out);
                self.end_text(out, false);
                self.state = State::Content;
            }
            (State::Content, ThinkStart) => {
                self.emit_text(&before, out);
                self.end_text(out, true);
                self.state = State::Reasoning;
            }
            (State::Reasoning | State::Content, ToolsStart) => {
                self.emit_text(&before, out);
                self.end_text(out, false);
                self.state = State::Tools;
            }
            (State::Content, InvokeStart) => {
                return self.content_invoke(f, before, out, finishing);
            }
            (State::Tools, InvokeStart) => {
                self.buf.drain(..f.start);
                let f = f.shifted(f.start);
                match self.tag_end(f, finishing) {
                    TagEnd::Wait => return false,
                    TagEnd::Invalid => {
                        self.buf.drain(..f.end);
                    }
                    TagEnd::At(end) => {
                        let name = tag_attr(&self.buf[f.end..end - 1], "name").unwrap_or_default();
                        self.buf.drain(..end);
                        self.state = State::Invoke { name };
                    }
                }
                return true;
            }
            (State::Tools, _) => {} // block start/end between invokes: nothing to do
            (State::Invoke { name }, marker) => {
                let name = name.clone();
                self.state = State::Tools;
                self.emit_call(name, &before, false, out);
                if marker == InvokeStart {
                    // A missing </invoke>: the next invoke starts here.
                    self.buf.drain(..f.start);
                    return true;
                }
            }
            (State::Orphan { name, .. }, _) => {
                let name = name.clone();
                self.state = State::Tools;
                self.emit_call(name, &before, false, out);
            }
            (State::Reasoning, _) | (State::Content, _) => {}
        }
        self.buf.drain(..f.end);
        true
    }

    /// An `<｜DSML｜invoke` met in content: start recovering an unwrapped call, or treat the
    /// text as content if the tag is not one.
    fn content_invoke(
        &mut self,
        f: Found,
        before: String,
        out: &mut Vec<ChatDelta>,
        finishing: bool,
    ) -> bool {
        self.emit_text(&before, out);
        self.buf.drain(..f.start);
        let f = f.shifted(f.start);
        let tag_end = match self.tag_end(f, finishing) {
            TagEnd::Wait => return false,
            TagEnd::Invalid => None,
            TagEnd::At(end) => Some(end),
        };
        let name = tag_end
            .and_then(|end| tag_attr(&self.buf[f.end..end - 1], "name"))
            .unwrap_or_default();
        let accepted = !name.is_empty()
            && self
                .tool_names
                .as_ref()
                .is_none_or(|names| names.contains(&name));
        match tag_end {
            Some(end) if accepted => {
                let raw = std::mem::take(&mut self.held_ws) + &self.buf[..end];
                self.buf.drain(..end);
                self.state = State::Orphan { name, raw };
            }
            _ => {
                // Not a call: the marker text is content; scanning resumes after it.
                let text: String = self.buf.drain(..f.end).collect();
                self.emit_text(&text, out);
            }
        }
        true
    }

    /// Where the tag opened by `f` (at the start of the buffer) ends.
    fn tag_end(&self, f: Found, finishing: bool) -> TagEnd {
        match self.buf[f.end..].find('>') {
            Some(p) if p <= MAX_TAG => TagEnd::At(f.end + p + 1),
            None if !finishing && self.buf.len() - f.end <= MAX_TAG => TagEnd::Wait,
            _ => TagEnd::Invalid,
        }
    }

    /// Emits reasoning/content text (per state), holding back its trailing whitespace.
    fn emit_text(&mut self, text: &str, out: &mut Vec<ChatDelta>) {
        if text.is_empty() {
            return;
        }
        let trimmed = text.trim_end();
        if trimmed.is_empty() {
            self.held_ws.push_str(text);
            return;
        }
        let mut piece = std::mem::take(&mut self.held_ws);
        piece.push_str(trimmed);
        self.held_ws.push_str(&text[trimmed.len()..]);
        self.push_delta(piece, out);
    }

    /// The current text run ends: its held whitespace is emitted (`keep`) or dropped.
    fn end_text(&mut self, out: &mut Vec<ChatDelta>, keep: bool) {
        let ws = std::mem::take(&mut self.held_ws);
        if keep && !ws.is_empty() {
            self.push_delta(ws, out);
        }
    }

    fn push_delta(&mut self, text: String, out: &mut Vec<ChatDelta>) {
        let reasoning = self.state == State::Reasoning;
        match (out.last_mut(), reasoning) {
            (Some(ChatDelta::Reasoning(prev)), true) | (Some(ChatDelta::Content(prev)), false) => {
                prev.push_str(&text)
            }
            (_, true) => out.push(ChatDelta::Reasoning(text)),
            (_, false) => out.push(ChatDelta::Content(text)),
        }
    }

    fn emit_call(&mut self, name: String, body: &str, truncated: bool, out: &mut Vec<ChatDelta>) {
        if name.is_empty() {
            return;
        }
        out.push(ChatDelta::ToolCall {
            index: self.next_index,
            name,
            arguments: invoke_arguments(body, truncated, self.dsml),
        });
        self.next_index += 1;
    }
}
