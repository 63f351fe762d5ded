//! The answer as Responses output items, built from the chat parser's deltas with the events
//! that stream them: an item is added, takes deltas, is done; a new kind of delta finishes
//! the open item and adds the next. The items kept here are the whole response's `output`,
//! so the streamed and the whole answer are one computation.

use crate::chat::ChatDelta;
use crate::state::response_id;
use serde::Serialize;
use serde_json::{json, Value};

#[derive(Serialize, Debug, Clone)]
pub struct TextPart {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<Value>>,
}

/// One output item, as the Responses API shows it.
#[derive(Serialize, Debug, Clone)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The model's reasoning as `reasoning_text` content (vLLM's form for open models); no
    /// summary, nothing encrypted.
    Reasoning {
        id: String,
        summary: Vec<Value>,
        content: Vec<TextPart>,
        status: &'static str,
    },
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<TextPart>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
        arguments: String,
        status: &'static str,
    },
}

impl OutputItem {
    fn id(&self) -> &str {
        match self {
            OutputItem::Reasoning { id, .. }
            | OutputItem::Message { id, .. }
            | OutputItem::FunctionCall { id, .. } => id,
        }
    }

    fn set_status(&mut self, to: &'static str) {
        match self {
            OutputItem::Reasoning { status, .. }
            | OutputItem::Message { status, .. }
            | OutputItem::FunctionCall { status, .. } => *status = to,
        }
    }
}

fn fresh_id(prefix: &str) -> String {
    response_id(prefix).replacen('-', "_", 1)
}

fn part(kind: &'static str) -> TextPart {
    let message = kind == "output_text";
    TextPart {
        kind,
        text: String::new(),
        annotations: message.then(Vec::new),
        logprobs: message.then(Vec::new),
    }
}

/// Builds the output items and their events (each a JSON object without its
/// `sequence_number`, which the stream adds).
#[derive(Debug, Default)]
pub struct Items {
    pub items: Vec<OutputItem>,
    /// Whether the last item is still taking text.
    open: bool,
    /// Each offered tool's flat name → its namespace and own name.
    names: Vec<(String, Option<String>, String)>,
    single_tool_call: bool,
    pub tool_calls: usize,
}

impl Items {
    pub fn new(names: Vec<(String, Option<String>, String)>, single_tool_call: bool) -> Self {
        Self {
            names,
            single_tool_call,
            ..Default::default()
        }
    }

    pub fn push(&mut self, delta: ChatDelta, out: &mut Vec<Value>) {
        match delta {
            ChatDelta::Reasoning(t) if !t.is_empty() => self.text("reasoning_text", t, out),
            ChatDelta::Content(t) if !t.is_empty() => self.text("output_text", t, out),
            ChatDelta::ToolCall {
                name, arguments, ..
            } => {
                if self.single_tool_call && self.tool_calls > 0 {
                    return;
                }
                self.tool_calls += 1;
                self.close("completed", out);
                let (name, namespace) = self.own_name(name);
                let arguments_done = arguments.clone();
                let item = OutputItem::FunctionCall {
                    id: fresh_id("fc"),
                    call_id: fresh_id("call"),
                    name,
                    namespace,
                    arguments: String::new(),
                    status: "in_progress",
                };
                let (index, id) = (self.items.len(), item.id().to_owned());
                out.push(json!({"type": "response.output_item.added", "output_index": index, "item": item}));
                out.push(
                    json!({"type": "response.function_call_arguments.delta", "item_id": id,
                                "output_index": index, "delta": arguments}),
                );
                out.push(
                    json!({"type": "response.function_call_arguments.done", "item_id": id,
                                "output_index": index, "arguments": arguments_done}),
                );
                let mut item = item;
                if let OutputItem::FunctionCall {
                    arguments, status, ..
                } = &mut item
                {
                    *arguments = arguments_done;
                    *status = "completed";
                }
                out.push(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
                self.items.push(item);
            }
            _ => {}
        }
    }

    /// A call's name as offered: `namespace__name` is answered as the namespace's own tool.
    fn own_name(&self, flat: String) -> (String, Option<String>) {
        match self.names.iter().find(|(f, ..)| *f == flat) {
            Some((_, Some(ns), own)) => (own.clone(), Some(ns.clone())),
            _ => (flat, None),
        }
    }

    /// Appends text to the open item of `kind`, adding one (and finishing another) if needed.
    fn text(&mut self, kind: &'static str, t: String, out: &mut Vec<Value>) {
        let reasoning = kind == "reasoning_text";
        let same = self.open
            && matches!(
                (self.items.last(), reasoning),
                (Some(OutputItem::Reasoning { .. }), true)
                    | (Some(OutputItem::Message { .. }), false)
            );
        if !same {
            self.close("completed", out);
            self.add(reasoning, out);
        }
        let index = self.items.len() - 1;
        let item = self.items.last_mut().expect("added above");
        let (id, content) = match item {
            OutputItem::Reasoning { id, content, .. } | OutputItem::Message { id, content, .. } => {
                (id, content)
            }
            OutputItem::FunctionCall { .. } => unreachable!("text items only"),
        };
        content[0].text.push_str(&t);
        let event = if reasoning {
            "response.reasoning_text.delta"
        } else {
            "response.output_text.delta"
        };
        let mut e = json!({"type": event, "item_id": id, "output_index": index, "content_index": 0, "delta": t});
        if !reasoning {
            e["logprobs"] = json!([]);
        }
        out.push(e);
    }

    fn add(&mut self, reasoning: bool, out: &mut Vec<Value>) {
        let kind = if reasoning {
            "reasoning_text"
        } else {
            "output_text"
        };
        let item = if reasoning {
            OutputItem::Reasoning {
                id: fresh_id("rs"),
                summary: Vec::new(),
                content: Vec::new(),
                status: "in_progress",
            }
        } else {
            OutputItem::Message {
                id: fresh_id("msg"),
                status: "in_progress",
                role: "assistant",
                content: Vec::new(),
            }
        };
        let index = self.items.len();
        out.push(
            json!({"type": "response.output_item.added", "output_index": index, "item": item}),
        );
        out.push(json!({"type": "response.content_part.added", "item_id": item.id(), "output_index": index,
                        "content_index": 0, "part": part(kind)}));
        let mut item = item;
        match &mut item {
            OutputItem::Reasoning { content, .. } | OutputItem::Message { content, .. } => {
                content.push(part(kind))
            }
            OutputItem::FunctionCall { .. } => {}
        }
        self.items.push(item);
        self.open = true;
    }

    /// Finishes the open text item with `status` (`incomplete` when the budget ran out).
    pub fn close(&mut self, status: &'static str, out: &mut Vec<Value>) {
        if !std::mem::take(&mut self.open) {
            return;
        }
        let index = self.items.len() - 1;
        let item = self.items.last_mut().expect("an open item");
        item.set_status(status);
        let id = item.id().to_owned();
        let (done, part) = match &*item {
            OutputItem::Reasoning { content, .. } => ("response.reasoning_text.done", &content[0]),
            OutputItem::Message { content, .. } => ("response.output_text.done", &content[0]),
            OutputItem::FunctionCall { .. } => unreachable!("text items only"),
        };
        out.push(json!({"type": done, "item_id": id, "output_index": index, "content_index": 0, "text": part.text}));
        out.push(
            json!({"type": "response.content_part.done", "item_id": id, "output_index": index,
                        "content_index": 0, "part": part}),
        );
        out.push(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
    }
}

impl Items {
    /// The answer as the assistant message a later response continues from (function calls
    /// under the flat names they were offered by).
    pub fn assistant_message(&self) -> crate::chat::ChatMessage {
        use crate::chat::{ChatMessage, FunctionCall, MessageContent, ToolCall};
        let mut m = ChatMessage {
            role: "assistant".into(),
            ..Default::default()
        };
        for item in &self.items {
            match item {
                OutputItem::Reasoning { content, .. } => m
                    .reasoning
                    .get_or_insert_default()
                    .push_str(&content[0].text),
                OutputItem::Message { content, .. } => {
                    let text = content[0].text.clone();
                    m.content = Some(MessageContent::Text(match m.content.take() {
                        Some(MessageContent::Text(before)) => before + &text,
                        _ => text,
                    }));
                }
                OutputItem::FunctionCall {
                    call_id,
                    name,
                    namespace,
                    arguments,
                    ..
                } => m.tool_calls.push(ToolCall {
                    id: Some(call_id.clone()),
                    r#type: Some("function".into()),
                    function: FunctionCall {
                        name: namespace
                            .as_ref()
                            .map_or_else(|| name.clone(), |ns| format!("{ns}__{name}")),
                        arguments: arguments.clone(),
                    },
                }),
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str) -> ChatDelta {
        ChatDelta::ToolCall {
            index: 0,
            name: name.into(),
            arguments: r#"{"a": 1}"#.into(),
        }
    }

    /// The events follow OpenAI's grammar (each item added, its part added, deltas, done in
    /// that order, output indexes in sequence) and the items they leave are the whole output.
    #[test]
    fn deltas_become_items_with_their_events() {
        let names = vec![("ns__t".to_owned(), Some("ns".to_owned()), "t".to_owned())];
        let mut items = Items::new(names, false);
        let mut ev = Vec::new();
        for d in [
            ChatDelta::Reasoning("Think".into()),
            ChatDelta::Reasoning("ing.".into()),
            ChatDelta::Content("Hi".into()),
            ChatDelta::Content(String::new()),
            ChatDelta::Content(" there.".into()),
            call("ns__t"),
            call("other"),
        ] {
            items.push(d, &mut ev);
        }
        items.close("completed", &mut ev);
        let kinds: Vec<String> = ev
            .iter()
            .map(|e| format!("{}@{}", e["type"].as_str().unwrap(), e["output_index"]))
            .collect();
        let want = [
            "response.output_item.added@0",
            "response.content_part.added@0",
            "response.reasoning_text.delta@0",
            "response.reasoning_text.delta@0",
            "response.reasoning_text.done@0",
            "response.content_part.done@0",
            "response.output_item.done@0",
            "response.output_item.added@1",
            "response.content_part.added@1",
            "response.output_text.delta@1",
            "response.output_text.delta@1",
            "response.output_text.done@1",
            "response.content_part.done@1",
            "response.output_item.done@1",
            "response.output_item.added@2",
            "response.function_call_arguments.delta@2",
            "response.function_call_arguments.done@2",
            "response.output_item.done@2",
            "response.output_item.added@3",
            "response.function_call_arguments.delta@3",
            "response.function_call_arguments.done@3",
            "response.output_item.done@3",
        ];
        assert_eq!(kinds, want);
        let out = serde_json::to_value(&items.items).unwrap();
        assert_eq!(
            out[0]["content"][0],
            json!({"type": "reasoning_text", "text": "Thinking."})
        );
        assert_eq!(out[1]["content"][0]["text"], "Hi there.");
        assert_eq!(out[1]["status"], "completed");
        assert_eq!(
            (out[2]["name"].as_str(), out[2]["namespace"].as_str()),
            (Some("t"), Some("ns"))
        );
        assert_eq!(out[3]["name"], "other");
        assert!(out[3].get("namespace").is_none());
        // Each done event carries the item as the output holds it.
        assert_eq!(ev[13]["item"], out[1]);
        assert_eq!(ev[17]["item"], out[2]);
        // The turn as a later response continues it.
        let m = items.assistant_message();
        assert_eq!(m.reasoning.as_deref(), Some("Thinking."));
        assert_eq!(m.tool_calls[0].function.name, "ns__t");
        assert_eq!(m.tool_calls.len(), 2);
    }

    #[test]
    fn a_budget_cut_marks_the_open_item_incomplete_and_parallel_calls_can_be_one() {
        let mut items = Items::new(Vec::new(), true);
        let mut ev = Vec::new();
        for d in [call("a"), call("b"), ChatDelta::Content("x".into())] {
            items.push(d, &mut ev);
        }
        items.close("incomplete", &mut ev);
        assert_eq!(items.items.len(), 2);
        let out = serde_json::to_value(&items.items).unwrap();
        assert_eq!(out[0]["name"], "a");
        assert_eq!(out[1]["status"], "incomplete");
    }
}
