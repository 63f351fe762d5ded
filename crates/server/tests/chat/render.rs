//! Both chat formats against the reference encoders' output for the same OpenAI requests.

use deepinfer_server::chat::{
    ChatError, ChatFormat, ChatMessage, ReasoningEffort, RenderOptions, ToolDef,
};
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Deserialize)]
struct Fixtures {
    reference: Reference,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Reference {
    version: String,
    sha256: String,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    request: Request,
    encoder_args: EncoderArgs,
    prompt: Option<String>,
    error: Option<String>,
}

/// The part of an OpenAI chat request the renderer reads.
#[derive(Deserialize)]
pub struct Request {
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub tools: Vec<ToolDef>,
    #[serde(default)]
    pub reasoning_effort: Option<ReasoningEffort>,
    #[serde(default)]
    pub chat_template_kwargs: Option<serde_json::Value>,
}

impl Request {
    pub fn options(&self) -> RenderOptions {
        RenderOptions::from_openai(
            self.reasoning_effort.map(|e| (e, "reasoning_effort")),
            self.chat_template_kwargs.as_ref(),
        )
    }
}

/// What vLLM passed to `encode_messages`.
#[derive(Deserialize)]
struct EncoderArgs {
    thinking_mode: String,
    drop_thinking: bool,
    reasoning_effort: Option<String>,
}

fn fixtures() -> Fixtures {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_cases.json");
    let text = std::fs::read_to_string(&path).expect("read fixtures");
    // Straight from the text: a detour through serde_json::Value would sort schema keys.
    serde_json::from_str(&text).expect("parse fixtures")
}

#[test]
fn renders_like_the_reference_encoder() {
    let fx = fixtures();
    assert!(!fx.reference.version.is_empty() && fx.reference.sha256.len() == 64);
    assert!(fx.cases.len() >= 30);
    let mut failures = Vec::new();
    for case in &fx.cases {
        let opts = case.request.options();
        // The options resolve to the encoder arguments vLLM used.
        let want_mode = if opts.thinking_mode() {
            "thinking"
        } else {
            "chat"
        };
        assert_eq!(
            case.encoder_args.thinking_mode, want_mode,
            "{}: mode",
            case.name
        );
        assert_eq!(
            case.encoder_args.drop_thinking, opts.drop_thinking,
            "{}",
            case.name
        );
        if opts.thinking_mode() {
            let effort = case
                .encoder_args
                .reasoning_effort
                .as_deref()
                .unwrap_or("low");
            assert_eq!(
                effort,
                opts.encoder_effort().as_str(),
                "{}: effort",
                case.name
            );
        }
        let got = ChatFormat::V4.render(&case.request.messages, &case.request.tools, &opts);
        match (&case.prompt, &case.error, got) {
            (Some(want), None, Ok(got)) if *want == got => {}
            (None, Some(_), Err(_)) => {}
            (want, err, got) => failures.push(format!(
                "--- {}\nwant: {:?}\nerr:  {:?}\ngot:  {:?}",
                case.name, want, err, got
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn msgs(json: &str) -> Vec<ChatMessage> {
    serde_json::from_str(json).expect("messages")
}

#[test]
fn rejections_name_the_offending_field() {
    let opts = RenderOptions::default();
    let cases: Vec<(&str, ChatError)> = vec![
        ("[]", ChatError::NoMessages),
        (
            r#"[{"role":"user","content":"a"},{"role":"robot","content":"b"}]"#,
            ChatError::UnknownRole {
                index: 1,
                role: "robot".into(),
            },
        ),
        (
            r#"[{"role":"system","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]"#,
            ChatError::UnsupportedContentPart {
                index: 0,
                part: 1,
                kind: "image_url".into(),
            },
        ),
        (
            r#"[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}},{"type":"input_audio"}]}]"#,
            ChatError::UnsupportedContentPart {
                index: 0,
                part: 1,
                kind: "input_audio".into(),
            },
        ),
        (
            r#"[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\": 1"}}]},{"role":"tool","content":"r"}]"#,
            ChatError::InvalidToolArguments {
                index: 1,
                call: 0,
                reason: "invalid JSON: expected ',' or '}' at offset 7".into(),
            },
        ),
        (
            r#"[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}},{"function":{"name":"g","arguments":"[1]"}}]},{"role":"tool","content":"r"}]"#,
            ChatError::InvalidToolArguments {
                index: 1,
                call: 1,
                reason: "must be a JSON object".into(),
            },
        ),
        (
            r#"[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"type":"custom","function":{"name":"f"}}]},{"role":"user","content":"b"}]"#,
            ChatError::UnsupportedToolCallType {
                index: 1,
                call: 0,
                kind: "custom".into(),
            },
        ),
        (
            r#"[{"role":"user","content":"a"},{"role":"assistant","content":"prefill"}]"#,
            ChatError::TrailingAssistant { index: 1 },
        ),
        (
            r#"[{"role":"developer","content":[]},{"role":"user","content":"a"}]"#,
            ChatError::EmptyDeveloperContent { index: 0 },
        ),
    ];
    for (json, want) in cases {
        assert_eq!(
            ChatFormat::V4.render(&msgs(json), &[], &opts),
            Err(want.clone()),
            "{json}"
        );
        assert!(want.to_string().starts_with("messages"), "{want}");
    }
    let tools: Vec<ToolDef> =
        serde_json::from_str(r#"[{"type":"function","function":{"name":"f"}},{"type":"web_search","function":{"name":"g"}}]"#)
            .unwrap();
    let err = ChatFormat::V4
        .render(&msgs(r#"[{"role":"user","content":"a"}]"#), &tools, &opts)
        .unwrap_err();
    assert_eq!(
        err,
        ChatError::UnsupportedToolType {
            index: 1,
            kind: "web_search".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "tools[1].type: \"web_search\" is not supported (only \"function\")"
    );
}

#[test]
fn lenient_message_shapes() {
    // null tool_calls, unknown fields, an explicit null reasoning, numbers in schemas.
    let m = msgs(
        r#"[{"role":"user","content":"q","extra":{"x":1}},
            {"role":"assistant","content":null,"tool_calls":null,"reasoning":null,"refusal":null},
            {"role":"user","content":"q2","name":"bob"}]"#,
    );
    let opts = RenderOptions {
        thinking: false,
        ..RenderOptions::default()
    };
    let p = ChatFormat::V4.render(&m, &[], &opts).unwrap();
    assert!(p.ends_with("<｜User｜>q2<｜Assistant｜></think>"), "{p}");
}

/// A user message's parts stay in order, images as placeholders joined like text (vLLM's
/// layout in both families; the fixtures' image cases pin it); the server cuts the prompt at
/// the placeholders, the i-th for the i-th image part.
#[test]
fn user_images_render_as_placeholders_where_they_stand() {
    let opts = RenderOptions::default();
    let json = r#"[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"},{"type":"image_url","image_url":"y"}]},{"role":"user","content":[{"type":"image_url","image_url":{"url":"z"}}]}]"#;
    let messages = msgs(json);
    let ph = "<｜deepseek_image｜>";
    for format in [ChatFormat::V4, ChatFormat::V41] {
        let text = format.render(&messages, &[], &opts).unwrap();
        assert!(
            text.contains(&format!(
                "<｜User｜>a\n\n{ph}\n\nb\n\n{ph}\n\n{ph}<｜Assistant｜>"
            )),
            "{text}"
        );
    }
    let urls = deepinfer_server::chat::image_urls(&messages);
    let urls: Vec<_> = urls.iter().map(|(f, u)| (f.as_str(), *u)).collect();
    assert_eq!(
        urls,
        [
            ("messages[0].content[1]", Some("x")),
            ("messages[0].content[3]", Some("y")),
            ("messages[1].content[0]", Some("z"))
        ]
    );
}

#[derive(Deserialize)]
struct V41Fixtures {
    reference: V41Reference,
    cases: Vec<V41Case>,
}

#[derive(Deserialize)]
struct V41Reference {
    wheel: String,
    files: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct V41Case {
    name: String,
    request: Request,
    prompt: Option<String>,
    error: Option<String>,
    /// The order vLLM feeds the request's images in (by their place among its image parts).
    image_order: Option<Vec<usize>>,
}

/// V4.1's format against prompts rendered by vLLM 0.33's own V4.1 wrapper and encoder
/// (tools/make_v41_chat_fixtures.py): every role, efforts as names and integers, tools, tool
/// round trips with results out of call order, mid-conversation system turns, thinking and
/// drop-thinking on and off, images; and the requests vLLM refuses, refused.
#[test]
fn v41_renders_like_vllms_v41_encoder() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_cases_v41.json");
    let fx: V41Fixtures =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("parse");
    assert!(fx.reference.wheel.starts_with("vllm-0.33.0-"));
    assert_eq!(fx.reference.files.len(), 2);
    assert!(fx.cases.iter().filter(|c| c.prompt.is_some()).count() >= 25);
    let mut failures = Vec::new();
    for case in &fx.cases {
        let got = ChatFormat::V41.render(
            &case.request.messages,
            &case.request.tools,
            &case.request.options(),
        );
        match (&case.prompt, &case.error, &got) {
            (Some(want), None, Ok(got)) if want == got => {}
            (None, Some(_), Err(_)) => {}
            (want, err, got) => failures.push(format!(
                "--- {}\nwant: {want:?}\nerr:  {err:?}\ngot:  {got:?}",
                case.name
            )),
        }
        // The engine puts the i-th image part's span at the i-th placeholder: vLLM's order.
        if let Some(order) = &case.image_order {
            let n = deepinfer_server::chat::image_urls(&case.request.messages).len();
            assert_eq!(*order, (0..n).collect::<Vec<_>>(), "{}", case.name);
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A V4.1 effort the family does not take is refused naming the field it came from.
#[test]
fn v41_effort_errors_name_their_field() {
    let m = msgs(r#"[{"role":"user","content":"x"}]"#);
    let named = RenderOptions::from_openai(
        Some((ReasoningEffort::Medium, "output_config.effort")),
        None,
    );
    let err = ChatFormat::V41.render(&m, &[], &named).unwrap_err();
    assert_eq!(err.param(), "output_config.effort");
    assert!(err.to_string().contains("\"medium\""), "{err}");
    // V4 maps the same name to its low tier.
    assert!(ChatFormat::V4.render(&m, &[], &named).is_ok());
    for bad in ["0", "101", "50.0", "true", "\"extreme\""] {
        let kwargs: serde_json::Value =
            serde_json::from_str(&format!(r#"{{"reasoning_effort": {bad}}}"#)).unwrap();
        let opts = RenderOptions::from_openai(None, Some(&kwargs));
        let err = ChatFormat::V41.render(&m, &[], &opts).unwrap_err();
        assert_eq!(
            err.param(),
            "chat_template_kwargs.reasoning_effort",
            "{bad}"
        );
        assert!(err.to_string().contains(bad), "{err}");
    }
}
