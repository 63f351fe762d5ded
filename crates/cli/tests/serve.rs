//! `deepinfer serve` end to end: a real HTTP client against the running binary. Greedy
//! output must equal the engine's own (`deepinfer generate`), errors must be OpenAI's JSON,
//! and a client that goes away must free its cache.

mod support;

use deepinfer_server::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::{engine_greedy, engine_greedy_text, metric, sse_chunks, Server, SseEvents};

async fn post(server: &Server, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(server.url(path))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn post_text(server: &Server, path: &str, body: Value) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(server.url(path))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Waits until the engine has counted `n` aborted requests.
async fn wait_aborted(server: &Server, n: usize) {
    let aborts = |m: &str| {
        metric(
            m,
            "deepinfer:request_success_total",
            &[("finished_reason", "abort")],
        ) == Some(n as f64)
    };
    server
        .wait_metrics(Duration::from_secs(20), &format!("{n} aborts"), aborts)
        .await;
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![100, 2000, 30000, 5, 77, 1234],
        (0..40).map(|i| 1000 + 37 * i).collect(),
    ]
}

#[tokio::test]
async fn completions_equal_the_engine_greedy_whole_and_streamed() {
    let server = Server::start(&[]);
    let reference = engine_greedy_text(&server.model_root().await, &prompts(), 12);

    let body = json!({"prompt": prompts(), "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    let (status, v) = post(&server, "/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    for (i, want) in reference.iter().enumerate() {
        assert_eq!(v["choices"][i]["index"], i);
        assert_eq!(v["choices"][i]["text"].as_str().unwrap(), want);
        assert_eq!(v["choices"][i]["finish_reason"], "length");
    }
    let prompt_tokens: usize = prompts().iter().map(Vec::len).sum();
    assert_eq!(
        v["usage"],
        json!({
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 24,
            "total_tokens": prompt_tokens + 24,
            "prompt_tokens_details": {"cached_tokens": 0}
        })
    );

    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, text) = post_text(&server, "/v1/completions", streamed).await;
    assert_eq!(status, 200, "{text}");
    let chunks = sse_chunks(&text);
    let mut texts = vec![String::new(); 2];
    let mut finish = vec![None; 2];
    for c in &chunks[..chunks.len() - 1] {
        assert!(c.get("usage").is_none(), "usage only at the end: {c}");
        for ch in c["choices"].as_array().unwrap() {
            let i = ch["index"].as_u64().unwrap() as usize;
            assert!(finish[i].is_none(), "a delta after the finish: {c}");
            texts[i].push_str(ch["text"].as_str().unwrap());
            if let Some(r) = ch["finish_reason"].as_str() {
                finish[i] = Some(r.to_string());
            }
        }
    }
    assert_eq!(texts, reference);
    assert_eq!(finish, vec![Some("length".to_string()); 2]);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 24);
    assert_eq!(last["usage"]["prompt_tokens"], prompt_tokens);
    server.wait_idle().await;
}

#[tokio::test]
async fn n_choices_stop_strings_and_logprobs() {
    let server = Server::start(&[]);
    let p = prompts()[0].clone();
    let base = json!({"prompt": p, "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    let (_, whole) = post(&server, "/v1/completions", base.clone()).await;
    let full = whole["choices"][0]["text"].as_str().unwrap().to_string();

    // n = 3 greedy choices are identical and counted three times.
    let mut req = base.clone();
    req["n"] = json!(3);
    let (status, v) = post(&server, "/v1/completions", req).await;
    assert_eq!(status, 200, "{v}");
    for i in 0..3 {
        assert_eq!(v["choices"][i]["text"].as_str().unwrap(), full);
    }
    assert_eq!(v["usage"]["completion_tokens"], 36);

    // A stop string from the middle of the greedy text: output ends just before it.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 6, "{full:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let cut = full.find(&stop).unwrap();
    for stream in [false, true] {
        let mut req = base.clone();
        req["stop"] = json!([stop]);
        req["stream"] = json!(stream);
        let (status, text) = post_text(&server, "/v1/completions", req).await;
        assert_eq!(status, 200, "{text}");
        let (got, finish, reason) = if stream {
            let chunks = sse_chunks(&text);
            let got: String = chunks
                .iter()
                .map(|c| c["choices"][0]["text"].as_str().unwrap().to_string())
                .collect();
            let last = &chunks.last().unwrap()["choices"][0];
            (
                got,
                last["finish_reason"].clone(),
                last["stop_reason"].clone(),
            )
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            let c = &v["choices"][0];
            (
                c["text"].as_str().unwrap().to_string(),
                c["finish_reason"].clone(),
                c["stop_reason"].clone(),
            )
        };
        assert_eq!(got, full[..cut], "stream={stream}");
        assert_eq!(finish, "stop");
        assert_eq!(reason, json!(stop));
    }

    // logprobs: one entry per generated token, the chosen token the most likely (greedy).
    let mut req = base.clone();
    req["logprobs"] = json!(2);
    let (status, v) = post(&server, "/v1/completions", req).await;
    assert_eq!(status, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 12);
    assert_eq!(
        lp["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect::<String>(),
        full
    );
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 2);
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!((chosen - best).abs() < 1e-5, "greedy picks the top token");
        assert!(chosen <= 0.0);
    }
    server.wait_idle().await;
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let server = Server::start(&["--max-request-body-mib", "1", "--max-model-len", "4096"]);
    let ok = json!({"prompt": [5, 6, 7], "max_tokens": 2});
    let with = |k: &str, v: Value| {
        let mut b = ok.clone();
        b[k] = v;
        b
    };
    let cases: Vec<(Value, u16, Option<&str>, &str)> = vec![
        (
            with("temperature", json!("hot")),
            400,
            Some("temperature"),
            "invalid type",
        ),
        (
            with("temperature", json!(-1)),
            400,
            Some("temperature"),
            ">= 0",
        ),
        (
            with("max_tokens", json!(-1)),
            400,
            Some("max_tokens"),
            "at least 1",
        ),
        (
            with("max_tokens", json!(0)),
            400,
            Some("max_tokens"),
            "at least 1",
        ),
        (
            with("max_tokens", json!(1_000_000_000u64)),
            400,
            Some("max_tokens"),
            "maximum context length is 4096",
        ),
        (
            with("max_tokens", json!(1.5)),
            400,
            Some("max_tokens"),
            "invalid type",
        ),
        (with("n", json!(0)), 400, Some("n"), "between 1"),
        (
            json!({"prompt": [[5], [6]], "n": 100, "max_tokens": 2}),
            400,
            Some("n"),
            "at most 128 choices",
        ),
        (
            with("prompt", json!(vec![vec![5]; 129])),
            400,
            Some("prompt"),
            "at most 128 choices",
        ),
        (with("n", json!(1_000_000)), 400, Some("n"), "between 1"),
        (with("top_p", json!(2.0)), 400, Some("top_p"), "(0, 1]"),
        (with("top_k", json!(-5)), 400, Some("top_k"), "-1"),
        (
            with("presence_penalty", json!(9)),
            400,
            Some("presence_penalty"),
            "[-2, 2]",
        ),
        (
            with("logit_bias", json!({"abc": 1})),
            400,
            Some("logit_bias"),
            "token ids",
        ),
        (
            with("logit_bias", json!({"999999999": 1})),
            400,
            Some("logit_bias"),
            "vocabulary",
        ),
        (
            with("logprobs", json!(50)),
            400,
            Some("logprobs"),
            "at most 20",
        ),
        (with("stop", json!(5)), 400, Some("stop"), "did not match"),
        (
            with("stream_options", json!({"include_usage": true})),
            400,
            Some("stream_options"),
            "stream",
        ),
        (with("prompt", json!([])), 400, Some("prompt"), "empty"),
        (
            with("prompt", json!([999_999_999u64])),
            400,
            Some("prompt"),
            "vocabulary",
        ),
        (
            with("prompt", json!(vec![5; 5000])),
            400,
            Some("prompt"),
            "maximum context length is 4096",
        ),
        (
            with("model", json!("gpt-4")),
            404,
            Some("model"),
            "does not exist",
        ),
        (
            with("suffix", json!("x")),
            400,
            Some("suffix"),
            "not supported",
        ),
        (json!({"max_tokens": 2}), 400, Some("prompt"), "required"),
        (json!([1, 2]), 400, None, "JSON object"),
    ];
    for (body, status, param, msg) in cases {
        let (got, v) = post(&server, "/v1/completions", body.clone()).await;
        assert_eq!(got, status, "{body} -> {v}");
        let e = &v["error"];
        assert_eq!(e["code"], status, "{v}");
        assert_eq!(e["param"].as_str(), param, "{body} -> {v}");
        assert!(
            e["message"].as_str().unwrap().contains(msg),
            "{body} -> {v}"
        );
        assert!(e["type"].is_string());
    }
    // Unknown fields are ignored, as vLLM does.
    let (got, v) = post(&server, "/v1/completions", with("frobnicate", json!(1))).await;
    assert_eq!(got, 200, "{v}");

    let client = reqwest::Client::new();
    let raw = |body: Vec<u8>| {
        client
            .post(server.url("/v1/completions"))
            .header("content-type", "application/json")
            .body(body)
    };
    let r = raw(b"{\"prompt\": ".to_vec()).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{v}"
    );
    let r = raw(vec![b' '; 2 << 20]).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("limit"),
        "{v}"
    );
    // The 413 is sent before the body is read, so that connection closes: use a new one.
    let r = reqwest::Client::new()
        .get(server.url("/v1/nothing"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert!(r.json::<Value>().await.unwrap()["error"].is_object());
    server.wait_idle().await;
}

#[tokio::test]
async fn api_key_guards_v1_and_tokenizer_routes_not_health() {
    let server = Server::start(&["--api-key", "sekret"]);
    let c = reqwest::Client::new();
    let body = json!({"prompt": [5, 6], "max_tokens": 1});
    for auth in [None, Some("Bearer wrong"), Some("sekret")] {
        let mut r = c.post(server.url("/v1/completions")).json(&body);
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{auth:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "authentication_error");
    }
    let r = c
        .post(server.url("/v1/completions"))
        .bearer_auth("sekret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // The scheme is case-insensitive (RFC 9110).
    for auth in ["bearer sekret", "BEARER sekret"] {
        let r = c
            .post(server.url("/v1/completions"))
            .header("authorization", auth)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{auth}");
    }
    // A known route with the wrong method: 405 in OpenAI's error shape, with `Allow`.
    for (path, auth) in [("/v1/completions", true), ("/tokenize", false)] {
        let mut req = c.get(server.url(path));
        if auth {
            req = req.bearer_auth("sekret");
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), 405, "{path}");
        assert_eq!(r.headers()["allow"], "POST");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], 405, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("GET"),
            "{v}"
        );
    }
    assert_eq!(
        c.get(server.url("/v1/models"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        401
    );
    assert_eq!(
        c.get(server.url("/health"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        c.get(server.url("/metrics"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_frees_its_cache() {
    let server = Server::start(&[]);
    let mut r = reqwest::Client::new()
        .post(server.url("/v1/completions"))
        .json(&json!({"prompt": prompts()[1], "max_tokens": 20000, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut seen = String::new();
    while !seen.contains("\n\n") {
        seen.push_str(&String::from_utf8_lossy(&r.chunk().await.unwrap().unwrap()));
    }
    let m = server.metrics().await;
    assert_eq!(
        metric(&m, "deepinfer:num_requests_running", &[]),
        Some(1.0),
        "{m}"
    );
    assert!(
        metric(
            &m,
            "deepinfer:kv_cache_usage_perc",
            &[("pool", "state_slots")]
        )
        .unwrap()
            > 0.0
    );
    drop(r);
    let m = server.wait_idle().await;
    assert_eq!(
        metric(
            &m,
            "deepinfer:request_success_total",
            &[("finished_reason", "abort")]
        ),
        Some(1.0),
        "{m}"
    );
}

#[tokio::test]
async fn a_full_admission_queue_answers_503() {
    let server = Server::start(&["--max-pending-requests", "1"]);
    let c = reqwest::Client::new();
    let long = c
        .post(server.url("/v1/completions"))
        .json(&json!({"prompt": [5, 6], "max_tokens": 20000, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(long.status().as_u16(), 200);
    let (status, v) = post(
        &server,
        "/v1/completions",
        json!({"prompt": [5], "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 503, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("limit of 1"));
    drop(long);
    // The place comes back when the server drops the stream, which is when it aborts the
    // request; the engine's gauges alone can read idle before its first step reports.
    wait_aborted(&server, 1).await;
    server.wait_idle().await;
    let (status, _) = post(
        &server,
        "/v1/completions",
        json!({"prompt": [5], "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 200);
}

/// The queue counts sequences, not requests: a batch of prompts with `n` choices each takes
/// prompts × n places, all or none.
#[tokio::test]
async fn admission_counts_every_sequence_of_a_request() {
    let server = Server::start(&["--max-pending-requests", "4"]);
    let c = reqwest::Client::new();
    let batch = |prompts: usize, n: usize| json!({"prompt": vec![vec![5, 6]; prompts], "n": n, "max_tokens": 1});
    let (status, v) = post(&server, "/v1/completions", batch(2, 3)).await;
    assert_eq!(status, 503, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("needs 6"),
        "{v}"
    );
    let (status, v) = post(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "n": 5, "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 503, "{v}");
    let (status, v) = post(&server, "/v1/completions", batch(2, 2)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 4);

    // One sequence in flight leaves room for three more, not four.
    let long = c
        .post(server.url("/v1/completions"))
        .json(&json!({"prompt": [5, 6], "max_tokens": 20000, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(long.status().as_u16(), 200);
    let (status, v) = post(&server, "/v1/completions", batch(2, 2)).await;
    assert_eq!(status, 503, "{v}");
    let (status, v) = post(&server, "/v1/completions", batch(3, 1)).await;
    assert_eq!(status, 200, "{v}");
    drop(long);
    server.wait_idle().await;
    let (status, _) = post(
        &server,
        "/v1/completions",
        json!({"prompt": [5], "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn tokenize_and_detokenize_use_the_model_tokenizer() {
    let server = Server::start(&[]);
    let root = server.model_root().await;
    let tok = Tokenizer::from_dir(&root).unwrap();
    let text = "Hello, 世界! 🦀 fn main() {}";
    let (status, v) = post(
        &server,
        "/tokenize",
        json!({"prompt": text, "return_token_strs": true}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let ids = tok.encode(text, true).unwrap();
    assert_eq!(v["tokens"], json!(ids));
    assert_eq!(v["count"], ids.len());
    assert_eq!(v["token_strs"].as_array().unwrap().len(), ids.len());
    let (status, v) = post(&server, "/detokenize", json!({"tokens": ids})).await;
    assert_eq!(status, 200);
    assert_eq!(v["prompt"], text);
    let (status, v) = post(&server, "/detokenize", json!({"tokens": [999_999_999u64]})).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "tokens");
}

#[tokio::test]
async fn ctrl_c_lets_in_flight_streams_finish() {
    let server = Server::start(&[]);
    let mut r = reqwest::Client::new()
        .post(server.url("/v1/completions"))
        .json(&json!({"prompt": [5, 6, 7], "max_tokens": 64, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut events = SseEvents::default();
    let mut body: String = events.push(&r.chunk().await.unwrap().unwrap()).concat();
    let waiter = tokio::task::spawn_blocking(move || server.interrupt_and_wait());
    while let Some(c) = r.chunk().await.unwrap() {
        body.extend(events.push(&c));
    }
    assert!(events.rest().is_empty());
    let chunks = sse_chunks(&body);
    let n: usize = chunks.len();
    assert_eq!(n, 64, "every token arrived before the server exited");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    let status = waiter.await.unwrap();
    assert!(status.success(), "{status:?}");
}

/// Chat: the prompt the server renders (seen through `/tokenize`), fed to the engine alone,
/// parsed with the library parser, equals what `/v1/chat/completions` answers, whole and
/// streamed; thinking mode splits reasoning from content.
#[tokio::test]
async fn chat_equals_the_engine_greedy_whole_and_streamed() {
    use deepinfer_server::chat::{parse_chat_output, ChatFormat};
    let server = Server::start(&[]);
    let root = server.model_root().await;
    let tok = Tokenizer::from_dir(&root).unwrap();
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime. 你好 🦀"},
    ]);
    for (effort, thinking) in [(None, true), (Some("none"), false)] {
        let mut req =
            json!({"messages": messages, "max_tokens": 10, "temperature": 0, "ignore_eos": true});
        if let Some(e) = effort {
            req["reasoning_effort"] = json!(e);
        }
        let (status, t) = post(&server, "/tokenize", req.clone()).await;
        assert_eq!(status, 200, "{t}");
        let ids: Vec<u32> = serde_json::from_value(t["tokens"].clone()).unwrap();
        assert_eq!(ids[0], 0, "BOS first");
        let out = &engine_greedy(&root, std::slice::from_ref(&ids), 10)[0];
        let text = tok.decode(out, true);
        let want = parse_chat_output(ChatFormat::V4.markup(), &text, thinking, false);

        let (status, v) = post(&server, "/v1/chat/completions", req.clone()).await;
        assert_eq!(status, 200, "{v}");
        let msg = &v["choices"][0]["message"];
        assert_eq!(msg["role"], "assistant");
        assert_eq!(msg["content"].as_str().unwrap(), want.content);
        assert_eq!(msg["reasoning_content"].as_str(), want.reasoning.as_deref());
        assert_eq!(v["usage"]["prompt_tokens"], ids.len());
        assert_eq!(v["usage"]["completion_tokens"], 10);
        assert_eq!(v["choices"][0]["finish_reason"], "length");

        req["stream"] = json!(true);
        let (status, text) = post_text(&server, "/v1/chat/completions", req).await;
        assert_eq!(status, 200, "{text}");
        let chunks = sse_chunks(&text);
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let (mut reasoning, mut content) = (String::new(), String::new());
        for c in &chunks {
            assert_eq!(c["object"], "chat.completion.chunk");
            let d = &c["choices"][0]["delta"];
            reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
            content.push_str(d["content"].as_str().unwrap_or(""));
        }
        assert_eq!(content, want.content);
        assert_eq!(reasoning, want.reasoning.unwrap_or_default());
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "length"
        );
    }
    server.wait_idle().await;
}

#[tokio::test]
async fn chat_tool_turns_are_accepted_and_bad_chats_rejected() {
    let server = Server::start(&[]);
    let tools = json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let round_trip = json!({
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        ],
        "tools": tools, "max_tokens": 4, "temperature": 0,
    });
    let (status, v) = post(&server, "/v1/chat/completions", round_trip.clone()).await;
    assert_eq!(status, 200, "{v}");
    let (_, t) = post(&server, "/tokenize", round_trip).await;
    let text = Tokenizer::from_dir(server.model_root().await)
        .unwrap()
        .decode(
            &serde_json::from_value::<Vec<u32>>(t["tokens"].clone()).unwrap(),
            false,
        );
    assert!(text.contains("## Tools"), "{text}");
    assert!(
        text.contains("<｜DSML｜invoke name=\"get_weather\">"),
        "{text}"
    );
    assert!(
        text.contains("<tool_result>18 C, sunny</tool_result>"),
        "{text}"
    );

    let user = json!([{"role": "user", "content": "hi"}]);
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"messages": []}), "messages", "empty"),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages",
            "wizard",
        ),
        (
            json!({"messages": [{"content": "x"}]}),
            "messages[0]",
            "role",
        ),
        (
            json!({"messages": user, "tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": tools}),
            "tool_choice",
            "no offered tool",
        ),
        (
            json!({"messages": user, "top_logprobs": 2}),
            "top_logprobs",
            "logprobs",
        ),
        (
            json!({"messages": user, "logprobs": true, "top_logprobs": 50}),
            "top_logprobs",
            "at most 20",
        ),
        (
            json!({"messages": user, "reasoning_effort": "extreme"}),
            "reasoning_effort",
            "must be one of",
        ),
        (
            json!({"messages": user, "chat_template_kwargs": "thinking"}),
            "chat_template_kwargs",
            "must be an object",
        ),
        (
            json!({"messages": user, "chat_template_kwargs": [1]}),
            "chat_template_kwargs",
            "must be an object",
        ),
        (
            json!({"messages": user, "response_format": {"type": "xml"}}),
            "response_format.type",
            "json_schema",
        ),
        (
            json!({"messages": user, "max_completion_tokens": 0}),
            "max_completion_tokens",
            "at least 1",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "a", "type": "function",
            "function": {"name": "f", "arguments": "{not json"}}]}, {"role": "user", "content": "y"}]}),
            "messages",
            "arguments",
        ),
    ];
    for (body, param, msg) in cases {
        let (status, v) = post(&server, "/v1/chat/completions", body.clone()).await;
        assert_eq!(status, 400, "{body} -> {v}");
        assert_eq!(v["error"]["param"], param, "{body} -> {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(msg),
            "{body} -> {v}"
        );
    }
    server.wait_idle().await;
}

#[test]
fn sse_events_are_split_on_bytes_not_chunks() {
    let body = "data: {\"text\": \"你好🦀\"}\n\ndata: [DONE]\n\n".as_bytes();
    // Every split point, including inside the multi-byte characters.
    for at in 0..body.len() {
        let mut ev = SseEvents::default();
        let mut got: String = ev.push(&body[..at]).concat();
        got.extend(ev.push(&body[at..]));
        assert!(ev.rest().is_empty());
        assert_eq!(got.as_bytes(), body, "split at {at}");
    }
}

const D: &str = "｜DSML｜";

/// What the model is made to write (`--debug-force-output`): reasoning, an answer, and a
/// DeepSeek-V4 DSML tool call with a string and a non-string argument.
fn dsml_tool_call_text() -> String {
    format!(
        "I should check the weather.</think>Let me look that up.\n\n<{D}tool_calls>\n\
         <{D}invoke name=\"get_weather\">\n\
         <{D}parameter name=\"city\" string=\"true\">Paris</{D}parameter>\n\
         <{D}parameter name=\"days\" string=\"false\">3</{D}parameter>\n\
         </{D}invoke>\n</{D}tool_calls>"
    )
}

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}])
}

/// The model writes a DSML tool call (scripted through the engine): the answer carries it as
/// an OpenAI tool call, whole and streamed, with `finish_reason: "tool_calls"`; the call and
/// its result sent back make a valid next turn.
#[tokio::test]
async fn a_dsml_tool_call_comes_back_as_an_openai_tool_call() {
    let server = Server::start(&["--debug-force-output", &dsml_tool_call_text()]);
    let req = json!({
        "messages": [{"role": "user", "content": "Weather in Paris for 3 days?"}],
        "tools": weather_tools(), "max_tokens": 200,
    });
    let (status, v) = post(&server, "/v1/chat/completions", req.clone()).await;
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let msg = &choice["message"];
    assert_eq!(msg["reasoning_content"], "I should check the weather.");
    assert_eq!(msg["content"], "Let me look that up.");
    let calls = msg["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call"));
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(
        calls[0]["function"]["arguments"],
        r#"{"city": "Paris", "days": 3}"#
    );

    // Streamed: the deltas of each tool call, accumulated by index, give the same call.
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let (status, text) = post_text(&server, "/v1/chat/completions", streamed).await;
    assert_eq!(status, 200, "{text}");
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut acc: Vec<(String, String, String)> = Vec::new();
    let mut finish = Vec::new();
    for c in sse_chunks(&text) {
        let ch = &c["choices"][0];
        let d = &ch["delta"];
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(d["content"].as_str().unwrap_or(""));
        for tc in d["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap() as usize;
            if acc.len() <= i {
                acc.resize(i + 1, Default::default());
            }
            if let Some(id) = tc["id"].as_str() {
                acc[i].0.push_str(id);
            }
            let f = &tc["function"];
            acc[i].1.push_str(f["name"].as_str().unwrap_or(""));
            acc[i].2.push_str(f["arguments"].as_str().unwrap_or(""));
        }
        if let Some(r) = ch["finish_reason"].as_str() {
            finish.push(r.to_string());
        }
    }
    assert_eq!(reasoning, "I should check the weather.");
    assert_eq!(content, "Let me look that up.");
    assert_eq!(acc.len(), 1, "{text}");
    assert!(acc[0].0.starts_with("call"));
    assert_eq!(acc[0].1, "get_weather");
    assert_eq!(acc[0].2, r#"{"city": "Paris", "days": 3}"#);
    assert_eq!(finish, ["tool_calls"]);

    // The call and the tool's result sent back: a valid turn that renders both.
    let round_trip = json!({
        "messages": [
            {"role": "user", "content": "Weather in Paris for 3 days?"},
            {"role": "assistant", "content": msg["content"], "tool_calls": [calls[0]]},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 C, sunny"},
        ],
        "tools": weather_tools(), "max_tokens": 200,
    });
    let (status, second) = post(&server, "/v1/chat/completions", round_trip.clone()).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["choices"][0]["message"]["role"], "assistant");
    assert!(
        second["usage"]["prompt_tokens"].as_u64() > v["usage"]["prompt_tokens"].as_u64(),
        "{second}"
    );
    let (_, t) = post(&server, "/tokenize", round_trip).await;
    let rendered = Tokenizer::from_dir(server.model_root().await)
        .unwrap()
        .decode(
            &serde_json::from_value::<Vec<u32>>(t["tokens"].clone()).unwrap(),
            false,
        );
    assert!(
        rendered.contains(&format!(
            "<{D}parameter name=\"days\" string=\"false\">3</{D}parameter>"
        )),
        "{rendered}"
    );
    assert!(rendered.contains("<tool_result>18 C, sunny</tool_result>"));

    // Without tools the same text is not parsed for calls: the markup stays content.
    let mut no_tools = req;
    no_tools.as_object_mut().unwrap().remove("tools");
    let (status, v) = post(&server, "/v1/chat/completions", no_tools).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["message"]["tool_calls"], json!([]));
    assert!(v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .contains("invoke name=\"get_weather\""));
    server.wait_idle().await;
}

/// Scripted reasoning with CJK and characters split across byte-level tokens.
const THINK_TEXT: &str = "<think>二加二等于四，对吧？🦀 𝄞</think>The answer is 4.";
const THINK_REASONING: &str = "二加二等于四，对吧？🦀 𝄞";

/// `<think>…</think>` output splits into `reasoning_content` and `content`, in thinking and in
/// chat mode, whole and streamed; logprobs carry each token's exact bytes (characters split
/// across tokens included); stop strings, stop token ids, `include_stop_str_in_output` and
/// `min_tokens` act on the scripted text exactly; a stop string counts as a stop in /metrics.
#[tokio::test]
async fn scripted_reasoning_splits_and_stops_exactly() {
    let server = Server::start(&["--debug-force-output", THINK_TEXT]);
    let user = json!([{"role": "user", "content": "What is 2 + 2?"}]);
    for effort in [None, Some("none"), Some("high")] {
        let mut req = json!({"messages": user, "max_tokens": 100});
        if let Some(e) = effort {
            req["reasoning_effort"] = json!(e);
        }
        let (status, v) = post(&server, "/v1/chat/completions", req.clone()).await;
        assert_eq!(status, 200, "{v}");
        let msg = &v["choices"][0]["message"];
        assert_eq!(msg["reasoning_content"], THINK_REASONING, "{effort:?}: {v}");
        assert_eq!(msg["content"], "The answer is 4.", "{effort:?}: {v}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");

        req["stream"] = json!(true);
        let (status, text) = post_text(&server, "/v1/chat/completions", req).await;
        assert_eq!(status, 200, "{text}");
        let (mut reasoning, mut content) = (String::new(), String::new());
        for c in sse_chunks(&text) {
            let d = &c["choices"][0]["delta"];
            reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
            content.push_str(d["content"].as_str().unwrap_or(""));
        }
        assert_eq!(reasoning, THINK_REASONING, "{effort:?}");
        assert_eq!(content, "The answer is 4.", "{effort:?}");
    }

    // Logprobs: `bytes` rebuild the text exactly, even where a token holds part of a
    // character; such a token's string escapes the partial bytes.
    let (status, v) = post(
        &server,
        "/v1/chat/completions",
        json!({"messages": user, "max_tokens": 100, "logprobs": true, "top_logprobs": 2}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let entries = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    let bytes_of = |e: &Value| -> Vec<u8> {
        e["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect()
    };
    let (last, body) = entries.split_last().unwrap();
    assert_eq!(last["token"], "<｜end▁of▁sentence｜>");
    let all: Vec<u8> = body.iter().flat_map(bytes_of).collect();
    assert_eq!(String::from_utf8(all).unwrap(), THINK_TEXT);
    let mut partial = 0;
    for e in entries {
        let b = bytes_of(e);
        let token = e["token"].as_str().unwrap();
        match std::str::from_utf8(&b) {
            Ok(s) => assert_eq!(token, s),
            Err(_) => {
                partial += 1;
                assert!(token.contains("\\x"), "{e}");
                assert!(!token.contains('\u{FFFD}'), "{e}");
            }
        }
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
    }
    assert!(partial >= 4, "the emoji and 𝄞 span several tokens: {v}");

    // Completions on the same script: a stop string, then the same with the stop included.
    // (Idle first: the chat request above is counted only after its response is sent.)
    let m0 = server.wait_idle().await;
    let stops = |m: &str| {
        metric(
            m,
            "deepinfer:request_success_total",
            &[("finished_reason", "stop")],
        )
        .unwrap_or(0.0)
    };
    let base = json!({"prompt": "hi", "max_tokens": 1000, "ignore_eos": true});
    let with = |extra: Value| {
        let mut b = base.clone();
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let before_answer = THINK_TEXT.split("answer").next().unwrap();
    for (extra, text, reason) in [
        (
            json!({"stop": ["answer"]}),
            before_answer.to_string(),
            json!("answer"),
        ),
        (
            json!({"stop": ["answer"], "include_stop_str_in_output": true}),
            format!("{before_answer}answer"),
            json!("answer"),
        ),
    ] {
        for stream in [false, true] {
            let mut req = with(extra.clone());
            req["stream"] = json!(stream);
            let (status, body) = post_text(&server, "/v1/completions", req.clone()).await;
            assert_eq!(status, 200, "{body}");
            let (got, finish, stop_reason) = completion_of(&body, stream);
            assert_eq!(got, text, "{req}");
            assert_eq!(finish, "stop");
            assert_eq!(stop_reason, reason);
        }
    }
    // Four requests ended by a stop string: counted as stops, none as an abort.
    let m = server.wait_idle().await;
    assert_eq!(stops(&m) - stops(&m0), 4.0, "{m}");
    assert_eq!(
        metric(
            &m,
            "deepinfer:request_success_total",
            &[("finished_reason", "abort")]
        ),
        None,
        "{m}"
    );

    // A stop token id: its text is left out unless include_stop_str_in_output.
    let (_, t) = post(
        &server,
        "/tokenize",
        json!({"prompt": " answer", "add_special_tokens": false}),
    )
    .await;
    let answer_id = t["tokens"][0].as_u64().unwrap();
    assert_eq!(t["count"], 1, "{t}");
    let (_, all) = post(
        &server,
        "/tokenize",
        json!({"prompt": THINK_TEXT, "add_special_tokens": false}),
    )
    .await;
    let script_len = all["count"].as_u64().unwrap();
    let at = all["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .position(|x| x.as_u64() == Some(answer_id))
        .unwrap() as u64;
    let before = THINK_TEXT.split(" answer").next().unwrap();
    for (include, text) in [
        (false, before.to_string()),
        (true, format!("{before} answer")),
    ] {
        let req =
            with(json!({"stop_token_ids": [answer_id], "include_stop_str_in_output": include}));
        let (status, v) = post(&server, "/v1/completions", req).await;
        assert_eq!(status, 200, "{v}");
        let c = &v["choices"][0];
        assert_eq!(c["text"], text.as_str(), "{v}");
        assert_eq!(c["finish_reason"], "stop");
        assert_eq!(c["stop_reason"], answer_id);
        assert_eq!(v["usage"]["completion_tokens"], at + 1);
    }

    // EOS after the script ends the request; min_tokens holds it back to exactly that many.
    for (min_tokens, want) in [(0, script_len + 1), (script_len + 7, script_len + 7)] {
        let (status, v) = post(
            &server,
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 100, "min_tokens": min_tokens}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["text"], THINK_TEXT);
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            v["usage"]["completion_tokens"], want,
            "min_tokens {min_tokens}"
        );
    }
    server.wait_idle().await;
}

/// The text, finish reason and stop reason of choice 0 of a completions body.
fn completion_of(body: &str, stream: bool) -> (String, Value, Value) {
    if stream {
        let chunks = sse_chunks(body);
        let got = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["text"].as_str())
            .collect();
        let last = &chunks.last().unwrap()["choices"][0];
        (
            got,
            last["finish_reason"].clone(),
            last["stop_reason"].clone(),
        )
    } else {
        let v: Value = serde_json::from_str(body).unwrap();
        let c = &v["choices"][0];
        (
            c["text"].as_str().unwrap().to_string(),
            c["finish_reason"].clone(),
            c["stop_reason"].clone(),
        )
    }
}

/// Sampling controls change what the model writes, as the API promises: a seed reproduces
/// sampled text (another seed does not), `logit_bias` moves greedy output, `echo` prepends
/// the prompt, `stop_token_ids` end the choice (held back by `min_tokens`),
/// `max_completion_tokens` wins over `max_tokens`; the latency histograms fill up.
#[tokio::test]
async fn sampling_controls_change_the_output() {
    let server = Server::start(&[]);
    let root = server.model_root().await;
    let tok = Tokenizer::from_dir(&root).unwrap();
    let p = prompts()[0].clone();
    let text_of = |v: &Value| v["choices"][0]["text"].as_str().unwrap().to_string();

    // seed
    let sampled = |seed: u64| json!({"prompt": p, "max_tokens": 12, "temperature": 1.0, "seed": seed, "ignore_eos": true});
    let (_, a) = post(&server, "/v1/completions", sampled(7)).await;
    let (_, b) = post(&server, "/v1/completions", sampled(7)).await;
    let (_, c) = post(&server, "/v1/completions", sampled(8)).await;
    assert_eq!(text_of(&a), text_of(&b), "the same seed, the same text");
    assert_ne!(text_of(&a), text_of(&c), "another seed, another text");
    let mut streamed = sampled(7);
    streamed["stream"] = json!(true);
    let (_, body) = post_text(&server, "/v1/completions", streamed).await;
    assert_eq!(completion_of(&body, true).0, text_of(&a));

    // logit_bias
    let greedy = json!({"prompt": p, "max_tokens": 5, "temperature": 0, "ignore_eos": true});
    let (_, plain) = post(&server, "/v1/completions", greedy.clone()).await;
    let mut biased = greedy.clone();
    biased["logit_bias"] = json!({"1000": 100});
    let (status, v) = post(&server, "/v1/completions", biased).await;
    assert_eq!(status, 200, "{v}");
    let forced = tok.decode(&[1000; 5], true);
    assert_eq!(text_of(&v), forced);
    assert_ne!(text_of(&plain), forced);

    // echo, whole and streamed
    let echo = json!({"prompt": "Hello there", "max_tokens": 4, "temperature": 0,
                      "ignore_eos": true});
    let (_, noecho) = post(&server, "/v1/completions", echo.clone()).await;
    let mut req = echo.clone();
    req["echo"] = json!(true);
    let (status, v) = post(&server, "/v1/completions", req.clone()).await;
    assert_eq!(status, 200, "{v}");
    let want = format!("Hello there{}", text_of(&noecho));
    assert_eq!(text_of(&v), want);
    req["stream"] = json!(true);
    let (_, body) = post_text(&server, "/v1/completions", req).await;
    assert_eq!(completion_of(&body, true).0, want);

    // stop_token_ids, and min_tokens holding them back
    let ids = &engine_greedy(&root, std::slice::from_ref(&p), 8)[0];
    let first = ids[0];
    let mut req = json!({"prompt": p, "max_tokens": 8, "temperature": 0,
                         "stop_token_ids": [first]});
    let (status, v) = post(&server, "/v1/completions", req.clone()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["stop_reason"], first);
    assert_eq!(v["choices"][0]["text"], "");
    assert_eq!(v["usage"]["completion_tokens"], 1);
    req["min_tokens"] = json!(3);
    let (status, v) = post(&server, "/v1/completions", req).await;
    assert_eq!(status, 200, "{v}");
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap() >= 3,
        "{v}"
    );

    // max_completion_tokens wins over max_tokens
    let (status, v) = post(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10,
               "max_completion_tokens": 3, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    let m = server.wait_idle().await;
    for h in [
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_time_per_output_token_seconds",
    ] {
        let count = metric(&m, &format!("deepinfer:{h}_count"), &[]).unwrap_or(0.0);
        assert!(count > 0.0, "{h}_count is {count}:\n{m}");
    }
}

/// Chat with `n > 1`, streamed: every choice starts with its role, carries the whole greedy
/// answer and finishes exactly once.
#[tokio::test]
async fn chat_n_choices_stream_each_complete() {
    let server = Server::start(&[]);
    let req = json!({"messages": [{"role": "user", "content": "Count to three."}],
                     "max_tokens": 6, "temperature": 0, "ignore_eos": true,
                     "reasoning_effort": "none"});
    let (status, whole) = post(&server, "/v1/chat/completions", req.clone()).await;
    assert_eq!(status, 200, "{whole}");
    let want = whole["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let mut streamed = req;
    streamed["n"] = json!(3);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, text) = post_text(&server, "/v1/chat/completions", streamed).await;
    assert_eq!(status, 200, "{text}");
    let chunks = sse_chunks(&text);
    let mut content = vec![String::new(); 3];
    let mut roles = vec![0; 3];
    let mut finish: Vec<Vec<String>> = vec![Vec::new(); 3];
    for c in &chunks {
        for ch in c["choices"].as_array().unwrap() {
            let i = ch["index"].as_u64().unwrap() as usize;
            assert!(finish[i].is_empty(), "a delta after the finish: {c}");
            if ch["delta"]["role"] == "assistant" {
                assert!(content[i].is_empty(), "the role comes first: {c}");
                roles[i] += 1;
            }
            content[i].push_str(ch["delta"]["content"].as_str().unwrap_or(""));
            if let Some(r) = ch["finish_reason"].as_str() {
                finish[i].push(r.to_string());
            }
        }
    }
    assert_eq!(roles, [1, 1, 1]);
    assert_eq!(content, vec![want; 3]);
    assert_eq!(finish, vec![vec!["length".to_string()]; 3]);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 18);
    server.wait_idle().await;
}

/// Ctrl-C drains for at most --shutdown-timeout-secs: a generation still running then is
/// aborted (its stream ends with finish_reason "abort") and the process exits cleanly.
#[tokio::test]
async fn ctrl_c_aborts_what_is_left_after_the_drain_deadline() {
    let server = Server::start(&["--shutdown-timeout-secs", "1"]);
    let mut r = reqwest::Client::new()
        .post(server.url("/v1/completions"))
        .json(
            &json!({"prompt": [5, 6, 7], "max_tokens": 60000, "ignore_eos": true, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    let mut events = SseEvents::default();
    let mut body: String = events.push(&r.chunk().await.unwrap().unwrap()).concat();
    let sent = Instant::now();
    server.interrupt();
    let waiter = tokio::task::spawn_blocking(move || server.wait_exit(Duration::from_secs(20)));
    while let Some(c) = r.chunk().await.unwrap() {
        body.extend(events.push(&c));
    }
    assert!(events.rest().is_empty());
    let chunks = sse_chunks(&body);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "abort"
    );
    let status = waiter.await.unwrap();
    assert!(status.success(), "{status:?}");
    let took = sent.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "exited before the drain deadline: {took:?}"
    );
}

/// A second Ctrl-C aborts at once, whatever the drain deadline.
#[tokio::test]
async fn a_second_ctrl_c_aborts_at_once() {
    let server = Server::start(&[]);
    let mut r = reqwest::Client::new()
        .post(server.url("/v1/completions"))
        .json(
            &json!({"prompt": [5, 6, 7], "max_tokens": 60000, "ignore_eos": true, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    let mut events = SseEvents::default();
    let mut body: String = events.push(&r.chunk().await.unwrap().unwrap()).concat();
    server.interrupt();
    // Let the first signal start the drain before the second arrives.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.interrupt();
    let waiter = tokio::task::spawn_blocking(move || server.wait_exit(Duration::from_secs(10)));
    while let Some(c) = r.chunk().await.unwrap() {
        body.extend(events.push(&c));
    }
    assert!(events.rest().is_empty());
    let chunks = sse_chunks(&body);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "abort"
    );
    let status = waiter.await.unwrap();
    assert!(status.success(), "{status:?}");
}

/// `serve --speculative-config`: the default model drafts with its MTP block; greedy text
/// equals the engine's plain greedy text, and /metrics counts the verify rounds under
/// vLLM's names.
#[tokio::test]
async fn speculative_serving_keeps_greedy_text_and_reports_its_counters() {
    let spec = r#"{"method": "mtp", "num_speculative_tokens": 2, "adaptive": false}"#;
    let server = Server::start(&["--speculative-config", spec]);
    let reference = engine_greedy_text(&server.model_root().await, &prompts(), 12);
    let body = json!({"prompt": prompts(), "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    let (status, v) = post(&server, "/v1/completions", body).await;
    assert_eq!(status, 200, "{v}");
    for (i, want) in reference.iter().enumerate() {
        assert_eq!(v["choices"][i]["text"].as_str().unwrap(), want);
    }
    assert_eq!(v["usage"]["completion_tokens"], 24);
    let m = server.wait_idle().await;
    let drafts = metric(&m, "deepinfer:spec_decode_num_drafts_total", &[]).unwrap_or(0.0);
    let tokens = metric(&m, "deepinfer:spec_decode_num_draft_tokens_total", &[]).unwrap_or(0.0);
    assert!(drafts > 0.0 && tokens >= drafts, "{m}");
    assert!(
        metric(&m, "deepinfer:spec_decode_num_accepted_tokens_total", &[]).is_some(),
        "{m}"
    );
}

#[tokio::test]
async fn a_repeated_prompt_is_served_from_the_prefix_cache_with_the_same_text() {
    // 300 tokens: two whole blocks of the default 128 can be reused.
    let prompt: Vec<u32> = (0..300).map(|i| 500 + 17 * i).collect();
    let body = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let server = Server::start(&[]);
    let reference =
        engine_greedy_text(&server.model_root().await, std::slice::from_ref(&prompt), 8);
    let (status, first) = post(&server, "/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{first}");
    let (_, second) = post(&server, "/v1/completions", body.clone()).await;
    for v in [&first, &second] {
        assert_eq!(v["choices"][0]["text"].as_str().unwrap(), reference[0]);
    }
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"],
        256
    );
    let m = server.wait_idle().await;
    assert_eq!(
        metric(&m, "deepinfer:prefix_cache_hits_total", &[]),
        Some(256.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "deepinfer:prefix_cache_queries_total", &[]),
        Some(600.0),
        "{m}"
    );

    let off = Server::start(&["--no-enable-prefix-caching"]);
    for _ in 0..2 {
        let (_, v) = post(&off, "/v1/completions", body.clone()).await;
        assert_eq!(v["choices"][0]["text"].as_str().unwrap(), reference[0]);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    }
    let m = off.wait_idle().await;
    assert_eq!(
        metric(&m, "deepinfer:prefix_cache_hits_total", &[]),
        Some(0.0),
        "{m}"
    );
}

/// A DeepSeek-V4.1 checkpoint serves like any other: greedy completions of two golden
/// prompts are the text of our reference's greedy tokens (tools/make_v41_golden.py).
#[tokio::test]
async fn a_v41_checkpoint_serves_its_reference_greedy_tokens() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/golden/tiny-v41-a");
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let model = dir.join("official");
    let server = Server::start(&["--model", model.to_str().unwrap()]);
    for p in meta["prompts"].as_array().unwrap().iter().take(2) {
        let body = json!({
            "prompt": p["ids"], "max_tokens": 16, "temperature": 0, "ignore_eos": true,
        });
        let (status, v) = post(&server, "/v1/completions", body).await;
        assert_eq!(status, 200, "{v}");
        let (status, want) = post(&server, "/detokenize", json!({"tokens": p["greedy"]})).await;
        assert_eq!(status, 200, "{want}");
        assert_eq!(
            v["choices"][0]["text"], want["prompt"],
            "prompt {}",
            p["index"]
        );
    }
    server.wait_idle().await;
}
