//! Rendered prompts through the real V4 tokenizer: every marker must be its single added token.

use super::render::Request;
use deepinfer_server::chat::{parse_chat_output, ChatFormat};
use deepinfer_server::tokenizer::Tokenizer;
use std::path::PathBuf;

fn tokenizer_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/tokenizer")
}

const MARKERS: [(&str, u32); 7] = [
    ("<｜begin▁of▁sentence｜>", 0),
    ("<｜end▁of▁sentence｜>", 1),
    ("<｜User｜>", 128803),
    ("<｜Assistant｜>", 128804),
    ("<think>", 128821),
    ("</think>", 128822),
    ("｜DSML｜", 128825),
];

const REQUEST: &str = r#"{
  "messages": [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in 杭州?"},
    {"role": "assistant", "content": "Let me check.", "reasoning": "Use the tool.",
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"杭州\", \"days\": 2}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "晴 25°C"}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
}"#;

/// Only BOS and EOS are flagged special; the chat markers are plain added tokens and survive
/// `skip_special_tokens` decoding, which is what the output parser relies on.
#[test]
fn marker_tokens_and_special_flags() {
    let path = tokenizer_dir().join("tokenizer.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let added = json["added_tokens"].as_array().unwrap();
    for (text, id) in MARKERS {
        let tok = added
            .iter()
            .find(|t| t["content"] == text)
            .unwrap_or_else(|| panic!("{text} is not an added token"));
        assert_eq!(tok["id"], id, "{text}");
        assert_eq!(tok["special"], id <= 1, "{text}: special flag");
    }
}

#[test]
fn rendered_prompts_tokenize_markers_as_single_ids() {
    let tok = Tokenizer::from_dir(tokenizer_dir()).unwrap();
    let request: Request = serde_json::from_str(REQUEST).unwrap();
    for thinking in [true, false] {
        let mut opts = request.options();
        opts.thinking = thinking;
        let prompt = ChatFormat::V4
            .render(&request.messages, &request.tools, &opts)
            .unwrap();
        let ids = tok.encode(&prompt, false).unwrap();
        assert_eq!(ids[0], 0, "BOS first");
        assert_eq!(ids.iter().filter(|&&i| i == 0).count(), 1);
        let last = if thinking { 128821 } else { 128822 };
        assert_eq!(
            &ids[ids.len() - 2..],
            &[128804, last],
            "ends with the generation prompt"
        );
        for (text, id) in MARKERS {
            let in_text = prompt.matches(text).count();
            let in_ids = ids.iter().filter(|&&i| i == id).count();
            assert_eq!(in_ids, in_text, "{text} ({id}), thinking={thinking}");
        }
        // Decoding without specials drops only BOS/EOS.
        let decoded = tok.decode(&ids, true);
        let want = prompt
            .replace("<｜begin▁of▁sentence｜>", "")
            .replace("<｜end▁of▁sentence｜>", "");
        assert_eq!(decoded, want);
    }
}

/// A generated assistant turn, tokenized and decoded the way the server will
/// (`skip_special_tokens`, EOS dropped), parses back to what was rendered.
#[test]
fn decoded_generation_parses() {
    let tok = Tokenizer::from_dir(tokenizer_dir()).unwrap();
    let request: Request = serde_json::from_str(REQUEST).unwrap();
    let prompt = ChatFormat::V4
        .render(&request.messages, &request.tools, &request.options())
        .unwrap();
    let start = prompt.find("<｜Assistant｜><think>").unwrap() + "<｜Assistant｜><think>".len();
    let turn = &prompt
        [start..prompt.find("<｜end▁of▁sentence｜>").unwrap() + "<｜end▁of▁sentence｜>".len()];
    let ids = tok.encode(turn, false).unwrap();
    assert_eq!(ids.last(), Some(&1));
    let text = tok.decode(&ids, true);
    let out = parse_chat_output(ChatFormat::V4.markup(), &text, true, true);
    assert_eq!(out.reasoning.as_deref(), Some("Use the tool."));
    assert_eq!(out.content, "Let me check.");
    assert_eq!(out.tool_calls.len(), 1);
    assert_eq!(out.tool_calls[0].name, "get_weather");
    assert_eq!(
        out.tool_calls[0].arguments,
        r#"{"city": "杭州", "days": 2}"#
    );
}
