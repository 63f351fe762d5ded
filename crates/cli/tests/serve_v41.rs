//! A DeepSeek-V4.1 checkpoint (`synth --preset tiny-v41`, which ships V4.1's tokenizer) served
//! in V4.1's own chat format: `/tokenize` renders what vLLM 0.33's V4.1 encoder renders
//! (tests/fixtures/chat_cases_v41.json) with `<｜System｜>` as its one token; efforts as V4.1
//! takes them; a scripted V4.1 answer with spaced-DSML calls (several, string and JSON
//! parameters) comes back as calls through Chat Completions, Messages and Responses, whole and
//! streamed, with no markup in any text; and a second turn hits the prefix cache.

mod support;

use deepinfer_server::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use support::{binary, post_json as post, read_sse, sse_chunks, Server};

const D: &str = "｜DSML｜";

/// The tiny V4.1 checkpoint, written once per test binary.
fn v41_model() -> &'static str {
    static DIR: OnceLock<String> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve-v41-tiny");
        if !dir.join("config.json").is_file() {
            support::synth("tiny-v41", &dir);
        }
        dir.to_str().unwrap().to_owned()
    })
}

async fn post_stream(server: &Server, path: &str, body: &Value) -> String {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = reqwest::Client::new()
        .post(server.url(path))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    assert_eq!(r.status().as_u16(), 200);
    read_sse(r).await
}

/// What the model is made to write: reasoning, a sentence, and two V4.1 calls (a string and
/// an integer parameter; a JSON array parameter).
fn script() -> String {
    format!(
        "I need the weather and the time.</think>Checking both.\n\n<{D} calls>\n\
         <{D} invoke name=\"get_weather\">\n\
         <{D} parameter name=\"city\" string=\"true\">Paris</{D} parameter>\n\
         <{D} parameter name=\"days\" string=\"false\">3</{D} parameter>\n\
         </{D} invoke>\n\
         <{D} invoke name=\"get_time\">\n\
         <{D} parameter name=\"zones\" string=\"false\">[\"CET\", \"JST\"]</{D} parameter>\n\
         </{D} invoke>\n</{D} calls>"
    )
}

const REASONING: &str = "I need the weather and the time.";
const CONTENT: &str = "Checking both.";
const WEATHER_ARGS: &str = r#"{"city": "Paris", "days": 3}"#;
const TIME_ARGS: &str = r#"{"zones": ["CET", "JST"]}"#;

fn openai_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
            "properties": {"zones": {"type": "array", "items": {"type": "string"}}}}}}
    ])
}

/// No text of any API may hold a piece of the markup.
fn assert_no_markup(text: &str) {
    for piece in ["DSML", "<｜", "calls>", "invoke", "</think>"] {
        assert!(!text.contains(piece), "{piece:?} leaked into {text:?}");
    }
}

/// `/tokenize` renders V4.1's format, byte for byte what vLLM's V4.1 encoder renders, and its
/// markers are single tokens of the checkpoint's tokenizer; efforts as V4.1 takes them.
#[tokio::test]
async fn v41_prompts_are_v41s_format() {
    let server = Server::start(&["--model", v41_model()]);
    let tok = Tokenizer::from_dir(v41_model()).unwrap();
    assert_eq!(tok.token_to_id("<｜System｜>"), Some(128799));
    let fixtures: Value = serde_json::from_str(include_str!(
        "../../server/tests/fixtures/chat_cases_v41.json"
    ))
    .unwrap();
    let mut checked = 0;
    for case in fixtures["cases"].as_array().unwrap() {
        let (Some(want), Some(order)) = (case["prompt"].as_str(), case["image_order"].as_array())
        else {
            continue;
        };
        if !order.is_empty() {
            continue; // this model has no vision tower
        }
        let (status, t) = post(&server, "/tokenize", &case["request"]).await;
        assert_eq!(status, 200, "{}: {t}", case["name"]);
        let ids: Vec<u32> = serde_json::from_value(t["tokens"].clone()).unwrap();
        assert_eq!(ids, tok.encode(want, false).unwrap(), "{}", case["name"]);
        assert_eq!(tok.decode(&ids, false), want, "{}", case["name"]);
        let systems = want.matches("<｜System｜>").count();
        assert_eq!(ids.iter().filter(|&&i| i == 128799).count(), systems);
        // What the engine prefills for the same request is that prompt.
        let mut chat = case["request"].clone();
        chat["max_tokens"] = json!(1);
        let (status, v) = post(&server, "/v1/chat/completions", &chat).await;
        assert_eq!(status, 200, "{}: {v}", case["name"]);
        assert_eq!(v["usage"]["prompt_tokens"], ids.len(), "{}", case["name"]);
        checked += 1;
    }
    assert!(checked >= 25, "{checked}");
    let user = json!([{"role": "user", "content": "x"}]);
    for (body, field) in [
        (
            json!({"messages": user, "reasoning_effort": "medium"}),
            "reasoning_effort",
        ),
        (
            json!({"messages": user, "chat_template_kwargs": {"reasoning_effort": 101}}),
            "chat_template_kwargs.reasoning_effort",
        ),
    ] {
        let (status, e) = post(&server, "/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{e}");
        assert_eq!(e["error"]["param"], field, "{e}");
    }
    let body = json!({"messages": user, "max_tokens": 1,
                      "output_config": {"effort": "medium"}, "thinking": {"type": "enabled"}});
    let (status, e) = post(&server, "/v1/messages", &body).await;
    assert_eq!(status, 400, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("output_config.effort"),
        "{e}"
    );
    let body = json!({"input": "x", "max_output_tokens": 1, "reasoning": {"effort": "minimal"}});
    let (status, e) = post(&server, "/v1/responses", &body).await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["param"], "reasoning.effort", "{e}");
    server.wait_idle().await;
}

/// The scripted V4.1 answer through Chat Completions, whole and streamed: reasoning, content
/// and both calls, nothing of the markup in any delta; the calls' results sent back (out of
/// call order) get the script's answer to a tool result.
#[tokio::test]
async fn v41_calls_come_back_as_openai_tool_calls() {
    let server = Server::start(&[
        "--model",
        v41_model(),
        "--debug-force-output",
        &script(),
        "--debug-force-output-after",
        "tool_result>",
        "Both came back.</think>Sunny, and it is noon.",
    ]);
    let req = json!({"messages": [{"role": "user", "content": "Weather in Paris and the time?"}],
                     "tools": openai_tools(), "max_tokens": 400});
    let (status, v) = post(&server, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let msg = &choice["message"];
    assert_eq!(msg["reasoning_content"], REASONING);
    assert_eq!(msg["content"], CONTENT);
    let calls: Vec<(&str, &str)> = msg["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let f = &c["function"];
            (
                f["name"].as_str().unwrap(),
                f["arguments"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [("get_weather", WEATHER_ARGS), ("get_time", TIME_ARGS)]
    );

    let text = post_stream(&server, "/v1/chat/completions", &req).await;
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut acc: Vec<(String, String)> = Vec::new();
    for c in sse_chunks(&text) {
        let d = &c["choices"][0]["delta"];
        let r = d["reasoning_content"].as_str().unwrap_or("");
        let t = d["content"].as_str().unwrap_or("");
        assert_no_markup(r);
        assert_no_markup(t);
        reasoning.push_str(r);
        content.push_str(t);
        for tc in d["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap() as usize;
            acc.resize(acc.len().max(i + 1), Default::default());
            acc[i]
                .0
                .push_str(tc["function"]["name"].as_str().unwrap_or(""));
            acc[i]
                .1
                .push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    assert_eq!((reasoning.as_str(), content.as_str()), (REASONING, CONTENT));
    let acc: Vec<(&str, &str)> = acc.iter().map(|(n, a)| (n.as_str(), a.as_str())).collect();
    assert_eq!(acc, calls);

    // The round trip: the calls and their results (out of call order) in the next turn.
    let mut next = req.clone();
    let ids: Vec<&Value> = msg["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["id"])
        .collect();
    next["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": CONTENT, "tool_calls": msg["tool_calls"]}),
        json!({"role": "tool", "tool_call_id": ids[1], "content": "12:00"}),
        json!({"role": "tool", "tool_call_id": ids[0], "content": "sunny"}),
    ]);
    let (status, t) = post(&server, "/tokenize", &next).await;
    assert_eq!(status, 200, "{t}");
    let tok = Tokenizer::from_dir(v41_model()).unwrap();
    let ids: Vec<u32> = serde_json::from_value(t["tokens"].clone()).unwrap();
    let rendered = tok.decode(&ids, false);
    let results = "<｜User｜><tool_result>sunny</tool_result>\n\n<tool_result>12:00</tool_result>";
    assert!(
        rendered.ends_with(&format!("{results}<｜Assistant｜><think>")),
        "{rendered}"
    );
    assert!(rendered.contains(&format!("<{D} parameter name=\"zones\" string=\"false\">")));
    let (status, v) = post(&server, "/v1/chat/completions", &next).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(
        v["choices"][0]["message"]["reasoning_content"],
        "Both came back."
    );
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "Sunny, and it is noon."
    );

    // Without tools the markup is text, and tool_choice "none" leaves it so too.
    let mut plain = req.clone();
    plain["tool_choice"] = json!("none");
    let (_, v) = post(&server, "/v1/chat/completions", &plain).await;
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        text.contains(&format!("<{D} invoke name=\"get_weather\">")),
        "{v}"
    );
    server.wait_idle().await;
}

/// The same answer through Anthropic's Messages and OpenAI's Responses APIs.
#[tokio::test]
async fn v41_calls_come_back_through_messages_and_responses() {
    let server = Server::start(&["--model", v41_model(), "--debug-force-output", &script()]);
    let tools = json!([
        {"name": "get_weather", "input_schema": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}}},
        {"name": "get_time", "input_schema": {"type": "object", "properties": {
            "zones": {"type": "array"}}}}
    ]);
    let body = json!({"messages": [{"role": "user", "content": "Weather and time?"}],
                      "tools": tools, "max_tokens": 400, "thinking": {"type": "adaptive"},
                      "output_config": {"effort": "max"}});
    let (status, m) = post(&server, "/v1/messages", &body).await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let kinds: Vec<&str> = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["thinking", "text", "tool_use", "tool_use"], "{m}");
    assert_eq!(m["content"][0]["thinking"], REASONING);
    assert_eq!(m["content"][1]["text"], CONTENT);
    assert_eq!(
        m["content"][2]["input"],
        json!({"city": "Paris", "days": 3})
    );
    assert_eq!(m["content"][3]["input"], json!({"zones": ["CET", "JST"]}));
    let events = post_stream(&server, "/v1/messages", &body).await;
    let mut text = String::new();
    let mut tool_uses = 0;
    for data in events.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let e: Value = serde_json::from_str(data).unwrap();
        if e["type"] == "content_block_start" && e["content_block"]["type"] == "tool_use" {
            tool_uses += 1;
        }
        let delta = &e["delta"];
        for field in ["text", "thinking"] {
            let piece = delta[field].as_str().unwrap_or("");
            assert_no_markup(piece);
            if field == "text" {
                text.push_str(piece);
            }
        }
    }
    assert_eq!((text.as_str(), tool_uses), (CONTENT, 2));

    let body = json!({"input": "Weather and time?", "max_output_tokens": 400,
                      "reasoning": {"effort": "high"},
                      "tools": [
                          {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
                          {"type": "function", "name": "get_time", "parameters": {"type": "object"}}]});
    let (status, r) = post(&server, "/v1/responses", &body).await;
    assert_eq!(status, 200, "{r}");
    let items: Vec<(&str, &str)> = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let kind = o["type"].as_str().unwrap();
            let text = match kind {
                "function_call" => o["arguments"].as_str().unwrap(),
                _ => o["content"][0]["text"].as_str().unwrap(),
            };
            (kind, text)
        })
        .collect();
    assert_eq!(
        items,
        [
            ("reasoning", REASONING),
            ("message", CONTENT),
            ("function_call", WEATHER_ARGS),
            ("function_call", TIME_ARGS)
        ],
        "{r}"
    );
    let events = post_stream(&server, "/v1/responses", &body).await;
    for data in events.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let e: Value = serde_json::from_str(data).unwrap();
        if let Some(delta) = e["delta"].as_str() {
            if e["type"] != "response.function_call_arguments.delta" {
                assert_no_markup(delta);
            }
        }
    }
    server.wait_idle().await;
}

/// A V4.1 conversation's next turn shares its prefix: the second request reads its first
/// turn's tokens from the prefix cache.
#[tokio::test]
async fn a_second_v41_turn_hits_the_prefix_cache() {
    let server = Server::start(&["--model", v41_model()]);
    let system = "You are a careful assistant. ".repeat(40);
    let first = json!([{"role": "system", "content": system},
                       {"role": "user", "content": "Name a colour."}]);
    let req = json!({"messages": first, "max_tokens": 6, "temperature": 0});
    let (status, a) = post(&server, "/v1/chat/completions", &req).await;
    assert_eq!(status, 200, "{a}");
    let answer = &a["choices"][0]["message"];
    let mut messages = first.as_array().unwrap().clone();
    messages.push(json!({"role": "assistant", "content": answer["content"],
                         "reasoning_content": answer["reasoning_content"]}));
    messages.push(json!({"role": "user", "content": "Another one."}));
    let (status, b) = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 6, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{b}");
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let first_prompt = a["usage"]["prompt_tokens"].as_u64().unwrap();
    // The first turn up to its user message is shared (the opener after it changes: the
    // old turn's reasoning is dropped), whole cache blocks of it.
    assert!(
        cached > 0 && cached < first_prompt,
        "cached {cached} of {first_prompt}: {b}"
    );
    server.wait_idle().await;
}

/// V4's effort tiers by flag: `preview` gives `max` the "Absolute maximum" preamble and the
/// default none; the flag is refused for a V4.1 checkpoint, naming it.
#[tokio::test]
async fn v4_effort_profiles_and_their_flag() {
    let server = Server::start(&["--reasoning-effort-profile", "preview"]);
    let tok = Tokenizer::from_dir(server.model_root().await).unwrap();
    let rendered = |v: &Value| {
        let ids: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
        tok.decode(&ids, false)
    };
    let user = json!([{"role": "user", "content": "x"}]);
    let (_, t) = post(
        &server,
        "/tokenize",
        &json!({"messages": user, "reasoning_effort": "max"}),
    )
    .await;
    assert!(
        rendered(&t).starts_with("<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum"),
        "{}",
        rendered(&t)
    );
    let (_, t) = post(&server, "/tokenize", &json!({"messages": user})).await;
    assert_eq!(
        rendered(&t),
        "<｜begin▁of▁sentence｜><｜User｜>x<｜Assistant｜><think>"
    );
    server.wait_idle().await;

    let out = Command::new(binary())
        .args(["serve", "--port", "0", "--model", v41_model()])
        .args(["--reasoning-effort-profile", "preview"])
        .env("DEEPINFER_CACHE_DIR", support::cache_dir())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--reasoning-effort-profile: DeepSeek-V4.1"),
        "{err}"
    );
}
