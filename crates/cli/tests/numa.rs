//! `--threads`, `--cpu-affinity` and `--numa` end to end: the binary run on a fake sysfs
//! tree of two NUMA nodes (`DEEPINFER_TOPOLOGY`) seats its threads one node each, spreads
//! the weights between them, and prints the tokens and log-probabilities of the plain
//! run; bad flags fail naming the flag.

use deepinfer_model::kernels::numa::topology::{allowed_cpus, parse_cpu_list};
use std::path::Path;
use std::process::{Command, Output};

fn deepinfer(args: &[&str], topology: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_deepinfer"));
    cmd.args(args);
    if let Some(root) = topology {
        cmd.env("DEEPINFER_TOPOLOGY", root);
    }
    cmd.output().expect("binary runs")
}

/// A sysfs tree splitting this process's first two usable cores into two nodes.
fn two_node_tree(root: &Path) -> (usize, usize) {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let online = parse_cpu_list(&online).unwrap();
    let usable: Vec<usize> = match allowed_cpus() {
        Some(a) => online.into_iter().filter(|c| a.contains(c)).collect(),
        None => online,
    };
    assert!(
        usable.len() >= 2,
        "the test needs two cores, has {usable:?}"
    );
    let (a, b) = (usable[0], usable[1]);
    let cpu = root.join("sys/devices/system/cpu");
    std::fs::create_dir_all(&cpu).unwrap();
    std::fs::write(cpu.join("online"), format!("{a},{b}\n")).unwrap();
    for (n, c) in [(0, a), (1, b)] {
        let dir = root.join(format!("sys/devices/system/node/node{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cpulist"), format!("{c}\n")).unwrap();
    }
    (a, b)
}

fn generate(model: &Path, extra: &[&str], topology: Option<&Path>) -> (String, String) {
    let mut args = vec![
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        "1,17,4242,99999,7,7,7,300,12000",
        "--prompt-ids",
        "5,6",
        "--max-tokens",
        "6",
        "--top-logprobs",
        "5",
        "--ignore-eos",
        "--json",
    ];
    args.extend(extra);
    let out = deepinfer(&args, topology);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "stderr: {stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

#[test]
fn two_simulated_nodes_print_the_plain_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    let out = deepinfer(
        &[
            "synth",
            "--preset",
            "tiny",
            "--out",
            model.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let root = dir.path().join("sysfs");
    let (a, b) = two_node_tree(&root);

    let (plain, _) = generate(&model, &["--threads", "2", "--numa", "off"], None);
    let (placed, stderr) = generate(&model, &["--threads", "2"], Some(&root));
    assert!(
        stderr.contains("threads: 2 compute threads (node 0: 1, node 1: 1), each kept to its node's cores; weights spread over the nodes"),
        "{stderr}"
    );
    assert_eq!(placed, plain, "two nodes changed the output");
    let list = format!("{b},{a}");
    let (pinned, stderr) = generate(&model, &["--cpu-affinity", &list], Some(&root));
    assert!(stderr.contains("each pinned to a core"), "{stderr}");
    assert_eq!(pinned, plain, "pinned threads changed the output");
    let (one, _) = generate(&model, &["--threads", "1"], None);
    assert_eq!(one, plain, "one thread changed the output");
}

#[test]
fn bad_thread_flags_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("sysfs");
    let (a, _) = two_node_tree(&root);
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden/tiny-a/official");
    let model = model.to_str().unwrap();
    let run = |extra: &[&str], topo: Option<&Path>| {
        let mut args = vec![
            "generate",
            "--model",
            model,
            "--prompt-ids",
            "1,2",
            "--max-tokens",
            "1",
        ];
        args.extend(extra);
        let out = deepinfer(&args, topo);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let e = run(&["--threads", "0"], None);
    assert!(e.contains("--threads 0"), "{e}");
    let e = run(&["--cpu-affinity", "0-x"], None);
    assert!(e.contains("--cpu-affinity") && e.contains("0-x"), "{e}");
    let e = run(&["--cpu-affinity", "9999"], Some(&root));
    assert!(e.contains("--cpu-affinity: CPU 9999"), "{e}");
    let twice = format!("{a},{a}");
    let e = run(&["--cpu-affinity", &twice], Some(&root));
    assert!(e.contains("named twice"), "{e}");
    let e = run(&["--numa", "spread"], None);
    assert!(
        e.contains("--numa") && e.contains("off or distribute"),
        "{e}"
    );
    std::fs::write(root.join("sys/devices/system/node/node1/cpulist"), "1-").unwrap();
    let e = run(&[], Some(&root));
    assert!(
        e.contains("DEEPINFER_TOPOLOGY") && e.contains("node1/cpulist"),
        "{e}"
    );
}
