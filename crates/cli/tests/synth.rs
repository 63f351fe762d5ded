//! `deepinfer synth` end to end: writes a loadable checkpoint, protects existing directories,
//! and names the presets it knows.

use std::path::Path;
use std::process::{Command, Output};

use deepinfer_model::config::ModelConfig;

fn deepinfer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deepinfer"))
        .args(args)
        .output()
        .expect("binary runs")
}

fn synth(out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["synth", "--preset", "tiny", "--out", out.to_str().unwrap()];
    args.extend(extra);
    deepinfer(&args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn writes_tiny_and_refuses_to_overwrite_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("tiny");
    let first = synth(&out, &["--seed", "5"]);
    assert!(first.status.success(), "stderr: {}", stderr(&first));
    for f in [
        "config.json",
        "model.safetensors.index.json",
        "model-00001-of-00001.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let cfg = ModelConfig::from_file(&out.join("config.json")).unwrap();
    assert_eq!(cfg.vocab_size, 129_280);
    let shard = std::fs::read(out.join("model-00001-of-00001.safetensors")).unwrap();

    let again = synth(&out, &["--seed", "5"]);
    assert!(!again.status.success(), "overwrote a non-empty directory");
    let msg = stderr(&again);
    assert!(
        msg.contains("not empty") && msg.contains("--force"),
        "{msg}"
    );

    // A stray shard from an earlier, differently sharded run must not survive --force.
    std::fs::write(out.join("model-00002-of-00002.safetensors"), b"stale").unwrap();
    let forced = synth(&out, &["--seed", "5", "--force"]);
    assert!(forced.status.success(), "stderr: {}", stderr(&forced));
    assert!(!out.join("model-00002-of-00002.safetensors").exists());
    let rewritten = std::fs::read(out.join("model-00001-of-00001.safetensors")).unwrap();
    assert!(rewritten == shard, "same seed, same bytes");
}

#[test]
fn unknown_preset_lists_the_known_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let o = deepinfer(&[
        "synth",
        "--preset",
        "huge",
        "--out",
        tmp.path().join("x").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let msg = stderr(&o);
    assert!(
        msg.contains("huge") && msg.contains("tiny") && msg.contains("bench"),
        "{msg}"
    );
    assert!(!tmp.path().join("x").exists(), "nothing written");
}

#[test]
fn help_lists_and_describes_every_preset() {
    let o = deepinfer(&["synth", "--help"]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for name in deepinfer_model::synth::PRESETS {
        // Described in the flag's text (`name`) and listed among its values.
        assert!(
            help.contains(&format!("`{name}`")),
            "{name} undescribed:\n{help}"
        );
        let values = help
            .split("[possible values: ")
            .nth(1)
            .unwrap_or_else(|| panic!("no value list:\n{help}"));
        let values = &values[..values.find(']').unwrap()];
        assert!(
            values.split(", ").any(|v| v == *name),
            "{name} not listed:\n{help}"
        );
    }
}
