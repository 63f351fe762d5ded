//! Stored responses (`store: true`, OpenAI's default): what `GET /v1/responses/{id}` returns
//! and what `previous_response_id` continues from. Held in memory within a byte bound; the
//! oldest are dropped first. A continued conversation is rendered again from its messages,
//! and the prefix cache serves the part the earlier turn already computed.

use crate::chat::{ChatMessage, MessageContent};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// A stored response: its object and the conversation a continuation renders (without the
/// system message: `instructions` are not carried over).
#[derive(Clone, Debug)]
pub struct Stored {
    pub response: Value,
    pub history: Vec<ChatMessage>,
}

pub struct ResponseStore {
    max_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, (Stored, usize)>,
    /// Ids, oldest first (an id deleted from `entries` may linger here until reached).
    order: VecDeque<String>,
    bytes: usize,
}

/// About what an entry holds in memory: its text, and a little per message.
fn size_of(s: &Stored) -> usize {
    let text = |c: &Option<MessageContent>| match c {
        Some(MessageContent::Text(t)) => t.len(),
        Some(MessageContent::Parts(p)) => p.len() * 64,
        None => 0,
    };
    let history: usize = s
        .history
        .iter()
        .map(|m| {
            128 + text(&m.content)
                + m.reasoning.as_ref().map_or(0, String::len)
                + m.tool_calls
                    .iter()
                    .map(|c| 64 + c.function.arguments.len())
                    .sum::<usize>()
        })
        .sum();
    history + s.response.to_string().len()
}

impl ResponseStore {
    /// A store of at most `max_bytes` (0 stores nothing).
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Keeps `stored` under `id`, dropping the oldest entries to stay within the bound.
    /// Returns false when the entry alone is larger than the bound (it is not kept).
    pub fn put(&self, id: String, stored: Stored) -> bool {
        let size = size_of(&stored);
        if size > self.max_bytes {
            return false;
        }
        let mut inner = self.inner.lock().expect("store lock");
        while inner.bytes + size > self.max_bytes {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            if let Some((_, n)) = inner.entries.remove(&old) {
                inner.bytes -= n;
            }
        }
        inner.bytes += size;
        inner.order.push_back(id.clone());
        if let Some((_, n)) = inner.entries.insert(id, (stored, size)) {
            inner.bytes -= n;
        }
        true
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        let inner = self.inner.lock().expect("store lock");
        inner.entries.get(id).map(|(s, _)| s.clone())
    }

    pub fn delete(&self, id: &str) -> bool {
        let mut inner = self.inner.lock().expect("store lock");
        match inner.entries.remove(id) {
            Some((_, n)) => {
                inner.bytes -= n;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(text: &str) -> Stored {
        Stored {
            response: json!({"id": text}),
            history: vec![ChatMessage {
                role: "user".into(),
                content: Some(MessageContent::Text(text.into())),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn the_oldest_go_first_and_nothing_passes_the_bound() {
        let one = size_of(&entry(&"a".repeat(1000)));
        let store = ResponseStore::new(one * 3);
        for i in 0..5 {
            assert!(store.put(format!("r{i}"), entry(&"a".repeat(1000))));
            assert!(store.inner.lock().unwrap().bytes <= one * 3);
        }
        assert!(store.get("r0").is_none() && store.get("r1").is_none());
        assert_eq!(
            store.get("r4").unwrap().response,
            json!({"id": "a".repeat(1000)})
        );
        assert!(store.delete("r3") && !store.delete("r3"));
        assert!(store.get("r3").is_none());
        // Larger than the whole bound: refused, the rest kept.
        assert!(!store.put("big".into(), entry(&"b".repeat(one * 4))));
        assert!(store.get("r4").is_some());
        assert!(!ResponseStore::new(0).put("x".into(), entry("x")));
    }
}
