//! The default memory split in a real memory cgroup (a container's limit): `generate`
//! started inside a cgroup of 1 GiB reads that limit, not the machine's memory, and says on
//! one stderr line how it split it between the weights and the cache pools.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A memory cgroup (v1) of `limit` bytes under the machine's hierarchy, removed on drop;
/// `None` where this process may not create one (not root, or no writable v1 memory
/// controller).
struct Cgroup(PathBuf);

impl Cgroup {
    fn new(limit: u64) -> Option<Self> {
        let root = Path::new("/sys/fs/cgroup/memory");
        let dir = root.join(format!("deepinfer-test-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let cg = Cgroup(dir);
        std::fs::write(cg.0.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
        Some(cg)
    }

    /// Runs `args` of the binary inside the cgroup.
    fn run(&self, args: &[&str]) -> Output {
        let procs = self.0.join("cgroup.procs");
        let script = format!("echo $$ > {} && exec \"$0\" \"$@\"", procs.display());
        Command::new("sh")
            .args(["-c", &script, env!("CARGO_BIN_EXE_deepinfer")])
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn the_default_split_follows_the_cgroups_limit() {
    let Some(cg) = Cgroup::new(1 << 30) else {
        eprintln!("skipped: no writable memory cgroup here (needs root and cgroup v1 memory)");
        return;
    };
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/golden/tiny-a/official"
    );
    let out = cg.run(&[
        "generate",
        "--model",
        model,
        "--prompt-ids",
        "1,2",
        "--max-tokens",
        "2",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("memory: "))
        .unwrap_or_else(|| panic!("no memory line: {err}"));
    // 1 GiB less what the shell and the loader already use: the margin is 512 MiB + 5 %,
    // the cache pools get their 256 MiB floor (a quarter of the rest is less), the weights
    // (7 MB) stay resident.
    let avail: u64 = number_after(line, "(").expect(line);
    assert!((900..=1024).contains(&avail), "{line}");
    // Each figure is its byte count floored to whole MiB, so they agree to within 1 MiB.
    let margin = number_after(line, "less a ").expect(line);
    assert!(
        (512 + avail / 20..=513 + avail / 20).contains(&margin),
        "{line}"
    );
    let usable = number_after(line, "of the ").expect(line);
    assert!((avail - 1..=avail).contains(&(usable + margin)), "{line}");
    assert!(
        line.contains("resident, the cache pools 256 MiB for up to 64 sequences"),
        "{line}"
    );
}

/// The number right after the first `marker` in `line`.
fn number_after(line: &str, marker: &str) -> Option<u64> {
    let rest = &line[line.find(marker)? + marker.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}
