//! `--model org/name`: a Hugging Face repo id resolved from a cache laid out as the hub
//! client lays it out (`models--org--name/{refs,snapshots,blobs}`), found through
//! `HF_HUB_CACHE` or `HF_HOME`, at a branch, tag or commit; downloaded into that cache from a
//! hub (here a local stand-in speaking the hub's API) when missing; a clear error when
//! `HF_HUB_OFFLINE` forbids the download or the hub cannot be reached.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ID: &str = "deepinfer-test/tiny-a";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn tiny_a() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden/tiny-a/official")
}

/// The checkpoint's files, name and bytes.
fn files() -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(tiny_a())
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Lays `files()` out in `cache` as the hub client does: blobs named by etag, a snapshot
/// of relative symlinks to them, and refs naming the commit.
fn lay_out_cache(cache: &Path, refs: &[&str]) {
    let repo = cache.join(format!("models--{}", ID.replace('/', "--")));
    let snap = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    for (name, bytes) in files() {
        let etag = etag(&name);
        std::fs::write(repo.join("blobs").join(&etag), bytes).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{etag}"), snap.join(&name)).unwrap();
    }
    for r in refs {
        std::fs::write(repo.join("refs").join(r), COMMIT).unwrap();
    }
}

/// A blob name for a file (the hub uses the sha256 of LFS files, a git hash of others).
fn etag(name: &str) -> String {
    let h = name.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    });
    format!("{h:016x}")
}

/// `generate --model ID` on two prompts with `env` set (and every hub variable of this
/// process's environment cleared): its greedy tokens, or its stderr on failure.
fn generate(extra: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_deepinfer"));
    cmd.args([
        "generate",
        "--model",
        ID,
        "--prompt-ids",
        "5,17,42",
        "--max-tokens",
        "6",
    ])
    .args(["--json"])
    .args(extra);
    for var in [
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HOME",
        "HF_HUB_OFFLINE",
        "HF_ENDPOINT",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// What the local checkpoint directory gives for the same prompt.
fn expected() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_deepinfer"))
        .args(["generate", "--model", tiny_a().to_str().unwrap()])
        .args(["--prompt-ids", "5,17,42", "--max-tokens", "6", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

fn ok(out: Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_repo_id_resolves_from_the_hub_cache_offline() {
    let want = expected();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("hub");
    lay_out_cache(&cache, &["main", "v1"]);
    let offline = Path::new("1");
    // HF_HUB_CACHE names the cache itself, HF_HOME its parent.
    let by_cache = [
        ("HF_HUB_CACHE", cache.as_path()),
        ("HF_HUB_OFFLINE", offline),
    ];
    assert_eq!(ok(generate(&[], &by_cache)), want);
    let by_home = [("HF_HOME", dir.path()), ("HF_HUB_OFFLINE", offline)];
    assert_eq!(ok(generate(&[], &by_home)), want);
    // A tag, and a commit that no ref names.
    assert_eq!(ok(generate(&["--revision", "v1"], &by_cache)), want);
    assert_eq!(ok(generate(&["--revision", COMMIT], &by_cache)), want);
    // A revision the cache does not hold, offline: the error says where it looked and why.
    let out = generate(&["--revision", "v2"], &by_cache);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        format!(
            "error: --model {ID} (revision v2) is not in the Hugging Face cache {} and \
             HF_HUB_OFFLINE is set: download it there first (`huggingface-cli download {ID}`), \
             or unset HF_HUB_OFFLINE",
            cache.display()
        )
    );
}

/// A stand-in for the hub on loopback: the repo's info and its files by range, as the hub
/// answers them (a commit header, an etag, `Content-Range`).
fn fake_hub() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let files = files();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            reader.read_line(&mut request).unwrap();
            let mut range = (0usize, None);
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line.trim().is_empty() {
                    break;
                }
                if let Some(r) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    let (a, b) = r.trim().split_once('-').unwrap();
                    range = (a.parse().unwrap(), b.parse::<usize>().ok());
                }
            }
            let path = request.split_whitespace().nth(1).unwrap_or("").to_string();
            let response = answer(&files, &path, range);
            let _ = stream.write_all(&response);
            let _ = reader.read(&mut [0u8; 0]);
        }
    });
    format!("http://{addr}")
}

/// The hub's answer to `GET path` for the bytes `range` asks (`Range: bytes=a-b` or `a-`).
fn answer(files: &[(String, Vec<u8>)], path: &str, range: (usize, Option<usize>)) -> Vec<u8> {
    if path == format!("/api/models/{ID}/revision/main") {
        let siblings: Vec<String> = files
            .iter()
            .map(|(n, _)| format!("{{\"rfilename\": \"{n}\"}}"))
            .chain(["{\"rfilename\": \"README.md\"}".to_string()])
            .collect();
        let body = format!(
            "{{\"sha\": \"{COMMIT}\", \"siblings\": [{}]}}",
            siblings.join(",")
        );
        return http(200, &[], body.as_bytes());
    }
    let prefix = format!("/{ID}/resolve/main/");
    let Some((name, bytes)) = path
        .strip_prefix(&prefix)
        .and_then(|f| files.iter().find(|(n, _)| n == f))
    else {
        return http(404, &[], b"not found");
    };
    let (start, end) = (range.0, range.1.map_or(bytes.len(), |b| b + 1));
    let headers = [
        format!("x-repo-commit: {COMMIT}"),
        format!("etag: \"{}\"", etag(name)),
        format!("content-range: bytes {start}-{}/{}", end - 1, bytes.len()),
    ];
    http(206, &headers, &bytes[start..end])
}

fn http(status: u16, headers: &[String], body: &[u8]) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

#[test]
fn a_missing_repo_is_downloaded_into_the_cache_once() {
    let want = expected();
    let dir = tempfile::tempdir().unwrap();
    let hub = fake_hub();
    let env = [
        ("HF_HUB_CACHE", dir.path()),
        ("HF_ENDPOINT", Path::new(&hub)),
    ];
    assert_eq!(ok(generate(&[], &env)), want);
    // Laid out as the hub client lays it out, so the next run needs no network.
    let repo = dir
        .path()
        .join(format!("models--{}", ID.replace('/', "--")));
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        COMMIT
    );
    for (name, _) in files() {
        let link = repo.join("snapshots").join(COMMIT).join(&name);
        assert!(link.is_symlink() && link.is_file(), "{}", link.display());
    }
    assert!(!repo
        .join("snapshots")
        .join(COMMIT)
        .join("README.md")
        .exists());
    let offline = [
        ("HF_HUB_CACHE", dir.path()),
        ("HF_HUB_OFFLINE", Path::new("1")),
    ];
    assert_eq!(ok(generate(&[], &offline)), want);
}

#[test]
fn an_unreachable_hub_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let endpoint = format!("http://{closed}");
    let env = [
        ("HF_HUB_CACHE", dir.path()),
        ("HF_ENDPOINT", Path::new(&endpoint)),
    ];
    let out = generate(&[], &env);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let head = format!(
        "error: --model {ID} (revision main) is not in the Hugging Face cache {} and cannot be \
         downloaded (",
        dir.path().display()
    );
    assert!(err.starts_with(&head), "{err}");
    assert!(
        err.trim_end().ends_with(
            "check the id and the network, or download it there first (`huggingface-cli \
             download deepinfer-test/tiny-a`) or give a local directory"
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
