//! Tool-call markup never leaks into streamed text: a DSML tool call written one byte per
//! token (the byte tokens a model can pick, which split `｜` into three) through the
//! incremental detokenizer and the streaming parser, as the server streams it; no content
//! delta holds any part of the markup, and the call comes out whole.

use deepinfer_server::chat::{ChatDelta, ChatFormat};
use deepinfer_server::tokenizer::{IncrementalDetokenizer, Tokenizer};
use std::collections::HashMap;

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../assets/tokenizer"
    ))
    .unwrap()
}

/// The id of each single-byte token.
fn byte_tokens(tok: &Tokenizer) -> HashMap<u8, u32> {
    let mut map = HashMap::new();
    for id in 0..tok.vocab_size() as u32 {
        if let [b] = tok.token_bytes(id)[..] {
            map.entry(b).or_insert(id);
        }
    }
    map
}

/// Both families' markup (V4.1's spaced tags included).
#[test]
fn dsml_split_at_every_byte_never_shows_in_content() {
    for format in [ChatFormat::V4, ChatFormat::V41] {
        split_at_every_byte(format);
    }
}

fn split_at_every_byte(format: ChatFormat) {
    let tok = tokenizer();
    let bytes = byte_tokens(&tok);
    let d = "｜DSML｜";
    let m = format.markup();
    let (block, invoke, param) = (m.block, m.invoke, m.parameter);
    let text = format!(
        "Checking.\n\n<{d}{block}>\n<{d}{invoke} name=\"get_weather\">\n\
         <{d}{param} name=\"city\" string=\"true\">Paris</{d}{param}>\n</{d}{invoke}>\n</{d}{block}>"
    );
    let ids: Vec<u32> = text.bytes().map(|b| bytes[&b]).collect();
    let mut detok = IncrementalDetokenizer::with_prompt(tok.clone(), &[], true);
    let mut parser = format.parser(false, true).with_tool_names(["get_weather"]);
    let mut deltas = Vec::new();
    for &id in &ids {
        deltas.extend(parser.push(&detok.push(id)));
    }
    deltas.extend(parser.push(&detok.flush()));
    deltas.extend(parser.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for delta in deltas {
        match delta {
            ChatDelta::Content(t) => {
                for piece in ["<", "｜", "DSML", "\u{FFFD}"] {
                    assert!(!t.contains(piece), "content delta {t:?} holds {piece:?}");
                }
                content.push_str(&t);
            }
            ChatDelta::ToolCall {
                name, arguments, ..
            } => calls.push((name, arguments)),
            ChatDelta::Reasoning(t) => panic!("reasoning {t:?} in chat mode"),
        }
    }
    assert_eq!(content, "Checking.");
    assert_eq!(
        calls,
        [("get_weather".to_owned(), r#"{"city": "Paris"}"#.to_owned())]
    );
}
