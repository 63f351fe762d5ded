//! `deepinfer serve` end to end: a real HTTP client against the running binary. Greedy
//! output must equal the engine's own (`deepinfer generate`), errors must be OpenAI's JSON,
//! and a client that goes away must free its cache.

mod support;

use deepinfer_server::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::{engine_greedy, metric, sse_chunks, Server};

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

async fn model_root(server: &Server) -> String {
    let v: Value = reqwest::get(server.url("/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["data"][0]["root"].as_str().unwrap().to_string()
}

async fn metrics(server: &Server) -> String {
    reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Waits until no request runs or waits and every cache pool is empty.
async fn wait_idle(server: &Server) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = metrics(server).await;
        let busy = metric(&m, "deepinfer:num_requests_running", &[]) != Some(0.0)
            || metric(&m, "deepinfer:num_requests_waiting", &[]) != Some(0.0)
            || ["state_slots", "csa_entries", "hca_entries", "indexer_keys"]
                .iter()
                .any(|p| metric(&m, "deepinfer:kv_cache_usage_perc", &[("pool", p)]) != Some(0.0));
        if !busy {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not go idle:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let root = model_root(&server).await;
    let tok = Tokenizer::from_dir(&root).unwrap();
    let reference: Vec<String> = engine_greedy(&root, &prompts(), 12)
        .iter()
        .map(|ids| tok.decode(ids, true))
        .collect();

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
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": 24, "total_tokens": prompt_tokens + 24})
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
    wait_idle(&server).await;
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
    wait_idle(&server).await;
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
    wait_idle(&server).await;
}

#[tokio::test]
async fn api_key_guards_v1_routes_only() {
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
    let m = metrics(&server).await;
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
    let m = wait_idle(&server).await;
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
    wait_idle(&server).await;
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
    let root = model_root(&server).await;
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
    let mut body = String::from_utf8_lossy(&r.chunk().await.unwrap().unwrap()).into_owned();
    let waiter = tokio::task::spawn_blocking(move || server.interrupt_and_wait());
    while let Some(c) = r.chunk().await.unwrap() {
        body.push_str(&String::from_utf8_lossy(&c));
    }
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
    use deepinfer_server::chat::parse_chat_output;
    let server = Server::start(&[]);
    let root = model_root(&server).await;
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
        let want = parse_chat_output(&tok.decode(out, true), thinking, false);

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
    wait_idle(&server).await;
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
    let text = Tokenizer::from_dir(model_root(&server).await)
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
            json!({"messages": user, "tool_choice": "required", "tools": tools}),
            "tool_choice",
            "not supported",
        ),
        (
            json!({"messages": user, "top_logprobs": 2}),
            "top_logprobs",
            "logprobs",
        ),
        (
            json!({"messages": user, "response_format": {"type": "json_object"}}),
            "response_format",
            "text",
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
    wait_idle(&server).await;
}
