//! A bounded, seeded fuzz of request handling: the real router (body limits, parsing,
//! validation, prompt bounds, tokenizing, admission) in front of a real engine on the small
//! synthetic model, fed valid requests mutated at the JSON and at the byte level. Every
//! answer must be a success or an error of the expected kinds in its API's shape (OpenAI's,
//! or Anthropic's on `/v1/messages*`), never a 500 or a
//! panic, each within a time bound; afterwards the engine is idle with every cache freed.
//!
//! `DEEPINFER_FUZZ_CASES` sets the number of cases (default 1000) and `DEEPINFER_FUZZ_SEED`
//! the seed (default 18), so a longer run is one environment variable away.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use deepinfer_engine::cache::{CacheBudget, CacheConfig};
use deepinfer_engine::engine::{self, EngineConfig};
use deepinfer_engine::scheduler::SchedulerConfig;
use deepinfer_engine::scripted::ScriptedOutput;
use deepinfer_model::synth::{preset, write_checkpoint};
use deepinfer_model::v4::Model;
use deepinfer_server::body::BodyLimits;
use deepinfer_server::tokenizer::Tokenizer;
use deepinfer_server::{router, AppState};
use http_body_util::BodyExt;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha12Rng;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

/// A seeded generator (the workspace's ChaCha), so a failing case can be replayed.
struct Rng(ChaCha12Rng);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(ChaCha12Rng::seed_from_u64(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.random()
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.random_range(0..n.max(1))
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Valid requests of every route: what mutations start from.
fn seeds() -> Vec<(&'static str, Value)> {
    vec![
        (
            "/v1/completions",
            json!({"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0}),
        ),
        (
            "/v1/completions",
            json!({"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 2, "n": 2, "stream": true,
                   "stop": ["\n", "END"], "logprobs": 2, "echo": true,
                   "logit_bias": {"5": 1.5}, "seed": 7}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hello!"}],
                   "max_tokens": 3, "stream": true,
                   "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Weather?"}],
                   "tools": [{"type": "function", "function": {"name": "get_weather",
                     "parameters": {"type": "object",
                                    "properties": {"city": {"type": "string"}}}}}],
                   "reasoning_effort": "high", "logprobs": true, "top_logprobs": 3,
                   "max_completion_tokens": 2, "stop_token_ids": [1, 2]}),
        ),
        (
            "/tokenize",
            json!({"prompt": "Hello world", "return_token_strs": true}),
        ),
        (
            "/tokenize",
            json!({"messages": [{"role": "user", "content": "Hi"}]}),
        ),
        ("/detokenize", json!({"tokens": [100, 2000, 30000]})),
        (
            "/v1/messages",
            json!({"system": [{"type": "text", "text": "Be brief."}],
                   "messages": [{"role": "user", "content": "Weather?"},
                                {"role": "assistant", "content": [
                                    {"type": "thinking", "thinking": "Look.", "signature": "s"},
                                    {"type": "tool_use", "id": "t1", "name": "get_weather",
                                     "input": {"city": "Paris"}}]},
                                {"role": "user", "content": [
                                    {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"},
                                    {"type": "text", "text": "And tomorrow?"}]}],
                   "tools": [{"name": "get_weather", "input_schema": {"type": "object",
                     "properties": {"city": {"type": "string"}}}}],
                   "thinking": {"type": "enabled", "budget_tokens": 1024},
                   "max_tokens": 3, "stream": true, "stop_sequences": ["\n"]}),
        ),
        (
            "/v1/responses",
            json!({"instructions": "Be brief.", "reasoning": {"effort": "low"},
                   "input": [{"type": "message", "role": "user",
                              "content": [{"type": "input_text", "text": "Weather?"}]},
                             {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Look."}]},
                             {"type": "function_call", "call_id": "c1", "name": "get_weather",
                              "arguments": "{\"city\": \"Paris\"}"},
                             {"type": "function_call_output", "call_id": "c1", "output": "Sunny"}],
                   "tools": [{"type": "function", "name": "get_weather",
                              "parameters": {"type": "object"}},
                             {"type": "namespace", "name": "ns", "tools": [
                                 {"type": "function", "name": "f"}]}],
                   "max_output_tokens": 3, "stream": true, "store": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "JSON please"}],
                   "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                       "schema": {"type": "object", "properties": {"a": {"type": "integer"},
                                  "b": {"enum": ["x", "y"]}}, "required": ["a"]}}},
                   "chat_template_kwargs": {"thinking": false}, "max_tokens": 3}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "Code:", "max_tokens": 3, "n": 2,
                   "structured_outputs": {"regex": "[a-z]{2,5}[0-9]?"}}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Weather?"}], "tool_choice": "required",
                   "tools": [{"type": "function", "function": {"name": "get_weather",
                     "parameters": {"type": "object",
                                    "properties": {"city": {"type": "string"}}}}}],
                   "max_tokens": 3}),
        ),
        (
            "/v1/messages/count_tokens",
            json!({"system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}],
                   "tool_choice": {"type": "auto"}}),
        ),
    ]
}

/// Values a mutation puts in place of another.
fn random_value(rng: &mut Rng) -> Value {
    match rng.below(16) {
        0 => Value::Null,
        1 => json!(rng.below(2) == 0),
        2 => json!(*rng.pick(&[0i64, 1, -1, 2, 128, 129, 4096, 65535, i64::MAX, i64::MIN])),
        3 => json!(*rng.pick(&[0.5f64, -0.0, 1e308, -1e308, 1e-310, 100.0, 2.5])),
        4 => json!(u64::MAX),
        5 => json!(""),
        6 => json!("x".repeat(rng.below(100_000))),
        7 => json!(*rng.pick(&[
            "<｜User｜>",
            "</think>",
            "é\u{0}\u{FFFD}",
            "🦀",
            "\\\"",
            "auto"
        ])),
        8 => json!([]),
        9 => Value::Array(
            (0..rng.below(200_000))
                .map(|i| json!(i % 130_000))
                .collect(),
        ),
        10 => Value::Array(
            (0..rng.below(300))
                .map(|i| json!(format!("s{i}")))
                .collect(),
        ),
        11 => json!({}),
        12 => {
            let keys = rng.below(3000);
            let zeros = rng.below(20);
            Value::Object(
                (0..keys)
                    .map(|i| (format!("{}{}", "0".repeat(zeros), i % 2000), json!(1.0)))
                    .collect(),
            )
        }
        13 => {
            let mut v = json!(1);
            for _ in 0..rng.below(200) {
                v = json!([v]);
            }
            v
        }
        14 => json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
        _ => json!({"role": "tool", "content": null, "tool_calls": "x"}),
    }
}

/// Field names worth aiming at: the ones the routes read.
const FIELDS: &[&str] = &[
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "best_of",
    "stream",
    "stream_options",
    "stop",
    "stop_token_ids",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "echo",
    "suffix",
    "tools",
    "tool_choice",
    "reasoning_effort",
    "chat_template_kwargs",
    "response_format",
    "guided_json",
    "guided_choice",
    "structured_outputs",
    "tokens",
    "model",
    "add_special_tokens",
    "skip_special_tokens",
    "include_stop_str_in_output",
];

/// Mutates a JSON value in place: replaces, deletes or adds a field somewhere in it.
fn mutate_json(v: &mut Value, rng: &mut Rng, depth: usize) {
    match v {
        Value::Object(map) if depth < 4 && !map.is_empty() && rng.below(3) == 0 => {
            let key = map.keys().nth(rng.below(map.len())).unwrap().clone();
            mutate_json(map.get_mut(&key).unwrap(), rng, depth + 1);
        }
        Value::Array(items) if depth < 4 && !items.is_empty() && rng.below(2) == 0 => {
            let i = rng.below(items.len());
            mutate_json(&mut items[i], rng, depth + 1);
        }
        Value::Object(map) => match rng.below(3) {
            0 if !map.is_empty() => {
                let key = map.keys().nth(rng.below(map.len())).unwrap().clone();
                map.remove(&key);
            }
            _ => {
                let key = rng.pick(FIELDS).to_string();
                map.insert(key, random_value(rng));
            }
        },
        other => *other = random_value(rng),
    }
}

/// Raw-byte damage to a serialised body.
fn mutate_bytes(body: &mut Vec<u8>, rng: &mut Rng) {
    match rng.below(4) {
        0 if !body.is_empty() => {
            let at = rng.below(body.len());
            body.truncate(at);
        }
        1 => {
            for _ in 0..1 + rng.below(8) {
                if !body.is_empty() {
                    let at = rng.below(body.len());
                    body[at] = rng.next() as u8;
                }
            }
        }
        2 => {
            let at = rng.below(body.len() + 1);
            let junk: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
            body.splice(at..at, junk);
        }
        _ => body.extend(std::iter::repeat_n(b' ', rng.below(1 << 20))),
    }
}

struct Harness {
    app: axum::Router,
    engine: deepinfer_engine::engine::EngineHandle,
    _dir: tempfile::TempDir,
}

fn start() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(&preset("tiny").unwrap(), dir.path(), 0, |_, _| {}).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    let script = tokenizer.encode(" fuzz", false).unwrap();
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 64,
            max_num_batched_tokens: 1024,
            prefill_chunk: None,
            max_model_len: 2048,
        },
        cache: CacheConfig {
            budget: CacheBudget::Bytes(256 << 20),
            max_seqs: 64,
            block_tokens: 64,
            ..CacheConfig::default()
        },
        model_name: "fuzz".into(),
        // Every generation writes these tokens then EOS: short, whatever the model says.
        forced_output: Some(ScriptedOutput::always(script)),
        speculative: None,
        prefix_disk: None,
    };
    let (engine, _join) = engine::start(model, config).unwrap();
    let state = Arc::new(AppState::new(
        engine.clone(),
        tokenizer,
        "fuzz".into(),
        dir.path().display().to_string(),
        None,
        256,
    ));
    let body = BodyLimits::new(4 << 20, Duration::from_secs(5), 16 << 20);
    Harness {
        app: router(state, body),
        engine,
        _dir: dir,
    }
}

/// Sends one request; returns the status and the whole body (a stream is read to its end).
async fn send(app: &axum::Router, path: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, bytes.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fuzzed_request_gets_a_bounded_answer() {
    let cases = env_or("DEEPINFER_FUZZ_CASES", 1000);
    let seed = env_or("DEEPINFER_FUZZ_SEED", 18);
    let h = start();
    let mut rng = Rng::new(seed);
    let seeds = seeds();
    let mut seen = std::collections::BTreeMap::<u16, usize>::new();
    let mut slowest = (0.0f64, 0u64);
    for case in 0..cases {
        let (path, base) = rng.pick(&seeds);
        let mut v = base.clone();
        for _ in 0..1 + rng.below(3) {
            mutate_json(&mut v, &mut rng, 0);
        }
        // Keep generations short unless the mutation aimed at the output budget itself.
        if let Some(obj) = v.as_object_mut() {
            if rng.below(4) != 0 {
                obj.insert("max_tokens".into(), json!(2));
                obj.remove("max_completion_tokens");
            }
        }
        let mut body = serde_json::to_vec(&v).unwrap();
        if rng.below(4) == 0 {
            mutate_bytes(&mut body, &mut rng);
        }
        let t = Instant::now();
        let answer =
            tokio::time::timeout(Duration::from_secs(60), send(&h.app, path, body.clone())).await;
        let secs = t.elapsed().as_secs_f64();
        let shown = || String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        let (status, out) = answer.unwrap_or_else(|_| {
            panic!(
                "case {case} (seed {seed}) on {path} got no answer in 60 s: {}",
                shown()
            )
        });
        if secs > slowest.0 {
            slowest = (secs, case);
        }
        *seen.entry(status.as_u16()).or_default() += 1;
        let allowed = [200, 400, 404, 413, 503];
        assert!(
            allowed.contains(&status.as_u16()),
            "case {case} (seed {seed}) on {path}: status {status} for {}: {}",
            shown(),
            String::from_utf8_lossy(&out[..out.len().min(300)])
        );
        if status != StatusCode::OK {
            let err: Value = serde_json::from_slice(&out).unwrap_or_else(|_| {
                panic!("case {case}: a {status} that is not JSON: {}", shown())
            });
            assert!(err["error"]["message"].is_string(), "case {case}: {err}");
            if path.starts_with("/v1/messages") {
                assert_eq!(
                    err["type"], "error",
                    "case {case}: not Anthropic's shape: {err}"
                );
            }
        }
    }
    eprintln!(
        "{cases} cases (seed {seed}): statuses {seen:?}; slowest case {} took {:.2} s",
        slowest.1, slowest.0
    );
    assert!(
        seen.get(&200).copied().unwrap_or(0) > 0,
        "no case was valid"
    );
    assert!(
        seen.get(&400).copied().unwrap_or(0) > 0,
        "no case was refused"
    );
    // Every generation finished or was aborted, and every cache came back.
    let engine = h.engine.clone();
    let drained = tokio::task::spawn_blocking(move || engine.drain());
    tokio::time::timeout(Duration::from_secs(30), drained)
        .await
        .expect("the engine drained")
        .unwrap()
        .expect("the engine is still running");
    let req = Request::get("/metrics").body(Body::empty()).unwrap();
    let resp = h.app.clone().oneshot(req).await.unwrap();
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    for line in text
        .lines()
        .filter(|l| l.starts_with("deepinfer:kv_cache_usage_perc"))
    {
        assert!(line.ends_with(" 0"), "a cache pool is still in use: {line}");
    }
}
