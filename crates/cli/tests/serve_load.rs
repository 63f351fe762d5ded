//! A bounded load test on loopback: 200 concurrent streaming requests against the default
//! model. Every stream must complete with exactly the engine's greedy text (no token lost,
//! duplicated or reordered), and the cache pools must end empty. Figures are printed
//! (`cargo test -p deepinfer-cli --test serve_load -- --nocapture`).

mod support;

use serde_json::json;
use std::time::{Duration, Instant};
use support::{engine_greedy_text, metric, sse_chunks, Server, SseEvents};

const STREAMS: usize = 200;
const DISTINCT: usize = 20;
const MAX_TOKENS: usize = 16;

fn prompt(k: usize) -> Vec<u32> {
    (0..8 + k)
        .map(|i| (1000 + 7919 * (k + 1) + 104_729 * i) as u32 % 120_000)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_streams_each_get_the_greedy_text() {
    let server = Server::start(&[]);
    let client = reqwest::Client::new();
    let prompts: Vec<Vec<u32>> = (0..DISTINCT).map(prompt).collect();
    let reference = engine_greedy_text(&server.model_root().await, &prompts, MAX_TOKENS);

    let start = Instant::now();
    let tasks: Vec<_> = (0..STREAMS)
        .map(|r| {
            let client = client.clone();
            let url = server.url("/v1/completions");
            let body = json!({
                "prompt": prompts[r % DISTINCT], "max_tokens": MAX_TOKENS, "temperature": 0,
                "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
            });
            tokio::spawn(async move {
                let sent = Instant::now();
                let mut resp = client.post(url).json(&body).send().await.unwrap();
                assert_eq!(resp.status().as_u16(), 200);
                let mut raw = String::new();
                let mut ttft = None;
                let mut events = SseEvents::default();
                while let Some(c) = resp.chunk().await.unwrap() {
                    ttft.get_or_insert_with(|| sent.elapsed());
                    raw.extend(events.push(&c));
                }
                assert!(events.rest().is_empty(), "a partial event at the end");
                (r, raw, ttft.unwrap(), sent.elapsed())
            })
        })
        .collect();
    let mut ttfts = Vec::new();
    let mut e2e = Vec::new();
    for t in tasks {
        let (r, raw, ttft, total) = t.await.unwrap();
        let chunks = sse_chunks(&raw);
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(text, reference[r % DISTINCT], "request {r}");
        let last = chunks.last().unwrap();
        assert_eq!(
            last["usage"]["completion_tokens"], MAX_TOKENS,
            "request {r}"
        );
        assert_eq!(
            chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
            "length"
        );
        ttfts.push(ttft);
        e2e.push(total);
    }
    let wall = start.elapsed();

    // Pools drain to zero once every stream has ended.
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = client
            .get(server.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let used: f64 = ["state_slots", "csa_entries", "hca_entries", "indexer_keys"]
            .iter()
            .map(|p| metric(&m, "deepinfer:kv_cache_usage_perc", &[("pool", p)]).unwrap())
            .sum();
        if used == 0.0 && metric(&m, "deepinfer:num_requests_running", &[]) == Some(0.0) {
            break m;
        }
        assert!(Instant::now() < deadline, "the pools did not drain:\n{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        metric(
            &m,
            "deepinfer:request_success_total",
            &[("finished_reason", "length")]
        ),
        Some(STREAMS as f64)
    );
    ttfts.sort();
    e2e.sort();
    let pct = |v: &[Duration], p: usize| v[(v.len() - 1) * p / 100].as_secs_f64() * 1e3;
    println!(
        "load: {STREAMS} streams x {MAX_TOKENS} tokens in {:.2} s = {:.0} output tok/s; \
         TTFT p50 {:.0} ms p99 {:.0} ms; E2E p50 {:.0} ms p99 {:.0} ms; preemptions {}",
        wall.as_secs_f64(),
        (STREAMS * MAX_TOKENS) as f64 / wall.as_secs_f64(),
        pct(&ttfts, 50),
        pct(&ttfts, 99),
        pct(&e2e, 50),
        pct(&e2e, 99),
        metric(&m, "deepinfer:num_preemptions_total", &[]).unwrap_or(0.0)
    );
}
