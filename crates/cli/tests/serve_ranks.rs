//! `mpirun -n 2 deepinfer serve --enable-expert-parallel`: a real HTTP client gets the
//! single-process engine's greedy tokens, and a rank killed mid-service ends the whole job
//! with an error naming it, not a hang.

mod support;

use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{engine_greedy_text, Server};

/// The process id of the job's rank `rank` (read from the launcher's variable in each
/// child's environment).
fn rank_pid(launcher: u32, rank: usize) -> u32 {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    let out = Command::new("pgrep")
        .args(["-P", &launcher.to_string()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|p| p.parse::<u32>().unwrap())
        .find(|p| {
            std::fs::read(format!("/proc/{p}/environ"))
                .map(|env| env.split(|&b| b == 0).any(|v| v == want.as_bytes()))
                .unwrap_or(false)
        })
        .unwrap_or_else(|| panic!("no rank {rank} under {launcher}"))
}

#[tokio::test]
async fn split_server_answers_like_one_process_and_dies_whole() {
    let server = Server::start_ranks(2, &["--enable-expert-parallel"]);
    let root = server.model_root().await;
    let prompts = vec![vec![100u32, 2000, 30000, 5, 77, 1234], vec![0u32, 5, 6]];
    let want = engine_greedy_text(&root, &prompts, 12);
    let client = reqwest::Client::new();
    for (p, want) in prompts.iter().zip(&want) {
        let req = json!({"prompt": p, "max_tokens": 12, "temperature": 0, "ignore_eos": true});
        let r = client
            .post(server.url("/v1/completions"))
            .json(&req)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["choices"][0]["text"].as_str(), Some(want.as_str()), "{v}");
    }

    let killed = rank_pid(server.pid(), 1);
    assert!(Command::new("kill")
        .args(["-9", &killed.to_string()])
        .status()
        .unwrap()
        .success());
    let log = server.log.clone();
    let t0 = Instant::now();
    let status = server.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "the job must fail when a rank dies");
    let log = log.lock().unwrap().clone();
    assert!(log.contains("rank 1"), "the error names the rank:\n{log}");
    eprintln!("the job ended {:?} after the kill", t0.elapsed());
}

/// A rank whose step fails (here: streamed experts whose shard was truncated after loading)
/// stops the engine: `/health` turns 503, then every rank exits with the error.
#[tokio::test]
async fn a_failed_step_turns_health_503_then_ends_the_job() {
    let dir = tempfile::tempdir().unwrap();
    support::synth("tiny", dir.path());
    let model = dir.path().to_str().unwrap();
    let server = Server::start_ranks(
        2,
        &[
            "--model",
            model,
            "--enable-expert-parallel",
            "--expert-cache-mib",
            "0",
        ],
    );
    let client = reqwest::Client::new();
    let complete = || {
        let req = json!({"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0});
        client.post(server.url("/v1/completions")).json(&req).send()
    };
    assert_eq!(complete().await.unwrap().status(), 200);
    let health = || async {
        reqwest::get(server.url("/health"))
            .await
            .map(|r| r.status())
    };
    assert_eq!(health().await.unwrap(), 200);

    for f in std::fs::read_dir(dir.path()).unwrap() {
        let f = f.unwrap().path();
        if f.extension().is_some_and(|e| e == "safetensors") {
            let len = std::fs::metadata(&f).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&f)
                .unwrap()
                .set_len(len / 2)
                .unwrap();
        }
    }
    // The request fails (or its connection does); the engine is gone.
    let _ = complete().await;
    let t0 = Instant::now();
    loop {
        match health().await {
            Ok(s) if s == 503 => break,
            Ok(_) => {}
            Err(e) => panic!("the server went away before /health said 503: {e}"),
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "/health never turned 503"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = server.log.clone();
    let status = server.wait_exit(Duration::from_secs(30));
    assert!(!status.success());
    let log = log.lock().unwrap().clone();
    assert!(
        log.contains("rank ") && log.contains("changed since"),
        "{log}"
    );
}
