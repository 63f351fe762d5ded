//! `deepinfer generate` end to end: the binary reproduces HF's greedy tokens from the golden
//! checkpoints in both name layouts, and bad input fails cleanly.

mod support;

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};
#[cfg(feature = "mpi")]
use support::mpirun;

fn golden(config: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/golden")
        .join(config)
}

fn deepinfer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deepinfer"))
        .args(args)
        .output()
        .expect("binary runs")
}

fn csv(v: &Value) -> String {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn check_layout(config: &str, layout: &str, extra: &[&str]) {
    check_golden(config, layout, "golden", extra);
}

/// Like [`check_layout`] against the goldens `{name}.json` of `config`.
fn check_golden(config: &str, layout: &str, name: &str, extra: &[&str]) {
    let launch = Command::new(env!("CARGO_BIN_EXE_deepinfer"));
    check_launched_against(launch, config, layout, name, extra);
}

/// `deepinfer generate` as `launch` starts it (directly, or under `mpirun`) reproduces the
/// golden tokens of `config`'s first two prompts.
#[cfg(feature = "mpi")]
fn check_launched(launch: Command, config: &str, layout: &str, extra: &[&str]) {
    check_launched_against(launch, config, layout, "golden", extra);
}

fn check_launched_against(
    mut launch: Command,
    config: &str,
    layout: &str,
    name: &str,
    extra: &[&str],
) {
    let file = golden(config).join(format!("{name}.json"));
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let steps = meta["greedy_steps"].as_u64().unwrap().to_string();
    let prompts: Vec<&Value> = meta["prompts"].as_array().unwrap().iter().take(2).collect();
    let model = golden(config).join(layout);
    let ids: Vec<String> = prompts.iter().map(|p| csv(&p["ids"])).collect();
    let mut args = vec![
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--max-tokens",
        &steps,
    ];
    for i in &ids {
        args.extend(["--prompt-ids", i.as_str()]);
    }
    args.extend(["--top-logprobs", "3", "--ignore-eos", "--json"]);
    args.extend(extra);
    let out = launch.args(&args).output().expect("binary runs");
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), prompts.len());
    for (line, p) in lines.iter().zip(&prompts) {
        assert_eq!(line["prompt_ids"], p["ids"]);
        assert_eq!(
            line["token_ids"], p["greedy"],
            "{config}/{layout}: greedy tokens differ from {name}"
        );
        let tops = line["top_logprobs"].as_array().unwrap();
        assert_eq!(tops.len().to_string(), steps);
        for (step, top) in tops.iter().enumerate() {
            let top = top.as_array().unwrap();
            assert_eq!(top.len(), 3);
            assert_eq!(top[0]["id"], line["token_ids"][step]);
            let lp: Vec<f64> = top.iter().map(|e| e["logprob"].as_f64().unwrap()).collect();
            assert!(lp[0] <= 0.0 && lp[0] >= lp[1] && lp[1] >= lp[2], "{lp:?}");
        }
    }
}

#[test]
fn reproduces_golden_greedy_tokens_from_official_names() {
    check_layout("tiny-a", "official", &[]);
    check_layout("tiny-b", "official", &[]);
    // DeepSeek-V4.1, against our CPU reference (tools/make_v41_golden.py).
    check_layout("tiny-v41-a", "official", &[]);
    check_layout("tiny-v41-b", "official", &[]);
}

#[test]
fn reproduces_golden_greedy_tokens_from_hf_names() {
    check_layout("tiny-a", "hf", &[]);
    check_layout("tiny-c", "hf", &[]);
}

/// Prompts fed 7 tokens per step, interleaved with the other prompt's decode steps.
#[test]
fn chunked_prefill_reproduces_golden_greedy_tokens() {
    check_layout("tiny-a", "official", &["--prefill-chunk", "7"]);
    check_layout("tiny-b", "hf", &["--prefill-chunk", "7"]);
    check_layout("tiny-v41-a", "official", &["--prefill-chunk", "7"]);
}

/// Speculative decoding with the checkpoint's MTP block, spelled as vLLM spells it: the
/// same greedy tokens and logprobs.
#[test]
fn speculative_decoding_reproduces_golden_greedy_tokens() {
    check_layout(
        "tiny-a",
        "official",
        &[
            "--speculative-config",
            r#"{"method": "mtp", "num_speculative_tokens": 3, "adaptive": false}"#,
        ],
    );
    check_layout("tiny-b", "hf", &["--num-speculative-tokens", "2"]);
}

/// `--numerics official` reproduces our port of DeepSeek's own inference code
/// (tools/make_official_golden.py), fed whole, in chunks and with MTP speculation, on tiny-c:
/// the checkpoint whose official goldens survive another summation order (see
/// tests/official_numerics.rs).
#[test]
fn official_numerics_reproduces_its_golden_greedy_tokens() {
    let official = ["--numerics", "official"];
    check_golden("tiny-c", "official", "official_golden", &official);
    let chunked = [&official[..], &["--prefill-chunk", "7"]].concat();
    check_golden("tiny-c", "official", "official_golden", &chunked);
    let drafted = [&official[..], &["--num-speculative-tokens", "2"]].concat();
    check_golden("tiny-c", "official", "official_golden", &drafted);
    // DeepSeek-V4.1 in vLLM's FP8 arithmetic (tools/make_v41_official_golden.py): tiny-v41-b's
    // first two prompts are tie-safe there.
    check_golden("tiny-v41-b", "official", "official_golden", &official);
    check_golden("tiny-v41-b", "official", "official_golden", &chunked);
    assert_fails(
        &["generate", "--model", "x", "--numerics", "bf16"],
        "expected `reference`, `official` or `gguf`",
    );
}

/// Routed experts streamed from disk through the smallest cache: the same golden tokens, and
/// stderr says which memory plan was chosen and why; a budget too small for the dense part
/// is refused at start.
#[test]
fn streamed_experts_reproduce_golden_greedy_tokens() {
    check_layout("tiny-a", "official", &["--expert-cache-mib", "0"]);
    check_layout(
        "tiny-c",
        "hf",
        &["--expert-cache-mib", "0", "--prefill-chunk", "5"],
    );
    let model = golden("tiny-b").join("official");
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", model.to_str().unwrap()];
        args.extend(["--prompt-ids", "1,2,3", "--max-tokens", "2"]);
        args.extend(extra);
        deepinfer(&args)
    };
    let out = run(&["--expert-cache-mib", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("memory plan: routed experts") && err.contains("streamed"),
        "{err}"
    );
    let out = run(&["--memory-budget-mib", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--memory-budget-mib 0 is too small: the weights need at least"),
        "{err}"
    );
}

/// Each start-up error names the flag, gives sizes in MiB, says once what would fit, and
/// appears once (before: a flag called a tensor, the message twice, sizes in bytes).
#[test]
fn start_up_errors_name_the_flag_and_the_fix_once() {
    let model = golden("tiny-a").join("official");
    let m = model.to_str().unwrap();
    let cases: [(&[&str], &str); 3] = [
        (
            &["--memory-budget-mib", "0"],
            "--memory-budget-mib 0 is too small: the weights need at least 3 MiB (their dense \
             part and the smallest expert cache); give --memory-budget-mib 3 or more",
        ),
        (
            &["--cache-budget-mib", "0"],
            "--cache-budget-mib 0 cannot hold 1 sequence: each sequence's state takes 0.06 MiB, \
             and one block of each paged pool 0.08 MiB more (0.14 MiB in all); give \
             --cache-budget-mib 1 or more",
        ),
        (
            &["--cache-budget-mib", "1", "--max-num-seqs", "64"],
            "--cache-budget-mib 1 cannot hold 64 sequences (--max-num-seqs): each sequence's \
             state takes 0.06 MiB, and one block of each paged pool 0.08 MiB more (3.8 MiB in \
             all); give --cache-budget-mib 4 or --max-num-seqs 16",
        ),
    ];
    for (flags, message) in cases {
        let mut args = vec!["generate", "--model", m, "--prompt-ids", "1,2"];
        args.extend(flags);
        let out = deepinfer(&args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end(), format!("error: loading {m}: {message}"));
    }
}

#[cfg(feature = "mpi")]
#[test]
fn split_runs_reproduce_golden_greedy_tokens() {
    // Tensor parallel with the experts split whole, then the experts alone, then tensor
    // parallel with every expert split by width (no flag: vLLM's default).
    let ep = "--enable-expert-parallel";
    let alone = ["--tensor-parallel-size", "1"];
    check_launched(mpirun(2), "tiny-a", "official", &[ep]);
    check_launched(mpirun(3), "tiny-b", "hf", &[ep, "--prefill-chunk", "5"]);
    check_launched(
        mpirun(2),
        "tiny-c",
        "official",
        &[ep, "--num-speculative-tokens", "2"],
    );
    check_launched(
        mpirun(3),
        "tiny-a",
        "official",
        &[ep, "--expert-cache-mib", "0"],
    );
    check_launched(mpirun(2), "tiny-b", "hf", &[ep, alone[0], alone[1]]);
    check_launched(mpirun(3), "tiny-c", "official", &[ep, alone[0], alone[1]]);
    check_launched(mpirun(2), "tiny-a", "official", &[]);
    check_launched(mpirun(3), "tiny-b", "hf", &["--prefill-chunk", "5"]);
    // DeepSeek-V4.1 (Engram, shared kv and index sources, shifted mHC on rank 0), its
    // experts split whole, by width, and drafting with its DSpark drafter.
    check_launched(
        mpirun(2),
        "tiny-v41-b",
        "official",
        &[ep, "--prefill-chunk", "5"],
    );
    check_launched(mpirun(3), "tiny-v41-a", "official", &[]);
    let dspark = ["--speculative-config", r#"{"method": "dspark"}"#];
    check_launched(
        mpirun(2),
        "tiny-v41-a",
        "official",
        &[ep, dspark[0], dspark[1]],
    );
    // Official numerics with the experts split whole: the other ranks round their experts'
    // w2 inputs as one process does.
    let official = ["--numerics", "official", ep, alone[0], alone[1]];
    check_launched_against(
        mpirun(2),
        "tiny-c",
        "official",
        "official_golden",
        &official,
    );
    check_launched_against(
        mpirun(3),
        "tiny-c",
        "official",
        "official_golden",
        &official,
    );
    for n in [2, 3] {
        check_launched_against(
            mpirun(n),
            "tiny-v41-b",
            "official",
            "official_golden",
            &official,
        );
    }
    // And with the dense projections split too: tensor parallel with the experts whole
    // (the seed's configuration), and with every expert split by width.
    let tensor = ["--numerics", "official", ep];
    check_launched_against(
        mpirun(2),
        "tiny-v41-b",
        "official",
        "official_golden",
        &tensor,
    );
    check_launched_against(
        mpirun(3),
        "tiny-c",
        "official",
        "official_golden",
        &tensor[..2],
    );
    // Context parallelism: every prefill step of two or more tokens split by position.
    for n in [2, 3] {
        let size = n.to_string();
        let cp = [
            "--context-parallel-size",
            &size,
            "--context-parallel-min-tokens",
            "2",
        ];
        check_launched(mpirun(n), "tiny-a", "official", &cp);
        let chunked = [&cp[..], &["--prefill-chunk", "7"]].concat();
        check_launched(mpirun(n), "tiny-v41-b", "official", &chunked);
    }
    // Composed with the tensor and expert split: four processes as two groups of two, each
    // group a copy of the model split within it (tensor parallel by default, or the
    // experts alone in official numerics).
    let cp = [
        "--context-parallel-size",
        "2",
        "--context-parallel-min-tokens",
        "2",
    ];
    check_launched(mpirun(4), "tiny-v41-b", "official", &cp);
    check_launched_against(
        mpirun(4),
        "tiny-v41-b",
        "official",
        "official_golden",
        &[&cp[..], &official].concat(),
    );
    check_launched_against(
        mpirun(4),
        "tiny-v41-b",
        "official",
        "official_golden",
        &[&cp[..], &tensor].concat(),
    );
}

#[cfg(feature = "mpi")]
#[test]
fn split_run_failures_end_every_rank() {
    let model = golden("tiny-a").join("official");
    let base = [
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        "1,2",
    ];
    // Several processes with nothing to split is refused on every rank.
    let refused = |flags: &[&str], needles: &[&str]| {
        let out = mpirun(2).args(base).args(flags).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} was not refused");
        assert!(needles.iter().all(|n| err.contains(n)), "{err}");
    };
    // Every rank refuses it; the first to end the job is the one heard (either).
    refused(
        &["--tensor-parallel-size", "1"],
        &[
            " of 2: error: started as one of 2 processes with --tensor-parallel-size 1",
            "--enable-expert-parallel",
        ],
    );
    // Experts split by width stay resident: streaming them is refused.
    refused(&["--expert-cache-mib", "0"], &["stay resident"]);
    // A tensor-parallel size that does not match the processes, or one process asking for two.
    refused(
        &["--enable-expert-parallel", "--tensor-parallel-size", "3"],
        &["--tensor-parallel-size 3 with 2"],
    );
    // Context-parallel groups that do not divide the processes, or of one process asked to
    // split the experts.
    refused(
        &["--context-parallel-size", "3"],
        &["--context-parallel-size 3 with 2 processes: give a divisor of 2"],
    );
    refused(
        &["--context-parallel-size", "2", "--enable-expert-parallel"],
        &["groups of 1: each holds the whole model; start a multiple of 2 processes"],
    );
    let out = deepinfer(&[&base[..], &["--tensor-parallel-size", "2"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("mpirun -n 2"),
        "{err}"
    );
    // A checkpoint whose index leaves out a tensor its shard holds ends the job on every
    // rank (each sizes its memory from the index before loading; the first to end the job
    // is the one heard), naming the rank and the tensor, instead of rank 0 waiting for a
    // rank that cannot load.
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(&model).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let index = dir.path().join("model.safetensors.index.json");
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
    let map = json["weight_map"].as_object_mut().unwrap();
    assert!(map.remove("layers.1.ffn.experts.7.w2.weight").is_some());
    std::fs::write(&index, json.to_string()).unwrap();
    // The same under context parallelism, where every rank loads the whole model.
    for split in ["--enable-expert-parallel", "--context-parallel-size=2"] {
        let out = mpirun(2)
            .args(["generate", "--model", dir.path().to_str().unwrap()])
            .args(["--prompt-ids", "1,2", split])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{split}");
        assert!(
            err.contains(" of 2: error: loading")
                && err.contains("holds `layers.1.ffn.experts.7.w2.weight`"),
            "{split}: {err}"
        );
    }
}

#[test]
fn speculative_flags_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(
            golden("tiny-c").join("official").join(f),
            dir.path().join(f),
        )
        .unwrap();
    }
    let model = golden("tiny-c").join("official");
    for (model, spec, needle) in [
        (dir.path(), r#"{"method": "mtp"}"#, "MTP block"),
        (model.as_path(), r#"{"method": "eagle"}"#, "not supported"),
        (
            model.as_path(),
            r#"{"method": "mtp", "num_speculative_tokens": 0}"#,
            "positive",
        ),
        (model.as_path(), r#"{"method": "replay"}"#, "bench"),
    ] {
        let out = deepinfer(&[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3",
            "--speculative-config",
            spec,
        ]);
        assert!(!out.status.success(), "{spec}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{spec}: {err}");
    }
}

#[test]
fn stops_at_eos_unless_ignored() {
    // With this prompt tiny-c emits its EOS (id 1, from config.json) as the 5th token.
    let model = golden("tiny-c").join("official");
    let m = model.to_str().unwrap();
    let run = |extra: &[&str]| -> Vec<u64> {
        let mut args = vec![
            "generate",
            "--model",
            m,
            "--prompt-ids",
            "3,1,4,1,5",
            "--max-tokens",
            "16",
            "--json",
        ];
        args.extend(extra);
        let out = deepinfer(&args);
        assert!(out.status.success());
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    };
    let full = run(&["--ignore-eos"]);
    assert_eq!(full.len(), 16);
    let eos_at = full
        .iter()
        .position(|&t| t == 1)
        .expect("prompt chosen so that EOS appears");
    assert_eq!(run(&[]), full[..=eos_at].to_vec());
}

fn assert_fails(args: &[&str], needle: &str) {
    let out = deepinfer(args);
    assert!(!out.status.success(), "expected failure for {args:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(needle),
        "stderr {err:?} does not mention {needle:?}"
    );
    assert!(out.stdout.is_empty(), "nothing on stdout on error");
}

#[test]
fn bad_input_is_a_clear_error() {
    let model = golden("tiny-a").join("official");
    let m = model.to_str().unwrap();
    assert_fails(
        &[
            "generate",
            "--model",
            "/nonexistent/model",
            "--prompt-ids",
            "1,2",
            "--json",
        ],
        "/nonexistent/model",
    );
    assert_fails(
        &["generate", "--model", m, "--prompt-ids", "1,x,2", "--json"],
        "not a comma-separated list",
    );
    assert_fails(
        &[
            "generate",
            "--model",
            m,
            "--prompt-ids",
            "1,2",
            "--context-parallel-size",
            "2",
        ],
        "--context-parallel-size 2 needs 2 processes",
    );
    assert_fails(
        &[
            "generate",
            "--model",
            m,
            "--prompt-ids",
            "1,99999",
            "--json",
        ],
        "99999",
    );
    assert_fails(&["generate", "--model", m, "--json"], "--prompt-ids");
    assert_fails(
        &[
            "generate",
            "--model",
            m,
            "--prompt-ids",
            "1,2",
            "--prefill-chunk",
            "0",
        ],
        "prefill_chunk",
    );
    assert_fails(
        &[
            "generate",
            "--model",
            m,
            "--prompt-ids",
            "1,2",
            "--cache-budget-mib",
            "0",
        ],
        "--cache-budget-mib 0",
    );
}

/// Text prompts go through the checkpoint's tokenizer.json; the ids are what the Python
/// `tokenizers` package gives for the same file (DeepSeek-V4 tokenizer, add_special_tokens=False).
#[test]
fn text_prompts_use_the_checkpoint_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    let synth = deepinfer(&["synth", "--preset", "tiny", "--out", out.to_str().unwrap()]);
    assert!(
        synth.status.success(),
        "{}",
        String::from_utf8_lossy(&synth.stderr)
    );
    let m = out.to_str().unwrap();
    let run = deepinfer(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "Hello, world!",
        "--prompt",
        "DeepSeek-V4 推理引擎 🚀",
        "--max-tokens",
        "3",
        "--json",
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let want: [&[u32]; 2] = [
        &[19923, 14, 2058, 3],
        &[
            53091, 4374, 1465, 13582, 22, 223, 36101, 39032, 7351, 251, 225,
        ],
    ];
    for (line, w) in lines.iter().zip(want) {
        let got: Vec<u32> = line["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(got, w);
        assert_eq!(line["token_ids"].as_array().unwrap().len(), 3);
        assert!(line["text"].is_string());
    }
    // A checkpoint without tokenizer.json cannot take text prompts.
    let g = golden("tiny-a").join("official");
    assert_fails(
        &["generate", "--model", g.to_str().unwrap(), "--prompt", "hi"],
        "tokenizer.json",
    );
}

/// The default build carries no MPI: started by a launcher, it says which build would join
/// the job instead of running as one of N unaware single processes.
#[cfg(not(feature = "mpi"))]
#[test]
fn launched_without_mpi_support_says_how_to_build_it() {
    let model = golden("tiny-a").join("official");
    let out = Command::new(support::binary())
        .args(["generate", "--model", model.to_str().unwrap()])
        .args(["--prompt-ids", "1,2"])
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("one of 2 processes") && err.contains("--features mpi"),
        "{err}"
    );
    assert_eq!(err.matches("--features mpi").count(), 1, "said once: {err}");
}
