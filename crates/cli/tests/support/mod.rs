//! A `deepinfer serve` process for tests: started on a free loopback port with the default
//! model (built once per target directory), talked to with a real HTTP client.

#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

pub struct Server {
    child: Child,
    pub base: String,
    /// Everything the server wrote to stderr after its "serving" line.
    pub log: Arc<Mutex<String>>,
}

/// The binary under test: this build's, or the one `DEEPINFER_TEST_BIN` names (to show a
/// regression test failing on a build from before its fix).
pub fn binary() -> PathBuf {
    std::env::var_os("DEEPINFER_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_deepinfer")))
}

/// Writes the synthetic checkpoint `preset` into `out` with `deepinfer synth`.
pub fn synth(preset: &str, out: &std::path::Path) {
    let o = Command::new(binary())
        .args(["synth", "--preset", preset, "--out"])
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The binary under test as `mpirun -n N` starts it (oversubscribed: the tests run more
/// ranks than this machine has cores).
pub fn mpirun(n: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--oversubscribe",
        "--allow-run-as-root",
        "-n",
        &n.to_string(),
    ]);
    cmd.arg(binary());
    cmd
}

/// Shared across test binaries so the default model is written once.
pub fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("deepinfer-cache")
}

impl Server {
    /// Starts the binary with `args` after `serve --port 0` and waits until it listens.
    pub fn start(args: &[&str]) -> Server {
        Self::start_by(Command::new(binary()), args)
    }

    /// [`Self::start`] under `mpirun -n N` (every rank's stderr comes through it).
    pub fn start_ranks(n: usize, args: &[&str]) -> Server {
        Self::start_by(mpirun(n), args)
    }

    /// [`Self::start`] with `launch` as the command line's start.
    fn start_by(mut launch: Command, args: &[&str]) -> Server {
        // One start at a time: the first writes the default model, the rest reuse it.
        static STARTING: Mutex<()> = Mutex::new(());
        let _one = STARTING.lock().unwrap_or_else(|e| e.into_inner());
        let mut child = launch
            .args(["serve", "--port", "0"])
            .args(args)
            .env("DEEPINFER_CACHE_DIR", cache_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = String::new();
        let base = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                panic!("the server exited before listening:\n{seen}");
            };
            seen.push_str(&line);
            seen.push('\n');
            if let Some(at) = line.find(" on http://") {
                let rest = &line[at + " on ".len()..];
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        Server { child, base, log }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The served model's directory (`root` in `/v1/models`).
    pub async fn model_root(&self) -> String {
        let r = reqwest::get(self.url("/v1/models")).await.unwrap();
        let v: Value = r.json().await.unwrap();
        v["data"][0]["root"].as_str().unwrap().to_string()
    }

    /// The server's `/metrics` text.
    pub async fn metrics(&self) -> String {
        let r = reqwest::get(self.url("/metrics")).await.unwrap();
        r.text().await.unwrap()
    }

    /// Polls `/metrics` until `done` holds and returns that text; fails after `within`.
    pub async fn wait_metrics(
        &self,
        within: std::time::Duration,
        what: &str,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = std::time::Instant::now() + within;
        loop {
            let m = self.metrics().await;
            if done(&m) {
                return m;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what} never happened:\n{m}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Waits until no request runs or waits and every cache pool is empty.
    pub async fn wait_idle(&self) -> String {
        self.wait_metrics(std::time::Duration::from_secs(20), "idle", idle)
            .await
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGINT (Ctrl-C) without waiting.
    pub fn interrupt(&self) {
        let ok = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "could not signal the server");
    }

    /// Waits for the process to exit, failing the test if it takes longer than `within`.
    pub fn wait_exit(mut self, within: std::time::Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                std::mem::forget(self);
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the server did not exit within {within:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Sends SIGINT (Ctrl-C) and waits for the exit status.
    pub fn interrupt_and_wait(mut self) -> std::process::ExitStatus {
        self.interrupt();
        let status = self.child.wait().expect("wait");
        std::mem::forget(self);
        status
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the metrics say no request runs or waits and every cache pool is empty.
pub fn idle(m: &str) -> bool {
    let pools: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("deepinfer:kv_cache_usage_perc{"))
        .collect();
    metric(m, "deepinfer:num_requests_running", &[]) == Some(0.0)
        && metric(m, "deepinfer:num_requests_waiting", &[]) == Some(0.0)
        && pools.iter().any(|l| l.contains("pool=\"state_slots\""))
        // Every pool the model has (V4's CSA/HCA entries and indexer keys, V4.1's per ratio).
        && pools.iter().all(|l| l.rsplit(' ').next() == Some("0"))
}

/// One metric's value from the Prometheus text, matching every label given.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Splits a streamed SSE body into events on its raw bytes: an HTTP chunk may end inside a
/// multi-byte character, so chunks cannot be decoded one by one.
#[derive(Default)]
pub struct SseEvents {
    buf: Vec<u8>,
}

impl SseEvents {
    /// Takes one HTTP chunk; returns the events it completed, each ending in its blank line.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(chunk);
        let mut events = Vec::new();
        while let Some(at) = self.buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.buf.drain(..at + 2).collect();
            events.push(String::from_utf8(event).expect("an SSE event is UTF-8"));
        }
        events
    }

    /// Bytes after the last complete event (none once a stream has ended properly).
    pub fn rest(&self) -> &[u8] {
        &self.buf
    }
}

/// POSTs `body` as JSON to `path`: the status and the answer (JSON, else its text as a string).
pub async fn post_json(server: &Server, path: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(server.url(path))
        .json(body)
        .send()
        .await
        .expect("request sent");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

/// Reads a streamed response to its end; the events joined, checked to be whole UTF-8.
pub async fn read_sse(mut r: reqwest::Response) -> String {
    let mut events = SseEvents::default();
    let mut body = String::new();
    while let Some(c) = r.chunk().await.expect("the stream reads") {
        body.extend(events.push(&c));
    }
    assert!(
        events.rest().is_empty(),
        "a partial event at the end: {body}"
    );
    body
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

/// Parsed JSON chunks of an SSE body (the final `[DONE]` is checked and dropped).
pub fn sse_chunks(body: &str) -> Vec<Value> {
    let data = sse_data(body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk is JSON"))
        .collect()
}

/// [`engine_greedy`]'s tokens as text, decoded with the model's tokenizer.
pub fn engine_greedy_text(model: &str, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<String> {
    let tok = deepinfer_server::tokenizer::Tokenizer::from_dir(model).unwrap();
    engine_greedy(model, prompts, max_tokens)
        .iter()
        .map(|ids| tok.decode(ids, true))
        .collect()
}

/// Greedy tokens through the engine alone (`deepinfer generate`, no HTTP).
pub fn engine_greedy(model: &str, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Vec<u32>> {
    let mut args = vec![
        "generate".to_string(),
        "--model".into(),
        model.into(),
        "--max-tokens".into(),
        max_tokens.to_string(),
        "--ignore-eos".into(),
        "--json".into(),
    ];
    for p in prompts {
        args.push("--prompt-ids".into());
        args.push(
            p.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    let out = Command::new(binary())
        .args(&args)
        .output()
        .expect("generate runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}
