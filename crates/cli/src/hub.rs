//! `--model org/name`: a Hugging Face repo id, as vLLM, SGLang and llama.cpp take it.
//!
//! Resolved offline first, from the local Hugging Face cache as the hub client lays it out
//! (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`; in it
//! `models--org--name/refs/REVISION` names a commit whose files are under
//! `snapshots/COMMIT/`). What the cache lacks is downloaded through the `hf-hub` crate into
//! the same cache, with a progress bar, unless `HF_HUB_OFFLINE` forbids it.

use anyhow::{bail, Context, Result};
use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Repo, RepoType};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The checkpoint `--model` names: an existing directory or GGUF file as it is, else a repo
/// id resolved through the Hugging Face cache.
pub fn resolve(model: &Path, revision: Option<&str>) -> Result<PathBuf> {
    let gguf = model.is_file() && model.extension().is_some_and(|e| e == "gguf");
    if model.is_dir() || gguf {
        if let Some(rev) = revision {
            bail!("--revision {rev} applies to a Hugging Face repo id, not to the directory --model {}", model.display());
        }
        return Ok(model.to_path_buf());
    }
    let Some(id) = model.to_str().filter(|s| is_repo_id(s)) else {
        bail!(
            "--model {}: no such directory or .gguf file, and not a Hugging Face repo id \
             (org/name)",
            model.display()
        );
    };
    let revision = revision.unwrap_or("main");
    let cache = cache_dir()?;
    let repo = RepoCache::new(&cache, id);
    if let Some(dir) = repo.complete_snapshot(revision) {
        return Ok(dir);
    }
    if offline() {
        bail!(
            "--model {id} (revision {revision}) is not in the Hugging Face cache {} and \
             HF_HUB_OFFLINE is set: download it there first (`huggingface-cli download {id}`), \
             or unset HF_HUB_OFFLINE",
            cache.display()
        );
    }
    download(&cache, id, revision)
}

/// `org/name`: two non-empty parts of the characters the hub allows.
fn is_repo_id(s: &str) -> bool {
    let ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with(['.', '-'])
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    matches!(s.split_once('/'), Some((org, name)) if ok(org) && ok(name))
}

/// The hub cache directory, as the `huggingface_hub` client finds it.
fn cache_dir() -> Result<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        return Ok(dir);
    }
    if let Some(home) = var("HF_HOME") {
        return Ok(home.join("hub"));
    }
    let base = var("XDG_CACHE_HOME")
        .or_else(|| var("HOME").map(|h| h.join(".cache")))
        .context("cannot find the Hugging Face cache: set HF_HUB_CACHE or HF_HOME")?;
    Ok(base.join("huggingface").join("hub"))
}

/// `HF_HUB_OFFLINE` set to a true value (as the hub client reads it).
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "on" | "yes" | "true"
            )
        })
        .unwrap_or(false)
}

/// One repo's folder in the hub cache.
struct RepoCache {
    dir: PathBuf,
}

impl RepoCache {
    fn new(cache: &Path, id: &str) -> Self {
        Self {
            dir: cache.join(format!("models--{}", id.replace('/', "--"))),
        }
    }

    /// The snapshot `revision` names (a branch or tag in `refs/`, or a commit hash), when
    /// it holds a whole checkpoint: its config and every shard its index lists.
    fn complete_snapshot(&self, revision: &str) -> Option<PathBuf> {
        let commit = std::fs::read_to_string(self.dir.join("refs").join(revision))
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| revision.to_string());
        let snap = self.dir.join("snapshots").join(commit);
        complete(&snap).then_some(snap)
    }
}

/// Whether `dir` holds a loadable checkpoint: `config.json` and either an index whose
/// every shard is present or at least one `*.safetensors` file.
fn complete(dir: &Path) -> bool {
    if !dir.join("config.json").is_file() {
        return false;
    }
    match std::fs::read_to_string(dir.join("model.safetensors.index.json")) {
        Ok(text) => shards(&text).is_some_and(|s| s.iter().all(|f| dir.join(f).is_file())),
        Err(_) => std::fs::read_dir(dir).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        }),
    }
}

/// The shard files a `model.safetensors.index.json` lists.
fn shards(index: &str) -> Option<Vec<String>> {
    let json: Value = serde_json::from_str(index).ok()?;
    let mut files: Vec<String> = json
        .get("weight_map")?
        .as_object()?
        .values()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    files.sort();
    files.dedup();
    Some(files)
}

/// The files of a repo a checkpoint needs: the top-level JSON and tokenizer files and every
/// safetensors file (an index's shards and files beside it, such as `mtp.safetensors`).
fn wanted(file: &str) -> bool {
    !file.contains('/') && (file.ends_with(".json") || file.ends_with(".safetensors"))
}

/// Downloads `id` at `revision` into the cache (each file once, with a progress bar) and
/// returns its snapshot directory.
fn download(cache: &Path, id: &str, revision: &str) -> Result<PathBuf> {
    let mut builder = ApiBuilder::new()
        .with_cache_dir(cache.to_path_buf())
        .with_progress(true);
    if let Ok(endpoint) = std::env::var("HF_ENDPOINT") {
        builder = builder.with_endpoint(endpoint);
    }
    if let Ok(token) = std::env::var("HF_TOKEN") {
        builder = builder.with_token(Some(token));
    }
    let api = builder
        .build()
        .context("starting the Hugging Face client")?;
    let repo = api.repo(Repo::with_revision(
        id.to_string(),
        RepoType::Model,
        revision.to_string(),
    ));
    let unreachable = |e: hf_hub::api::sync::ApiError| {
        anyhow::anyhow!(
            "--model {id} (revision {revision}) is not in the Hugging Face cache {} and cannot \
             be downloaded ({e}): check the id and the network, or download it there first \
             (`huggingface-cli download {id}`) or give a local directory",
            cache.display()
        )
    };
    let info = repo.info().map_err(unreachable)?;
    let files: Vec<&str> = info
        .siblings
        .iter()
        .map(|s| s.rfilename.as_str())
        .filter(|f| wanted(f))
        .collect();
    if !files.contains(&"config.json") {
        bail!("--model {id} (revision {revision}) has no config.json: not a checkpoint this engine loads");
    }
    eprintln!(
        "downloading {id} ({} files) into {}",
        files.len(),
        cache.display()
    );
    let mut snapshot = None;
    for f in files {
        let path = repo.get(f).map_err(unreachable)?;
        snapshot = path.parent().map(Path::to_path_buf);
    }
    snapshot.context("the download wrote no file")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_are_told_from_paths() {
        for id in ["deepseek-ai/DeepSeek-V4-Flash", "org/name", "a.b/c_d-1"] {
            assert!(is_repo_id(id), "{id}");
        }
        for not in [
            "",
            "name",
            "/abs/path",
            "a/b/c",
            "./x",
            "../x/y",
            "org/",
            "/name",
            "o r/g",
        ] {
            assert!(!is_repo_id(not), "{not}");
        }
    }

    #[test]
    fn only_top_level_checkpoint_files_are_wanted() {
        assert!(wanted("config.json"));
        assert!(wanted("model-00001-of-00046.safetensors"));
        assert!(wanted("tokenizer.json"));
        assert!(!wanted("inference/config.json"));
        assert!(!wanted("README.md"));
        assert!(!wanted("figures/x.png"));
    }
}
