//! Bounded cost through the real server (issue 18): no request, connection or client may
//! take more than its share. Each test sends what an attacker would and checks that the
//! server answers quickly, refuses clearly, keeps its memory, and frees what it holds.

mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::{metric, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

async fn post(server: &Server, path: &str, body: &Value, key: Option<&str>) -> (u16, Value, f64) {
    post_bytes(server, path, serde_json::to_vec(body).unwrap(), key).await
}

async fn post_bytes(
    server: &Server,
    path: &str,
    body: Vec<u8>,
    key: Option<&str>,
) -> (u16, Value, f64) {
    let t = Instant::now();
    let mut req = reqwest::Client::new()
        .post(server.url(path))
        .header("content-type", "application/json")
        .body(body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let r = req.send().await.expect("request sent");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, v, t.elapsed().as_secs_f64())
}

fn aborted(m: &str) -> f64 {
    metric(
        m,
        "deepinfer:request_success_total",
        &[("finished_reason", "abort")],
    )
    .unwrap_or(0.0)
}

/// A response for a failure message: its first 300 characters.
fn short(v: &Value) -> String {
    v.to_string().chars().take(300).collect()
}

/// The server's peak resident memory so far (VmHWM), in MiB.
fn peak_rss_mib(server: &Server) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / 1024.0
}

/// Item 1: the stop list is bounded, and a request at the bounds costs little.
#[tokio::test]
async fn stop_strings_are_bounded_and_share_one_matcher() {
    let server = Server::start(&[]);
    // The issue's request: 100 000 stop strings, 128 choices.
    let many: Vec<String> = (0..100_000).map(|i| format!("stop-{i:06}")).collect();
    let body = json!({"prompt": "Hi", "n": 128, "max_tokens": 64, "stop": many});
    let (status, v, secs) = post(&server, "/v1/completions", &body, None).await;
    assert_eq!(status, 400, "{}", short(&v));
    assert_eq!(v["error"]["param"], "stop");
    assert!(secs < 5.0, "refusing took {secs:.1} s");
    let long = "x".repeat(513);
    let (status, v, _) = post(
        &server,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 4, "stop": [long]}),
        None,
    )
    .await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("stop")),
        "{}",
        short(&v)
    );
    // At the bounds: 64 strings of 512 bytes for 64 choices is served.
    let stops: Vec<String> = (0..64)
        .map(|i| format!("{i:02}{}", "y".repeat(510)))
        .collect();
    let body = json!({"prompt": "Hi", "n": 64, "max_tokens": 16, "stop": stops,
                      "stream": true, "temperature": 1.0});
    let (status, v, secs) = post(&server, "/v1/completions", &body, None).await;
    assert_eq!(status, 200, "{}", short(&v));
    assert!(secs < 60.0, "took {secs:.1} s");
    server.wait_idle().await;
}

/// Item 2: prompts are measured before they are tokenized or decoded.
#[tokio::test]
async fn oversized_prompts_are_refused_before_tokenizing() {
    let server = Server::start(&[]);
    let text = "hello world ".repeat((30 << 20) / 12);
    let (status, v, secs) = post(&server, "/tokenize", &json!({"prompt": text}), None).await;
    assert_eq!(status, 400, "{}", short(&v));
    assert_eq!(v["error"]["param"], "prompt");
    assert!(secs < 5.0, "refusing a 30 MiB prompt took {secs:.1} s");
    let (status, v, secs) = post(
        &server,
        "/v1/completions",
        &json!({"prompt": text, "max_tokens": 1}),
        None,
    )
    .await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("prompt")),
        "{}",
        short(&v)
    );
    assert!(secs < 5.0, "took {secs:.1} s");
    drop(text);
    // A 30 MiB token-id prompt: refused by its length, without decoding it.
    let mut ids = b"{\"max_tokens\": 1, \"prompt\": [1".to_vec();
    while ids.len() < 30 << 20 {
        ids.extend_from_slice(b",1");
    }
    ids.extend_from_slice(b"]}");
    let (status, v, secs) = post_bytes(&server, "/v1/completions", ids, None).await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("prompt")),
        "{}",
        short(&v)
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length"),
        "{}",
        short(&v)
    );
    assert!(secs < 5.0, "took {secs:.1} s");
    let peak = peak_rss_mib(&server);
    assert!(peak < 1500.0, "peak RSS {peak:.0} MiB");
    // Detokenizing is bounded by the context as well.
    let ids: Vec<u32> = vec![1; 70_000];
    let (status, v, _) = post(&server, "/detokenize", &json!({"tokens": ids}), None).await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("tokens")),
        "{}",
        short(&v)
    );
}

/// Item 2: `--api-key` guards the tokenizer routes too, as in vLLM.
#[tokio::test]
async fn the_api_key_guards_the_tokenizer_routes() {
    let server = Server::start(&["--api-key", "sesame"]);
    for (path, body) in [
        ("/tokenize", json!({"prompt": "Hello"})),
        ("/detokenize", json!({"tokens": [1, 2, 3]})),
    ] {
        let (status, v, _) = post(&server, path, &body, None).await;
        assert_eq!(status, 401, "{path}: {}", short(&v));
        let (status, _, _) = post(&server, path, &body, Some("wrong")).await;
        assert_eq!(status, 401, "{path}");
        let (status, v, _) = post(&server, path, &body, Some("sesame")).await;
        assert_eq!(status, 200, "{path}: {}", short(&v));
    }
    let r = reqwest::get(server.url("/health")).await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "/health stays open");
}

/// Item 3: `logit_bias` keys are token ids: "5" and "0005" are one entry (the later wins),
/// and the map is bounded however the body spells it.
#[tokio::test]
async fn logit_bias_is_one_entry_per_token_and_bounded() {
    let server = Server::start(&[]);
    let complete = |bias: Value| {
        json!({"prompt": [100, 2000, 30000], "max_tokens": 6, "temperature": 0,
               "logit_bias": bias})
    };
    let (status, plain, _) = post(
        &server,
        "/v1/completions",
        &complete(json!({"5": 100})),
        None,
    )
    .await;
    assert_eq!(status, 200, "{}", short(&plain));
    // Written out by hand: the key order matters, and a JSON map would sort it.
    let merged_body = br#"{"prompt": [100, 2000, 30000], "max_tokens": 6, "temperature": 0,
                           "logit_bias": {"5": -100, "0005": 100}}"#;
    let (status, merged, _) =
        post_bytes(&server, "/v1/completions", merged_body.to_vec(), None).await;
    assert_eq!(status, 200, "{}", short(&merged));
    assert_eq!(merged["choices"][0]["text"], plain["choices"][0]["text"]);
    let too_many: serde_json::Map<String, Value> =
        (0..1025).map(|i| (i.to_string(), json!(1))).collect();
    let (status, v, _) = post(
        &server,
        "/v1/completions",
        &complete(Value::Object(too_many)),
        None,
    )
    .await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("logit_bias")),
        "{}",
        short(&v)
    );
    // Thousands of spellings of one id, for 128 choices: one entry, shared.
    let mut body = br#"{"prompt": [1, 2, 3], "n": 128, "max_tokens": 2, "logit_bias": {"#.to_vec();
    for zeros in 0..4000 {
        if zeros > 0 {
            body.push(b',');
        }
        body.extend_from_slice(format!("\"{}7\": 1", "0".repeat(zeros)).as_bytes());
    }
    body.extend_from_slice(b"}}");
    let (status, v, secs) = post_bytes(&server, "/v1/completions", body, None).await;
    assert_eq!(status, 200, "{}", short(&v));
    assert!(secs < 30.0, "took {secs:.1} s");
}

/// Item 4: a client that never reads its stream does not make the server buffer it: the
/// sequence pauses once a few deltas wait unread, and the write timeout then drops the
/// connection, which aborts the request and frees its cache.
#[tokio::test]
async fn a_client_that_never_reads_pauses_then_is_dropped() {
    let server = Server::start(&["--write-timeout-secs", "3"]);
    let n = 8;
    let max_tokens = 60_000;
    let body = serde_json::to_vec(&json!({
        "prompt": [5, 6, 7], "n": n, "max_tokens": max_tokens, "ignore_eos": true,
        "stream": true, "logprobs": 20
    }))
    .unwrap();
    let addr = server.base.trim_start_matches("http://").parse().unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body).await.unwrap();
    let mut status = [0u8; 12];
    stream.read_exact(&mut status).await.unwrap();
    assert_eq!(&status, b"HTTP/1.1 200");
    let before = aborted(&server.metrics().await);
    let rss_start = peak_rss_mib(&server);
    // Never read: the socket buffers fill, the choices' deltas wait, the sequences pause,
    // and three seconds later the server gives up on the client.
    server
        .wait_metrics(
            Duration::from_secs(240),
            "the stalled request's abort",
            |m| aborted(m) >= before + n as f64,
        )
        .await;
    let m = server.metrics().await;
    let generated = metric(&m, "deepinfer:generation_tokens_total", &[]).unwrap();
    assert!(
        generated < (n * max_tokens) as f64 / 10.0,
        "generated {generated} tokens for a client that read none"
    );
    server.wait_idle().await;
    let grew = peak_rss_mib(&server) - rss_start;
    assert!(grew < 256.0, "peak RSS grew by {grew:.0} MiB");
    // The server still serves.
    let r = reqwest::get(server.url("/health")).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    drop(stream);
}

/// Reads from `stream` until it closes or `within` passes; returns what arrived and whether
/// it closed.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&got).into(), false),
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into(), true),
            Ok(Ok(k)) => got.extend_from_slice(&buf[..k]),
        }
    }
}

/// Item 5: idle and half-sent connections time out, a body over the limit is refused by
/// its declared length, and the connection cap holds.
#[tokio::test]
async fn connections_have_timeouts_a_cap_and_early_413() {
    let server = Server::start(&[
        "--header-read-timeout-secs",
        "1",
        "--body-read-timeout-secs",
        "1",
        "--max-connections",
        "8",
        "--max-request-body-mib",
        "1",
    ]);
    let addr = server.base.trim_start_matches("http://").to_string();
    // A connection that sends nothing, and one that stops mid-header, are closed.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    let mut partial = TcpStream::connect(&addr).await.unwrap();
    partial
        .write_all(b"GET /health HTTP/1.1\r\nHo")
        .await
        .unwrap();
    for (what, s) in [("idle", &mut idle), ("partial", &mut partial)] {
        let (_, closed) = read_until_closed(s, Duration::from_secs(5)).await;
        assert!(closed, "the {what} connection stayed open");
    }
    // A body that stops arriving gets 408.
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    slow.write_all(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
        .await
        .unwrap();
    let (got, _) = read_until_closed(&mut slow, Duration::from_secs(5)).await;
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    // A declared length over the limit gets 413 before a byte of the body is sent.
    let mut big = TcpStream::connect(&addr).await.unwrap();
    let t = Instant::now();
    big.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 1073741824\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = [0u8; 64];
    let k = tokio::time::timeout(Duration::from_secs(5), big.read(&mut buf))
        .await
        .expect("answered without the body")
        .unwrap();
    assert!(buf[..k].starts_with(b"HTTP/1.1 413"), "{:?}", &buf[..k]);
    assert!(t.elapsed() < Duration::from_secs(2));
    drop(big);
    // Eight idle connections fill the cap: the ninth waits until the header timeout frees
    // a place, then is served.
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(TcpStream::connect(&addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let r = reqwest::get(server.url("/health")).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let waited = t.elapsed();
    assert!(
        waited > Duration::from_millis(400) && waited < Duration::from_secs(5),
        "/health waited {waited:?} behind 8 idle connections"
    );
}

/// Item 6: on shutdown, connections with no request in flight close at once; a request in
/// flight still finishes.
#[tokio::test]
async fn shutdown_closes_idle_connections_at_once() {
    let server = Server::start(&["--shutdown-timeout-secs", "60"]);
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut partial = Vec::new();
    for _ in 0..5 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nHo").await.unwrap();
        partial.push(s);
    }
    let mut r = reqwest::Client::new()
        .post(server.url("/v1/completions"))
        .json(&json!({"prompt": [5, 6, 7], "max_tokens": 24, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .unwrap();
    let first = r.chunk().await.unwrap().unwrap();
    let mut body = String::from_utf8_lossy(&first).to_string();
    let t = Instant::now();
    let waiter = tokio::task::spawn_blocking(move || {
        server.interrupt();
        server.wait_exit(Duration::from_secs(20))
    });
    while let Some(c) = r.chunk().await.unwrap() {
        body.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(body.contains("\"finish_reason\":\"length\""), "{body}");
    let status = waiter.await.unwrap();
    assert!(status.success(), "{status:?}");
    let secs = t.elapsed().as_secs_f64();
    assert!(
        secs < 10.0,
        "the half-open connections held the exit for {secs:.1} s"
    );
    for mut s in partial {
        let (_, closed) = read_until_closed(&mut s, Duration::from_secs(1)).await;
        assert!(closed);
    }
}

/// Item 9: without `--max-model-len`, serve takes the longest context the cache holds
/// instead of refusing to start with the model's whole context.
#[tokio::test]
async fn serve_takes_the_context_the_cache_holds() {
    let server = Server::start(&["--cache-budget-mib", "16"]);
    let v: Value = reqwest::get(server.url("/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let len = v["data"][0]["max_model_len"].as_u64().unwrap();
    assert!(len > 1000 && len < 65536, "max_model_len {len}");
    let (status, v, _) = post(
        &server,
        "/v1/completions",
        &json!({"prompt": [5, 6, 7], "max_tokens": len}),
        None,
    )
    .await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("max_tokens")),
        "{}",
        short(&v)
    );
}
