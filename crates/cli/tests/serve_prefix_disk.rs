//! `deepinfer serve --prefix-cache-dir`: a prefix cached before a restart (clean, or a
//! SIGKILL in the middle of writes) is served from disk with the cold answer, bit for bit;
//! `/reset_prefix_cache?disk=true` empties the directory; a second server on the same
//! directory is refused; a directory that cannot be used leaves the cache in memory.

mod support;

use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::{metric, Server};

/// Greedy completion of `prompt` (token ids): the tokens' text, their logprobs (as JSON,
/// so equal floats print equal) and the cached prompt tokens.
async fn complete(server: &Server, prompt: &[u32]) -> (Value, Value, u64) {
    let r = reqwest::Client::new()
        .post(server.url("/v1/completions"))
        .json(&json!({
            "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 3
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let c = &v["choices"][0];
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    (c["text"].clone(), c["logprobs"].clone(), cached)
}

/// A prompt of `n` tokens that differs from others by `seed`.
fn prompt(n: u32, seed: u32) -> Vec<u32> {
    (0..n)
        .map(|i| 100 + (i * 7919 + seed * 104_729) % 20_000)
        .collect()
}

fn with_dir(dir: &Path) -> Vec<String> {
    vec![
        "--prefix-cache-dir".into(),
        dir.display().to_string(),
        "--block-size".into(),
        "32".into(),
    ]
}

fn start(args: &[String]) -> Server {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&args)
}

async fn disk_metric(server: &Server, name: &str) -> f64 {
    let m = server.metrics().await;
    metric(&m, &format!("deepinfer:{name}"), &[]).unwrap_or(0.0)
}

#[tokio::test]
async fn prefixes_survive_a_kill_and_a_restart_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let turns: Vec<Vec<u32>> = (0..3).map(|k| prompt(200, k)).collect();
    // What a server answers with nothing cached (same settings: prefix caching makes the
    // arithmetic independent of the batch, which changes the last bits).
    let cold = start(&["--block-size".into(), "32".into()]);
    let mut want = Vec::new();
    for t in &turns {
        let next: Vec<u32> = [t.clone(), prompt(40, 9)].concat();
        want.push(complete(&cold, &next).await);
        assert_eq!(want.last().unwrap().2, 0);
    }
    drop(cold);
    // Killed (SIGKILL) three times with requests in flight and entries being written: at
    // its first written entry, then after 150 and 400 ms of a restarted server's work.
    for delay in [None, Some(150), Some(400)] {
        let server = start(&with_dir(dir.path()));
        let mut sent = Vec::new();
        for t in &turns {
            let (url, body) = (
                server.url("/v1/completions"),
                json!({"prompt": t, "max_tokens": 24, "temperature": 0}),
            );
            sent.push(tokio::spawn(async move {
                reqwest::Client::new().post(url).json(&body).send().await
            }));
        }
        match delay {
            None => {
                let written =
                    |m: &str| metric(m, "deepinfer:prefix_cache_disk_entries", &[]).unwrap_or(0.0);
                server
                    .wait_metrics(Duration::from_secs(60), "an entry on disk", |m| {
                        written(m) >= 1.0
                    })
                    .await;
            }
            Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
        drop(server); // SIGKILL
        for s in sent {
            let _ = s.await;
        }
    }
    // Whatever the kill left, the restarted server answers as the cold one did.
    let second = start(&with_dir(dir.path()));
    for (k, t) in turns.iter().enumerate() {
        let next: Vec<u32> = [t.clone(), prompt(40, 9)].concat();
        let (text, logprobs, _) = complete(&second, &next).await;
        assert_eq!((&text, &logprobs), (&want[k].0, &want[k].1), "turn {k}");
    }
    // A clean stop writes what memory holds; the next start reads it.
    assert!(second.interrupt_and_wait().success());
    let third = start(&with_dir(dir.path()));
    for (k, t) in turns.iter().enumerate() {
        let next: Vec<u32> = [t.clone(), prompt(40, 9)].concat();
        let (text, logprobs, cached) = complete(&third, &next).await;
        assert_eq!((&text, &logprobs), (&want[k].0, &want[k].1), "again {k}");
        assert!(cached >= 192, "turn {k}: {cached} cached tokens");
    }
    assert!(disk_metric(&third, "external_prefix_cache_hits_total").await >= 3.0 * 192.0);
    assert!(disk_metric(&third, "prefix_cache_disk_read_bytes_total").await > 0.0);
    // Emptied on request: the next start finds nothing.
    let reset = |query: &str| {
        let url = third.url(&format!("/reset_prefix_cache?{query}"));
        async move {
            reqwest::Client::new()
                .post(url)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(reset("disk=maybe").await, 400);
    assert_eq!(reset("disk=true").await, 200);
    assert_eq!(disk_metric(&third, "prefix_cache_disk_entries").await, 0.0);
    assert!(third.interrupt_and_wait().success());
    let fourth = start(&with_dir(dir.path()));
    let next: Vec<u32> = [turns[0].clone(), prompt(40, 9)].concat();
    let (text, _, cached) = complete(&fourth, &next).await;
    assert_eq!((text, cached), (want[0].0.clone(), 0));
}

#[tokio::test]
async fn one_directory_one_server_and_an_unusable_one_is_memory_only() {
    let dir = tempfile::tempdir().unwrap();
    let first = start(&with_dir(dir.path()));
    let out = Command::new(support::binary())
        .args(["serve", "--port", "0"])
        .args(with_dir(dir.path()))
        .env("DEEPINFER_CACHE_DIR", support::cache_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--prefix-cache-dir") && err.contains("another deepinfer process"),
        "{err}"
    );
    drop(first);
    // A path under a file cannot be a directory: the server runs, caching in memory.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let mut args = with_dir(&file.join("cache"));
    args.extend(["--api-key".into(), "k".into()]);
    let server = start(&args);
    let p = prompt(100, 1);
    let client = reqwest::Client::new();
    let send = |path: &str| {
        client
            .post(server.url(path))
            .header("authorization", "Bearer k")
            .json(&json!({"prompt": p, "max_tokens": 6, "temperature": 0}))
            .send()
    };
    let a: Value = send("/v1/completions").await.unwrap().json().await.unwrap();
    let b: Value = send("/v1/completions").await.unwrap().json().await.unwrap();
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], 96);
    // The reset route is behind the API key.
    let r = client
        .post(server.url("/reset_prefix_cache"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(send("/reset_prefix_cache").await.unwrap().status(), 200);
}
