//! Output parsing: round trips through the renderer, streaming at every split, malformed output.

use super::render::Request;
use deepinfer_server::chat::{
    collect_deltas, parse_chat_output, ChatDelta, ChatFormat, ParsedOutput,
};

const D: &str = "｜DSML｜";

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// Feeds `pieces` to a fresh V4 parser and folds the deltas; also checks tool-call indices.
fn stream(pieces: &[&str], thinking: bool, tools: bool) -> ParsedOutput {
    stream_in(ChatFormat::V4, pieces, thinking, tools)
}

fn stream_in(format: ChatFormat, pieces: &[&str], thinking: bool, tools: bool) -> ParsedOutput {
    let mut p = format.parser(thinking, tools);
    let mut deltas = Vec::new();
    for piece in pieces {
        deltas.extend(p.push(piece));
    }
    deltas.extend(p.finish());
    let indices: Vec<usize> = deltas
        .iter()
        .filter_map(|d| match d {
            ChatDelta::ToolCall { index, .. } => Some(*index),
            _ => None,
        })
        .collect();
    assert_eq!(indices, (0..indices.len()).collect::<Vec<_>>());
    assert!(!deltas
        .iter()
        .any(|d| matches!(d, ChatDelta::Content(s) | ChatDelta::Reasoning(s) if s.is_empty())));
    collect_deltas(deltas)
}

/// The whole-text parse equals every 2-piece split and the one-char-at-a-time feed (V4).
fn assert_stream_invariant(text: &str, thinking: bool, tools: bool) -> ParsedOutput {
    assert_stream_invariant_in(ChatFormat::V4, text, thinking, tools)
}

fn assert_stream_invariant_in(
    format: ChatFormat,
    text: &str,
    thinking: bool,
    tools: bool,
) -> ParsedOutput {
    let whole = parse_chat_output(format.markup(), text, thinking, tools);
    for (i, _) in text.char_indices().skip(1) {
        let split = stream_in(format, &[&text[..i], &text[i..]], thinking, tools);
        assert_eq!(split, whole, "split at byte {i} of {text:?}");
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(
        stream_in(format, &refs, thinking, tools),
        whole,
        "char by char: {text:?}"
    );
    whole
}

fn call(name: &str, params: &[(&str, bool, &str)]) -> String {
    let mut s = format!("<{D}invoke name=\"{name}\">\n");
    for (k, is_str, v) in params {
        s += &format!("<{D}parameter name=\"{k}\" string=\"{is_str}\">{v}</{D}parameter>\n");
    }
    s + &format!("</{D}invoke>")
}

fn block(calls: &[String]) -> String {
    format!("<{D}tool_calls>\n{}\n</{D}tool_calls>", calls.join("\n"))
}

/// Each family's rendered assistant turn parses back to the message it came from.
#[test]
fn round_trip_through_the_renderer() {
    for format in [ChatFormat::V4, ChatFormat::V41] {
        round_trip_in(format);
    }
}

fn round_trip_in(format: ChatFormat) {
    let request: Request = serde_json::from_str(
        r#"{
  "messages": [
    {"role": "user", "content": "Plan my trip."},
    {"role": "assistant",
     "reasoning": "Need weather and flights.\nCheck both.",
     "content": "I'll look this up — 稍等 🙂",
     "tool_calls": [
       {"id": "a", "type": "function", "function": {"name": "get_weather",
        "arguments": "{\"city\": \"Zürich\", \"days\": 3, \"units\": null, \"detail\": {\"hourly\": true, \"fields\": [\"temp\", 1.5, -2]}}"}},
       {"id": "b", "type": "function", "function": {"name": "search_flights",
        "arguments": "{\"from\": \"ZRH\", \"to\": \"<NRT>\", \"note\": \"line1\\nline2 \\\"q\\\"\", \"max_price\": 1e3}"}},
       {"id": "c", "type": "function", "function": {"name": "no_args", "arguments": ""}}
     ]},
    {"role": "tool", "tool_call_id": "a", "content": "sunny"}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather"}}]
}"#,
    )
    .unwrap();
    let prompt = format
        .render(&request.messages, &request.tools, &request.options())
        .unwrap();
    let open = "<｜Assistant｜><think>";
    let start = prompt.find(open).unwrap() + open.len();
    let end = prompt.find("<｜end▁of▁sentence｜>").unwrap();
    let generated = &prompt[start..end];

    let out = assert_stream_invariant_in(format, generated, true, true);
    let assistant = &request.messages[1];
    assert_eq!(out.reasoning.as_deref(), assistant.reasoning.as_deref());
    let want_content = match &assistant.content {
        Some(deepinfer_server::chat::MessageContent::Text(t)) => t.clone(),
        _ => unreachable!(),
    };
    assert_eq!(out.content, want_content);
    assert_eq!(out.tool_calls.len(), assistant.tool_calls.len());
    for (got, want) in out.tool_calls.iter().zip(&assistant.tool_calls) {
        assert_eq!(got.name, want.function.name);
        // V4 reads "" as no arguments; V4.1's encoder writes it as {"arguments": ""}.
        let want_args = if want.function.arguments.is_empty() && format == ChatFormat::V4 {
            json("{}")
        } else if want.function.arguments.is_empty() {
            json(r#"{"arguments": ""}"#)
        } else {
            json(&want.function.arguments)
        };
        assert_eq!(json(&got.arguments), want_args, "{}", got.name);
    }
    // Parameter order survives.
    assert!(out.tool_calls[0]
        .arguments
        .starts_with(r#"{"city": "Zürich", "days": 3,"#));

    // Chat mode: the generation starts after `</think>`, content and calls only.
    let mut opts = request.options();
    opts.thinking = false;
    let prompt = format
        .render(&request.messages, &request.tools, &opts)
        .unwrap();
    let open = "<｜Assistant｜></think>";
    let start = prompt.find(open).unwrap() + open.len();
    let end = prompt.find("<｜end▁of▁sentence｜>").unwrap();
    let out = assert_stream_invariant_in(format, &prompt[start..end], false, true);
    assert_eq!(out.reasoning, None);
    assert_eq!(out.content, want_content);
    assert_eq!(out.tool_calls.len(), 3);
}

#[test]
fn reasoning_then_content() {
    let out = assert_stream_invariant("Step 1.\nStep 2.\n</think>The answer is 4.", true, true);
    assert_eq!(out.reasoning.as_deref(), Some("Step 1.\nStep 2."));
    assert_eq!(out.content, "The answer is 4.");
    assert!(out.tool_calls.is_empty());
}

#[test]
fn thinking_never_closed_is_all_reasoning() {
    let text = format!("Hmm, what about <b>tags</b> and </thin and <{D}tool_c");
    let out = assert_stream_invariant(&text, true, true);
    assert_eq!(out.reasoning.as_deref(), Some(text.as_str()));
    assert_eq!(out.content, "");
    let out = assert_stream_invariant("still thinking <think> more\n\n", true, true);
    assert_eq!(out.reasoning.as_deref(), Some("still thinking  more"));
}

#[test]
fn content_only_and_stray_markers() {
    let text = "Hello <b>world</b>, a < b and x<y. 你好 👋\n\nBye <｜not a marker｜>";
    let out = assert_stream_invariant(text, false, true);
    assert_eq!(out.reasoning, None);
    assert_eq!(out.content, text);
    // A stray </think> in chat mode is swallowed (vLLM does the same).
    let out = assert_stream_invariant("</think>Hi there", false, true);
    assert_eq!((out.reasoning, out.content.as_str()), (None, "Hi there"));
    // `<think>` in content opens reasoning again.
    let out = assert_stream_invariant("A<think>B</think>C", false, false);
    assert_eq!(
        (out.reasoning.as_deref(), out.content.as_str()),
        (Some("B"), "AC")
    );
    // Empty thinking.
    let out = assert_stream_invariant("</think>Direct.", true, true);
    assert_eq!((out.reasoning, out.content.as_str()), (None, "Direct."));
}

#[test]
fn tool_calls_after_reasoning_and_content() {
    let calls = [
        call(
            "get_weather",
            &[("location", true, "杭州"), ("days", false, "2")],
        ),
        call(
            "search",
            &[
                ("q", true, "a \"quoted\" <b>"),
                ("filters", false, "{\"z\": [1, 2.50], \"a\": null}"),
            ],
        ),
    ];
    let text = format!("Think.</think>Let me check.\n\n{}", block(&calls));
    let out = assert_stream_invariant(&text, true, true);
    assert_eq!(out.reasoning.as_deref(), Some("Think."));
    assert_eq!(out.content, "Let me check.");
    assert_eq!(out.tool_calls.len(), 2);
    assert_eq!(out.tool_calls[0].name, "get_weather");
    assert_eq!(
        out.tool_calls[0].arguments,
        r#"{"location": "杭州", "days": 2}"#
    );
    assert_eq!(
        out.tool_calls[1].arguments,
        r#"{"q": "a \"quoted\" <b>", "filters": {"z": [1, 2.5], "a": null}}"#
    );

    // With tool parsing off the block is plain content.
    let out = assert_stream_invariant(&text, true, false);
    assert!(out.tool_calls.is_empty());
    assert!(out
        .content
        .starts_with("Let me check.\n\n<｜DSML｜tool_calls>"));

    // A block opened inside the reasoning ends it; text after a block is dropped; a second
    // block still counts.
    let text = format!(
        "Reasoning {}trailing text {}",
        block(&calls[..1]),
        block(&calls[1..])
    );
    let out = assert_stream_invariant(&text, true, true);
    assert_eq!(out.reasoning.as_deref(), Some("Reasoning"));
    assert_eq!(out.content, "");
    assert_eq!(out.tool_calls.len(), 2);
}

#[test]
fn tolerated_misspellings() {
    let inv = call("f", &[("a", false, "1")]);
    let variants = [
        format!("<{D}toolcalls>\n{inv}\n</{D}tool_calls>"),
        format!("<{D}tool_call>\n{inv}\n</{D}tool_call>"),
        format!("<{D}tool>\n{inv}\n</{D}tool>"),
        format!("<{D}function_calls>\n{inv}\n</{D}function_calls>"),
        format!("<|DSML|tool_calls>\n{}\n</|DSML|tool_calls>", inv.replace(D, "|DSML|")),
        format!("<｜DSML|tool_calls>\n{inv}\n</{D}tool_calls>"),
        // Missing </invoke>: the block end closes it.
        format!("<{D}tool_calls>\n<{D}invoke name=\"f\">\n<{D}parameter name=\"a\" string=\"false\">1</{D}parameter>\n</{D}tool_calls>"),
        // Missing </parameter> and string attribute.
        format!("<{D}tool_calls>\n<{D}invoke name=\"f\">\n<{D}parameter name=\"a\">1\n</{D}invoke>\n</{D}tool_calls>"),
        // Block never closed.
        format!("<{D}tool_calls>\n{inv}\n"),
        // Invoke never closed (output cut at the end of a parameter).
        format!("<{D}tool_calls>\n<{D}invoke name=\"f\">\n<{D}parameter name=\"a\" string=\"false\">1</{D}parameter>\n"),
        // No wrapper at all.
        format!("{inv}\n</{D}tool_calls>"),
        // Attribute spacing and quotes.
        format!("<{D}tool_calls><{D}invoke  name='f' ><{D}parameter name = \"a\"  string='false'>1</{D}parameter></{D}invoke></{D}tool_calls>"),
    ];
    for v in &variants {
        let text = format!("Sure.\n\n{v}");
        let out = assert_stream_invariant(&text, false, true);
        assert_eq!(out.content, "Sure.", "{v}");
        assert_eq!(out.tool_calls.len(), 1, "{v}");
        assert_eq!(out.tool_calls[0].name, "f", "{v}");
        assert_eq!(out.tool_calls[0].arguments, r#"{"a": 1}"#, "{v}");
    }
}

#[test]
fn truncated_and_unrecognised_blocks() {
    // Output cut inside a non-string value: that parameter is left out.
    let text = format!("<{D}tool_calls>\n<{D}invoke name=\"f\">\n<{D}parameter name=\"s\" string=\"true\">ok</{D}parameter>\n<{D}parameter name=\"n\" string=\"false\">[1, 2");
    let out = assert_stream_invariant(&text, false, true);
    assert_eq!(out.tool_calls[0].arguments, r#"{"s": "ok"}"#);
    // Cut inside a string value: the value so far is kept.
    let out = assert_stream_invariant(&format!("<{D}tool_calls><{D}invoke name=\"f\"><{D}parameter name=\"s\" string=\"true\">partial te"), false, true);
    assert_eq!(out.tool_calls[0].arguments, r#"{"s": "partial te"}"#);
    // Cut inside the invoke tag or right after the wrapper: no call, nothing leaks as content.
    for cut in [
        format!("Hi <{D}tool_calls>\n<{D}invoke na"),
        format!("Hi <{D}tool_calls>"),
    ] {
        let out = assert_stream_invariant(&cut, false, true);
        assert_eq!(
            (out.content.as_str(), out.tool_calls.len()),
            ("Hi", 0),
            "{cut}"
        );
    }
    // An unwrapped invoke that never closes is given back as content.
    let text =
        format!("Example: <{D}invoke name=\"f\">\n<{D}parameter name=\"a\" string=\"true\">x");
    let out = assert_stream_invariant(&text, false, true);
    assert_eq!(
        (out.content.as_str(), out.tool_calls.len()),
        (text.as_str(), 0)
    );
    // An invoke marker without a name is content.
    let text = format!("See <{D}invoke> here");
    let out = assert_stream_invariant(&text, false, true);
    assert_eq!(out.content, text);
}

#[test]
fn unwrapped_invokes_respect_declared_tool_names() {
    let text = format!("A {}", call("delete_all", &[("p", true, "/")]));
    let mut strict = ChatFormat::V4
        .parser(false, true)
        .with_tool_names(["get_weather"]);
    let mut deltas = strict.push(&text);
    deltas.extend(strict.finish());
    let out = collect_deltas(deltas);
    assert_eq!(
        (out.content.as_str(), out.tool_calls.len()),
        (text.as_str(), 0)
    );

    let mut lax = ChatFormat::V4
        .parser(false, true)
        .with_tool_names(["delete_all"]);
    let mut deltas = lax.push(&text);
    deltas.extend(lax.finish());
    let out = collect_deltas(deltas);
    assert_eq!((out.content.as_str(), out.tool_calls.len()), ("A", 1));
}

/// Streamed deltas come as soon as they are safe: a call right when its invoke closes,
/// content before a held partial marker.
#[test]
fn deltas_are_timely() {
    let mut p = ChatFormat::V4.parser(true, true);
    assert_eq!(
        p.push("abc </thi"),
        vec![ChatDelta::Reasoning("abc".into())]
    );
    assert_eq!(p.push("nk>x <｜DS"), vec![ChatDelta::Content("x".into())]);
    assert_eq!(p.push("ML｜tool_calls>\n"), vec![]);
    let got = p.push(&format!("{}\n", call("f", &[("a", true, "1")])));
    assert_eq!(
        got,
        vec![ChatDelta::ToolCall {
            index: 0,
            name: "f".into(),
            arguments: r#"{"a": "1"}"#.into()
        }]
    );
    assert_eq!(p.push(&format!("</{D}tool_calls>")), vec![]);
    assert_eq!(p.finish(), vec![]);
}

/// Arbitrary text built from marker fragments: no panic, and streaming agrees with the whole.
#[test]
fn marker_soup_never_panics() {
    let frags = [
        "<",
        ">",
        "</",
        "think",
        "<think>",
        "</think>",
        "｜",
        "|",
        "DSML",
        D,
        "tool_calls",
        "invoke",
        " name=\"f\"",
        "parameter",
        " string=\"true\"",
        " string=\"false\"",
        "1",
        "x",
        " ",
        "\n",
        "é",
        "😀",
        "\"",
        "{",
        "}",
        "[",
        "]",
        "'",
    ];
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as usize
    };
    for _ in 0..300 {
        let n = next() % 40;
        let text: String = (0..n).map(|_| frags[next() % frags.len()]).collect();
        for (thinking, tools) in [(true, true), (false, true), (false, false)] {
            let whole = parse_chat_output(ChatFormat::V4.markup(), &text, thinking, tools);
            let cut = text
                .char_indices()
                .map(|(i, _)| i)
                .nth(next() % (text.chars().count() + 1))
                .unwrap_or(text.len());
            assert_eq!(
                stream(&[&text[..cut], &text[cut..]], thinking, tools),
                whole,
                "{text:?}"
            );
            for c in &whole.tool_calls {
                json(&c.arguments);
            }
        }
    }
}
