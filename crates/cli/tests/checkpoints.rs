//! Bad checkpoints through `deepinfer generate`: a config or checkpoint that is corrupted,
//! or describes another model, ends in a clear error naming what is wrong, within seconds,
//! without an abort; one that is merely unusual loads and computes the same tokens; and
//! without `--max-model-len` the context is what the cache holds.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PROMPT: &str = "5,17,42,7,7,99,3";

fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden/tiny-a/official")
}

/// A copy of the sharded golden checkpoint (config, index, two shards, MTP file).
fn copy_checkpoint() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(golden()).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    dir
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// A copy whose config has `key` set to `value` (a JSON literal, so 1e18 stays an integer).
fn with_config(key: &str, value: &str) -> tempfile::TempDir {
    let dir = copy_checkpoint();
    edit_json(&dir.path().join("config.json"), |v| {
        v[key] = serde_json::from_str(value).unwrap();
    });
    dir
}

struct Run {
    success: bool,
    /// The process was killed by a signal (an abort, a crash) or by the time limit.
    killed: bool,
    stdout: String,
    stderr: String,
    secs: f64,
}

/// `deepinfer generate` on `model`, killed after 60 s.
fn generate(model: &Path, extra: &[&str]) -> Run {
    let t = Instant::now();
    let mut child = Command::new(support::binary())
        .args(["generate", "--model", model.to_str().unwrap()])
        .args(["--prompt-ids", PROMPT, "--max-tokens", "8", "--json"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let limit = Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    Run {
        success: status.is_some_and(|s| s.success()),
        killed: status.is_none_or(|s| s.code().is_none()),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
        secs: t.elapsed().as_secs_f64(),
    }
}

fn tokens(run: &Run) -> Value {
    assert!(run.success, "generate failed: {}", run.stderr);
    let line: Value = serde_json::from_str(run.stdout.lines().next().unwrap()).unwrap();
    line["token_ids"].clone()
}

/// Fails cleanly: exit status 1 (no signal), within 30 s, with every part in the message.
fn assert_refused(dir: &Path, what: &str, parts: &[&str]) {
    let run = generate(dir, &[]);
    assert!(
        !run.killed,
        "{what}: killed (abort or hang) after {:.1} s: {}",
        run.secs, run.stderr
    );
    assert!(!run.success, "{what}: accepted; stdout {}", run.stdout);
    assert!(run.secs < 30.0, "{what}: took {:.1} s", run.secs);
    for p in parts {
        assert!(
            run.stderr.contains(p),
            "{what}: {:?} lacks {p:?}",
            run.stderr
        );
    }
}

/// Issue 18, item 7: size-like fields that aborted the process or ran for ever.
#[test]
fn absurd_sizes_are_refused_by_name() {
    for (key, value) in [
        ("num_hidden_layers", "1000000000000000000"),
        ("index_topk", "1000000000000"),
        ("hc_sinkhorn_iters", "1000000000000"),
        ("hc_mult", "64"),
        ("sliding_window", "1000000000000"),
    ] {
        let dir = with_config(key, value);
        assert_refused(dir.path(), key, &[key, value, "at most"]);
    }
}

/// Item 7: the config's context sizes nothing by itself; scratch follows the engine's
/// effective length, and a large (but bounded) top-k costs only what a sequence can use.
#[test]
fn a_huge_context_or_top_k_is_sized_from_the_effective_length() {
    let plain = tokens(&generate(&golden(), &[]));
    let dir = with_config("max_position_embeddings", "100000000000");
    let run = generate(dir.path(), &[]);
    assert_eq!(tokens(&run), plain, "{}", run.stderr);
    assert!(
        run.stderr.contains("max_model_len") && run.stderr.contains("the longest context"),
        "{}",
        run.stderr
    );
    let dir = with_config("index_topk", "65536");
    let run = generate(dir.path(), &[]);
    assert!(run.success && !run.killed, "{}", run.stderr);
}

/// Item 8: configs that describe another model, or a corrupted one.
#[test]
fn configs_for_another_model_are_refused() {
    for (key, value, parts) in [
        ("hidden_act", r#""gelu""#, &["hidden_act", "silu"][..]),
        ("expert_dtype", r#""int4""#, &["expert_dtype", "int4"]),
        ("tie_word_embeddings", "true", &["tie_word_embeddings"]),
        (
            "architectures",
            r#"["LlamaForCausalLM"]"#,
            &["architectures", "DeepseekV4ForCausalLM"],
        ),
        (
            "eos_token_id",
            "100000",
            &["eos_token_id", "100000", "vocabulary"],
        ),
        ("num_hidden_layers", "3", &["layer 3", "declares 3 layers"]),
    ] {
        let dir = with_config(key, value);
        assert_refused(dir.path(), key, parts);
    }
    let dir = copy_checkpoint();
    edit_json(&dir.path().join("config.json"), |v| {
        v["quantization_config"]["weight_block_size"] = serde_json::json!([0, 0]);
    });
    assert_refused(
        dir.path(),
        "weight_block_size",
        &["weight_block_size", "[0, 0]"],
    );
}

/// Item 8: a tensor in a shard that the index leaves out.
#[test]
fn a_tensor_missing_from_the_index_is_refused() {
    let dir = copy_checkpoint();
    edit_json(&dir.path().join("model.safetensors.index.json"), |v| {
        let map = v["weight_map"].as_object_mut().unwrap();
        map.remove("layers.1.attn.wq_a.weight").unwrap();
    });
    assert_refused(
        dir.path(),
        "unlisted tensor",
        &["layers.1.attn.wq_a.weight", "does not list"],
    );
}

/// Rewrites every `from` dtype in a safetensors header to `to` (same length, so no byte
/// moves); returns how many tensors changed.
fn retag_dtype(path: &Path, from: &str, to: &str) -> usize {
    assert_eq!(from.len(), to.len());
    let mut bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    let (old, new) = (
        format!("\"dtype\":\"{from}\""),
        format!("\"dtype\":\"{to}\""),
    );
    let count = header.matches(&old).count();
    let header = header.replace(&old, &new);
    bytes[8..8 + n].copy_from_slice(header.as_bytes());
    std::fs::write(path, bytes).unwrap();
    count
}

/// Item 8: packed FP4 weights tagged U8 instead of I8 are the same bytes, and are read the
/// same way: the tokens do not change.
#[test]
fn fp4_weights_tagged_u8_compute_the_same_tokens() {
    let plain = tokens(&generate(&golden(), &[]));
    let dir = copy_checkpoint();
    let mut retagged = 0;
    for shard in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        retagged += retag_dtype(&dir.path().join(shard), "I8", "U8");
    }
    assert!(
        retagged > 0,
        "the golden checkpoint stores packed FP4 as I8"
    );
    assert_eq!(tokens(&generate(dir.path(), &[])), plain);
}

/// Item 9: without --max-model-len the context is what the cache holds (said on stderr);
/// an explicit length that does not fit stays an error.
#[test]
fn the_default_context_is_what_the_cache_holds() {
    // 64 sequences' state leaves the paged pools too little for the config's 4096 tokens.
    let small = ["--cache-budget-mib", "4", "--max-num-seqs", "64"];
    let run = generate(&golden(), &small);
    assert!(run.success, "{}", run.stderr);
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains("max_model_len"))
        .unwrap_or_else(|| panic!("no max_model_len line: {}", run.stderr));
    assert!(
        line.contains("the longest context the cache pools' 4 MiB hold") && line.contains("4096"),
        "{line}"
    );
    let run = generate(
        &golden(),
        &[&small[..], &["--max-model-len", "4096"]].concat(),
    );
    assert!(!run.success && !run.killed);
    assert!(
        run.stderr.contains("does not fit the cache"),
        "{}",
        run.stderr
    );
    // bench alike: it runs instead of stopping at the config's full context.
    let out = Command::new(support::binary())
        .args(["bench", "--model", golden().to_str().unwrap()])
        .args([
            "--num-prompts",
            "2",
            "--input-len",
            "8",
            "--output-len",
            "4",
        ])
        .args(small)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the longest context the cache pools' 4 MiB hold"),
        "{stderr}"
    );
}

/// `bench cache --budget-mib 16` on the checkpoint in `dir`: its output, and the row of a
/// numerics (its numbers), if printed.
fn bench_cache(dir: &Path) -> (String, impl Fn(&str) -> Option<Vec<f64>>) {
    let out = Command::new(support::binary())
        .args(["bench", "cache", "--model", dir.to_str().unwrap()])
        .args(["--budget-mib", "16"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let text = stdout.clone();
    let row = move |name: &str| {
        let line = text.lines().find(|l| l.starts_with(name))?;
        Some(
            line.split_whitespace()
                .skip(1)
                .map(|v| v.parse().unwrap())
                .collect(),
        )
    };
    (stdout, row)
}

/// `bench cache` reports each numerics' bytes per token from the config alone: tiny-a's
/// official records are 148 bytes per KV vector (48 FP8 + 1 scale + 48 bf16 RoPE dims, padded)
/// and 36 per indexer key (64 FP4 + 2 scales, padded); 2 CSA layers (m = 4), 1 HCA (m = 8).
#[test]
fn bench_cache_reports_bytes_per_token_of_both_numerics() {
    let (stdout, row) = bench_cache(&golden());
    let (reference, official) = (row("reference").unwrap(), row("official").unwrap());
    // CSA 2·96·4 / 4, HCA 96·4 / 8, keys 2·64·4 / 4.
    assert_eq!(reference[1..5], [192.0, 48.0, 128.0, 368.0]);
    assert_eq!(official[1..5], [74.0, 18.5, 18.0, 110.5]);
    assert!(official[5] > 3.0 * reference[5], "{stdout}");
}

/// `bench cache` on V4.1 reports the pools V4.1 has (entries and indexer keys of its ratio-2
/// and ratio-1 sources: tiny-v41-a's layers 1 and 3, 64 floats each) in both numerics;
/// official holds vLLM's V4.1 FP8 records.
#[test]
fn bench_cache_reports_v41_pools() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/golden/tiny-v41-a/official");
    let (stdout, row) = bench_cache(&dir);
    let header = stdout.lines().find(|l| l.starts_with("numerics")).unwrap();
    for pool in ["c2_entries", "c1_entries", "c2_keys", "c1_keys"] {
        assert!(header.contains(pool), "{stdout}");
    }
    // 64·4 bytes per entry: every other token at ratio 2, every token at ratio 1.
    assert_eq!(
        row("reference").unwrap()[1..6],
        [128.0, 256.0, 128.0, 256.0, 768.0]
    );
    // 64 FP8 codes + 2 scale bytes (KV) or 1 (key), padded to 68 bytes.
    assert_eq!(
        row("official").unwrap()[1..6],
        [34.0, 68.0, 34.0, 68.0, 204.0]
    );
}

/// `bench model` times a DSpark draft block where the checkpoint ships the drafter, and
/// only there.
#[test]
fn bench_model_times_the_dspark_draft_block() {
    let golden = |name: &str| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../../tests/fixtures/golden/{name}/official"))
    };
    for (name, drafter) in [("tiny-a-dspark", true), ("tiny-a", false)] {
        let out = Command::new(support::binary())
            .args(["bench", "model", "--model", golden(name).to_str().unwrap()])
            .args([
                "--batch",
                "1",
                "--prompt",
                "16",
                "--context",
                "16",
                "--reps",
                "1",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&str> = stdout.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("DSpark draft block"));
        assert_eq!(at.is_some(), drafter, "{name}: {stdout}");
        if let Some(at) = at {
            // batch 1, a block of 5 after 16 tokens of context.
            let row: Vec<&str> = lines[at + 1].split_whitespace().collect();
            assert_eq!(row[..3], ["1", "5", "16"], "{stdout}");
        }
    }
}
