//! Anthropic's Messages API end to end against the running binary: the same answer as Chat
//! Completions (one renderer, one engine, one parser), Anthropic's event sequence and block
//! shapes, a scripted DSML tool call as a `tool_use` block, token counts, the prefix cache in
//! `cache_read_input_tokens`, and Anthropic's error shape for every failure (including the
//! API key, checked before any handler runs).

mod support;

use serde_json::{json, Value};
use support::{read_sse, Server};

async fn post(server: &Server, path: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
    let mut r = reqwest::Client::new()
        .post(server.url(path))
        .header("anthropic-version", "2023-06-01")
        .json(body);
    if let Some(k) = key {
        r = r.header("x-api-key", k);
    }
    let r = r.send().await.expect("request sent");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A streamed answer's events: the `event:` name (checked to equal the data's `type`) and
/// the data.
async fn stream(server: &Server, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = reqwest::Client::new()
        .post(server.url("/v1/messages?beta=true"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let text = read_sse(r).await;
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty() && !e.starts_with(':'))
        .map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: ")).expect(e);
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).expect(e);
            let v: Value = serde_json::from_str(data).unwrap();
            assert_eq!(v["type"], name, "{e}");
            v
        })
        .collect()
}

/// The blocks a client rebuilds from the events (as the SDKs accumulate them), after
/// checking the sequence's grammar: start, ping, blocks opened and closed in index order,
/// one message_delta, stop.
fn accumulate(events: &[Value]) -> (Value, Vec<Value>) {
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(&kinds[..2], ["message_start", "ping"], "{kinds:?}");
    assert_eq!(&kinds[kinds.len() - 2..], ["message_delta", "message_stop"]);
    let mut message = events[0]["message"].clone();
    let mut blocks: Vec<Value> = Vec::new();
    let mut open = None;
    for e in &events[2..events.len() - 2] {
        match e["type"].as_str().unwrap() {
            "content_block_start" => {
                assert_eq!(open, None, "a block started inside another");
                assert_eq!(e["index"], blocks.len());
                open = Some(blocks.len());
                blocks.push(e["content_block"].clone());
            }
            "content_block_delta" => {
                assert_eq!(e["index"].as_u64().map(|i| i as usize), open);
                let b = blocks.last_mut().unwrap();
                let d = &e["delta"];
                let (field, piece) = match d["type"].as_str().unwrap() {
                    "text_delta" => ("text", &d["text"]),
                    "thinking_delta" => ("thinking", &d["thinking"]),
                    "signature_delta" => ("signature", &d["signature"]),
                    "input_json_delta" => ("partial_json", &d["partial_json"]),
                    other => panic!("delta {other}"),
                };
                let acc = b[field].as_str().unwrap_or("").to_owned() + piece.as_str().unwrap();
                b[field] = json!(acc);
            }
            "content_block_stop" => {
                assert_eq!(e["index"].as_u64().map(|i| i as usize), open);
                let b = blocks.last_mut().unwrap();
                if let Some(j) = b.as_object_mut().unwrap().remove("partial_json") {
                    b["input"] = serde_json::from_str(j.as_str().unwrap()).unwrap();
                }
                open = None;
            }
            other => panic!("unexpected {other} between the blocks"),
        }
    }
    let delta = &events[events.len() - 2];
    message["stop_reason"] = delta["delta"]["stop_reason"].clone();
    message["stop_sequence"] = delta["delta"]["stop_sequence"].clone();
    message["usage"] = delta["usage"].clone();
    (message, blocks)
}

fn conversation() -> Value {
    json!([{"role": "user", "content": "Name three colours, please, in a short list."}])
}

/// One conversation through both APIs at temperature 0: the Messages answer is the Chat
/// Completions answer (chat mode on both), whole and streamed, with the same token counts;
/// `count_tokens` counts the prompt it renders.
#[tokio::test]
async fn messages_answer_as_chat_completions_whole_and_streamed() {
    let server = Server::start(&[]);
    // Long enough to fill a cache block (128 tokens) or two.
    let system = "Answer briefly and plainly. ".repeat(60);
    let mut messages = vec![json!({"role": "system", "content": system})];
    messages.extend(conversation().as_array().unwrap().iter().cloned());
    let chat = json!({"messages": messages, "max_tokens": 12, "temperature": 0,
                      "chat_template_kwargs": {"thinking": false}});
    let (status, c) = post(&server, "/v1/chat/completions", &chat, None).await;
    assert_eq!(status, 200, "{c}");
    let want = c["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let body = json!({"model": c["model"], "system": system, "messages": conversation(),
                      "max_tokens": 12, "temperature": 0});
    let (status, m) = post(&server, "/v1/messages", &body, None).await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert!(m["id"].as_str().unwrap().starts_with("msg_"), "{m}");
    let text: String = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            assert_eq!(b["type"], "text", "{m}");
            b["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(text, want);
    let finish = c["choices"][0]["finish_reason"].as_str().unwrap();
    let reason = if finish == "length" {
        "max_tokens"
    } else {
        "end_turn"
    };
    assert_eq!(m["stop_reason"], reason, "{m}");
    let u = &m["usage"];
    assert_eq!(u["output_tokens"], c["usage"]["completion_tokens"]);
    let input =
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(input, c["usage"]["prompt_tokens"].as_u64().unwrap());
    let (status, n) = post(&server, "/v1/messages/count_tokens", &body, None).await;
    assert_eq!(status, 200, "{n}");
    assert_eq!(n, json!({"input_tokens": input}));

    let (message, blocks) = accumulate(&stream(&server, &body).await);
    assert_eq!(json!(blocks), m["content"]);
    assert_eq!(message["stop_reason"], m["stop_reason"]);
    assert_eq!(message["usage"]["output_tokens"], u["output_tokens"]);
    // The repeat found the prompt's blocks in the prefix cache.
    assert!(
        message["usage"]["cache_read_input_tokens"]
            .as_u64()
            .unwrap()
            > 0,
        "{message}"
    );
    server.wait_idle().await;
}

/// A stop sequence ends the answer before it and is named; without one the (scripted)
/// answer runs to its end of turn.
#[tokio::test]
async fn a_stop_sequence_ends_the_answer_and_is_named() {
    let server = Server::start(&["--debug-force-output", "The sky is blue. Grass is green."]);
    let body = json!({"messages": conversation(), "max_tokens": 50});
    let (_, m) = post(&server, "/v1/messages", &body, None).await;
    assert_eq!(
        m["content"],
        json!([{"type": "text", "text": "The sky is blue. Grass is green."}])
    );
    assert_eq!(m["stop_reason"], "end_turn", "{m}");
    assert_eq!(m["stop_sequence"], Value::Null);
    let mut cut = body.clone();
    cut["stop_sequences"] = json!(["never", "Grass"]);
    let (_, whole) = post(&server, "/v1/messages", &cut, None).await;
    let (streamed, blocks) = accumulate(&stream(&server, &cut).await);
    for m in [&whole, &streamed] {
        assert_eq!(m["stop_reason"], "stop_sequence", "{m}");
        assert_eq!(m["stop_sequence"], "Grass");
    }
    assert_eq!(
        whole["content"],
        json!([{"type": "text", "text": "The sky is blue. "}])
    );
    assert_eq!(json!(blocks), whole["content"]);
    // A budget smaller than the answer ends it at `max_tokens`.
    cut["max_tokens"] = json!(2);
    let (_, s) = post(&server, "/v1/messages", &cut, None).await;
    assert_eq!(s["stop_reason"], "max_tokens", "{s}");
    assert_eq!(s["usage"]["output_tokens"], 2);
}

const D: &str = "｜DSML｜";

/// The model writes reasoning, text and a DSML tool call (scripted): with thinking enabled
/// the answer is a thinking block, a text block and a `tool_use` block, whole and streamed;
/// the call and its result sent back make the next turn.
#[tokio::test]
async fn a_dsml_tool_call_comes_back_as_a_tool_use_block() {
    let script = format!(
        "I should check the weather.</think>Let me look that up.\n\n<{D}tool_calls>\n\
         <{D}invoke name=\"get_weather\">\n\
         <{D}parameter name=\"city\" string=\"true\">Paris</{D}parameter>\n\
         <{D}parameter name=\"days\" string=\"false\">3</{D}parameter>\n\
         </{D}invoke>\n</{D}tool_calls>"
    );
    let server = Server::start(&["--debug-force-output", &script]);
    let tools = json!([{"name": "get_weather", "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}]);
    let body = json!({"messages": [{"role": "user", "content": "Weather in Paris for 3 days?"}],
                      "tools": tools, "max_tokens": 200,
                      "thinking": {"type": "enabled", "budget_tokens": 1024}});
    let (status, m) = post(&server, "/v1/messages", &body, None).await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let c = m["content"].as_array().unwrap();
    assert_eq!(c.len(), 3, "{m}");
    assert_eq!(c[0]["type"], "thinking");
    assert_eq!(c[0]["thinking"], "I should check the weather.");
    assert!(!c[0]["signature"].as_str().unwrap().is_empty());
    assert_eq!(
        c[1],
        json!({"type": "text", "text": "Let me look that up."})
    );
    assert_eq!(c[2]["type"], "tool_use");
    assert_eq!(c[2]["name"], "get_weather");
    assert_eq!(c[2]["input"], json!({"city": "Paris", "days": 3}));
    assert!(c[2]["id"].as_str().unwrap().starts_with("toolu_"));

    let (message, blocks) = accumulate(&stream(&server, &body).await);
    assert_eq!(message["stop_reason"], "tool_use");
    assert_eq!(blocks.len(), 3);
    assert_eq!(blocks[0]["thinking"], c[0]["thinking"]);
    assert_eq!(blocks[1], c[1]);
    assert_eq!(blocks[2]["input"], c[2]["input"]);

    // The assistant turn as the client keeps it, and the tool's result.
    let mut next = body.clone();
    next["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": m["content"]}),
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": c[2]["id"], "content": "18 C, sunny"}]}),
    ]);
    let (status, again) = post(&server, "/v1/messages", &next, None).await;
    assert_eq!(status, 200, "{again}");
    let grew = |v: &Value| {
        v["usage"]["input_tokens"].as_u64().unwrap()
            + v["usage"]["cache_read_input_tokens"].as_u64().unwrap()
    };
    assert!(grew(&again) > grew(&m), "{again}");
}

/// Every failure answers in Anthropic's shape, naming the field; the key is read from
/// `x-api-key` (Anthropic's clients) or `Authorization: Bearer`.
#[tokio::test]
async fn errors_take_anthropics_shape_and_x_api_key_is_read() {
    let server = Server::start(&["--api-key", "sekret", "--max-request-body-mib", "1"]);
    let ok = json!({"messages": conversation(), "max_tokens": 2});
    let (status, v) = post(&server, "/v1/messages", &ok, None).await;
    assert_eq!(status, 401);
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error", "{v}");
    let (status, _) = post(&server, "/v1/messages", &ok, Some("sekret")).await;
    assert_eq!(status, 200);
    let r = reqwest::Client::new()
        .post(server.url("/v1/messages/count_tokens"))
        .bearer_auth("sekret")
        .json(&ok)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let key = Some("sekret");
    let cases = [
        (
            json!({"messages": conversation()}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            json!({"messages": conversation(), "max_tokens": 2, "temperature": -1}),
            400,
            "invalid_request_error",
            "temperature",
        ),
        (
            json!({"messages": conversation(), "max_tokens": 2, "stop_sequences": [""]}),
            400,
            "invalid_request_error",
            "stop_sequences",
        ),
        (
            json!({"messages": conversation(), "max_tokens": 2, "model": "claude-opus"}),
            404,
            "not_found_error",
            "claude-opus",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}], "max_tokens": 2}),
            400,
            "invalid_request_error",
            "messages[0].content[0].source.type",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}], "max_tokens": 2}),
            400,
            "invalid_request_error",
            "takes no images",
        ),
        (
            json!({"messages": "hi", "max_tokens": 2}),
            400,
            "invalid_request_error",
            "messages",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x".repeat(2 << 20)}], "max_tokens": 2}),
            413,
            "request_too_large",
            "--max-request-body-mib",
        ),
    ];
    for (body, want_status, kind, names) in cases {
        let (status, v) = post(&server, "/v1/messages", &body, key).await;
        assert_eq!(status, want_status, "{v}");
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], kind, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(names),
            "{v}"
        );
    }
    // OpenAI's routes keep OpenAI's shape.
    let r = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .header("x-api-key", "sekret")
        .json(&json!({"messages": [], "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "messages", "{v}");
}

/// Agents send a fixed `max_tokens` whatever the context (Claude Code: 32 000): the budget is
/// cut to the context left, and an answer that reaches that end says so.
#[tokio::test]
async fn a_budget_past_the_context_is_cut_to_it_and_named() {
    let words = "word ".repeat(80);
    let server = Server::start(&["--max-model-len", "64", "--debug-force-output", &words]);
    let body = json!({"messages": [{"role": "user", "content": "Talk."}], "max_tokens": 32000});
    let (_, n) = post(&server, "/v1/messages/count_tokens", &body, None).await;
    let prompt = n["input_tokens"].as_u64().unwrap();
    let (status, m) = post(&server, "/v1/messages", &body, None).await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["stop_reason"], "model_context_window_exceeded", "{m}");
    assert_eq!(m["usage"]["output_tokens"].as_u64().unwrap(), 64 - prompt);
}
