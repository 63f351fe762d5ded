//! The answer's content blocks, built from the chat parser's deltas as Anthropic streams them:
//! a block starts, takes deltas, stops; a new kind of delta closes the open block and starts
//! the next. The whole response is the same events folded ([`Whole`]), so both forms hold
//! the same blocks in the same order.

use crate::chat::ChatDelta;
use crate::state::response_id;
use serde::Serialize;
use serde_json::value::RawValue;

/// How a block begins.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockStart {
    Thinking,
    Text,
    ToolUse { id: String, name: String },
}

/// What a block takes.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockDelta {
    Thinking(String),
    /// A thinking block's signature, sent just before it stops. V4 signs nothing: it is an
    /// opaque token the client sends back and the server ignores.
    Signature(String),
    Text(String),
    /// A tool call's input as JSON text (the whole object at once: the parser emits a call
    /// only when it is complete).
    InputJson(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum BlockEvent {
    Start(usize, BlockStart),
    Delta(usize, BlockDelta),
    Stop(usize),
}

/// Turns parser deltas into block events; counts the tool calls.
#[derive(Debug, Default)]
pub struct Blocks {
    /// The open block: its index and whether it is a thinking block.
    open: Option<(usize, bool)>,
    next: usize,
    pub tool_calls: usize,
    /// Only the first tool call is kept (`disable_parallel_tool_use`).
    single_tool_call: bool,
}

impl Blocks {
    pub fn new(single_tool_call: bool) -> Self {
        Self {
            single_tool_call,
            ..Default::default()
        }
    }

    pub fn push(&mut self, delta: ChatDelta, out: &mut Vec<BlockEvent>) {
        match delta {
            ChatDelta::Reasoning(t) if !t.is_empty() => {
                let i = self.open_kind(BlockStart::Thinking, out);
                out.push(BlockEvent::Delta(i, BlockDelta::Thinking(t)));
            }
            ChatDelta::Content(t) if !t.is_empty() => {
                let i = self.open_kind(BlockStart::Text, out);
                out.push(BlockEvent::Delta(i, BlockDelta::Text(t)));
            }
            ChatDelta::ToolCall {
                name, arguments, ..
            } => {
                if self.single_tool_call && self.tool_calls > 0 {
                    return;
                }
                self.tool_calls += 1;
                let id = response_id("toolu").replacen('-', "_", 1);
                let i = self.open_kind(BlockStart::ToolUse { id, name }, out);
                out.push(BlockEvent::Delta(i, BlockDelta::InputJson(arguments)));
                self.close(out);
            }
            _ => {}
        }
    }

    /// Closes the open block (the end of the answer).
    pub fn close(&mut self, out: &mut Vec<BlockEvent>) {
        if let Some((i, thinking)) = self.open.take() {
            if thinking {
                let sig = response_id("sig").replacen('-', "_", 1);
                out.push(BlockEvent::Delta(i, BlockDelta::Signature(sig)));
            }
            out.push(BlockEvent::Stop(i));
        }
    }

    /// The index of an open block of `start`'s kind, starting one (and closing another kind)
    /// if needed. Tool calls always start a block of their own.
    fn open_kind(&mut self, start: BlockStart, out: &mut Vec<BlockEvent>) -> usize {
        let thinking = start == BlockStart::Thinking;
        let same = match (&self.open, &start) {
            (Some((_, t)), BlockStart::Thinking | BlockStart::Text) => *t == thinking,
            _ => false,
        };
        if let (true, Some((i, _))) = (same, self.open) {
            return i;
        }
        self.close(out);
        let i = self.next;
        self.next += 1;
        self.open = Some((i, thinking));
        out.push(BlockEvent::Start(i, start));
        i
    }
}

/// A block of a whole response.
#[derive(Serialize, Debug)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Thinking {
        thinking: String,
        signature: String,
    },
    Text {
        text: String,
    },
    /// `input` is the call's arguments as the parser wrote them (key order kept).
    ToolUse {
        id: String,
        name: String,
        input: Box<RawValue>,
    },
}

/// The blocks of a whole response: the stream's events applied in order.
#[derive(Debug, Default)]
pub struct Whole {
    pub blocks: Vec<ContentBlock>,
}

impl Whole {
    pub fn apply(&mut self, event: BlockEvent) {
        match event {
            BlockEvent::Start(_, start) => self.blocks.push(match start {
                BlockStart::Thinking => ContentBlock::Thinking {
                    thinking: String::new(),
                    signature: String::new(),
                },
                BlockStart::Text => ContentBlock::Text {
                    text: String::new(),
                },
                BlockStart::ToolUse { id, name } => ContentBlock::ToolUse {
                    id,
                    name,
                    input: empty_object(),
                },
            }),
            BlockEvent::Delta(_, delta) => match (self.blocks.last_mut(), delta) {
                (Some(ContentBlock::Thinking { thinking, .. }), BlockDelta::Thinking(t)) => {
                    thinking.push_str(&t)
                }
                (Some(ContentBlock::Thinking { signature, .. }), BlockDelta::Signature(s)) => {
                    *signature = s
                }
                (Some(ContentBlock::Text { text }), BlockDelta::Text(t)) => text.push_str(&t),
                (Some(ContentBlock::ToolUse { input, .. }), BlockDelta::InputJson(j)) => {
                    // The parser writes a JSON object; anything else would be its bug.
                    *input = RawValue::from_string(j).unwrap_or_else(|_| empty_object());
                }
                // `Blocks` starts a block of the delta's kind before any delta.
                (block, delta) => debug_assert!(false, "{delta:?} cannot apply to {block:?}"),
            },
            BlockEvent::Stop(_) => {}
        }
    }
}

fn empty_object() -> Box<RawValue> {
    RawValue::from_string("{}".into()).expect("valid JSON")
}

impl BlockEvent {
    /// The event as Anthropic streams it (its `type` is also the SSE event name).
    pub fn wire(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            BlockEvent::Start(index, start) => {
                let block = match start {
                    BlockStart::Thinking => {
                        json!({"type": "thinking", "thinking": "", "signature": ""})
                    }
                    BlockStart::Text => json!({"type": "text", "text": ""}),
                    BlockStart::ToolUse { id, name } => {
                        json!({"type": "tool_use", "id": id, "name": name, "input": {}})
                    }
                };
                json!({"type": "content_block_start", "index": index, "content_block": block})
            }
            BlockEvent::Delta(index, delta) => {
                let delta = match delta {
                    BlockDelta::Thinking(t) => json!({"type": "thinking_delta", "thinking": t}),
                    BlockDelta::Signature(s) => json!({"type": "signature_delta", "signature": s}),
                    BlockDelta::Text(t) => json!({"type": "text_delta", "text": t}),
                    BlockDelta::InputJson(j) => {
                        json!({"type": "input_json_delta", "partial_json": j})
                    }
                };
                json!({"type": "content_block_delta", "index": index, "delta": delta})
            }
            BlockEvent::Stop(index) => json!({"type": "content_block_stop", "index": index}),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(deltas: Vec<ChatDelta>, single: bool) -> Vec<BlockEvent> {
        let mut blocks = Blocks::new(single);
        let mut out = Vec::new();
        for d in deltas {
            blocks.push(d, &mut out);
        }
        blocks.close(&mut out);
        out
    }

    fn call(name: &str, arguments: &str) -> ChatDelta {
        ChatDelta::ToolCall {
            index: 0,
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn deltas_become_blocks_in_order_and_fold_into_the_whole_message() {
        let deltas = vec![
            ChatDelta::Reasoning("I should ".into()),
            ChatDelta::Reasoning("look.".into()),
            ChatDelta::Content(String::new()),
            ChatDelta::Content("Checking.".into()),
            call("get", r#"{"b": 1, "a": 2}"#),
            call("put", "{}"),
        ];
        let ev = events(deltas, false);
        let kinds: Vec<String> = ev
            .iter()
            .map(|e| {
                let w = e.wire();
                let sub = w["delta"]["type"]
                    .as_str()
                    .or(w["content_block"]["type"].as_str());
                format!(
                    "{}:{}:{}",
                    w["type"].as_str().unwrap(),
                    w["index"],
                    sub.unwrap_or("")
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "content_block_start:0:thinking",
                "content_block_delta:0:thinking_delta",
                "content_block_delta:0:thinking_delta",
                "content_block_delta:0:signature_delta",
                "content_block_stop:0:",
                "content_block_start:1:text",
                "content_block_delta:1:text_delta",
                "content_block_stop:1:",
                "content_block_start:2:tool_use",
                "content_block_delta:2:input_json_delta",
                "content_block_stop:2:",
                "content_block_start:3:tool_use",
                "content_block_delta:3:input_json_delta",
                "content_block_stop:3:",
            ]
        );
        let mut whole = Whole::default();
        for e in ev {
            whole.apply(e);
        }
        let json = serde_json::to_string(&whole.blocks).unwrap();
        assert!(
            json.contains(r#"{"type":"thinking","thinking":"I should look.","signature":"sig_"#),
            "{json}"
        );
        assert!(
            json.contains(r#"{"type":"text","text":"Checking."}"#),
            "{json}"
        );
        // The input keeps the order the model wrote its parameters in.
        assert!(
            json.contains(r#""name":"get","input":{"b": 1, "a": 2}}"#),
            "{json}"
        );
        assert!(json.contains(r#""name":"put","input":{}}"#), "{json}");
    }

    #[test]
    fn disable_parallel_tool_use_keeps_the_first_call() {
        let ev = events(vec![call("a", "{}"), call("b", "{}")], true);
        assert_eq!(ev.len(), 3);
        assert!(
            matches!(&ev[0], BlockEvent::Start(0, BlockStart::ToolUse { name, .. }) if name == "a")
        );
    }
}
