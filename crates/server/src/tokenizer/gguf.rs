//! The tokenizer a GGUF file carries in its `tokenizer.ggml.*` metadata, rebuilt as the
//! `tokenizer.json` it was converted from (llama.cpp's `_set_vocab_gpt2` writes the tokens,
//! their types and the merges; the pre-tokenizer is named by `tokenizer.ggml.pre`).
//!
//! The ids are the repository tokenizer's: the vocabulary and merges are copied in order, and
//! the pre-tokenizer of `joyai-llm` (how llama.cpp 0c1e570 names V4's, `src/llama-vocab.cpp`)
//! is V4's `tokenizer.json` one, regex for regex. One difference is known and harmless to
//! ids: the converter marks as CONTROL every added token that looks special (`<｜User｜>`
//! …), 47 of which `tokenizer.json` does not flag `special`, so decoding with special tokens
//! skipped drops those too.

use std::path::Path;

use deepinfer_model::checkpoint::gguf::{Metadata, Value};
use serde_json::{json, Value as Json};

use super::TokenizerError;

/// V4's pre-tokenizer regexes (`tokenizer.json`'s `Split`s, the same three llama.cpp runs for
/// `joyai-llm` and `deepseek-v3`).
const V4_SPLITS: [&str; 3] = [
    r"\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];

/// gguf-py's `TokenType`: what the converter records for each token.
const CONTROL: u64 = 3;
const USER_DEFINED: u64 = 4;

fn load_err(path: &Path, message: impl Into<String>) -> TokenizerError {
    TokenizerError::Load {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn strings<'a>(meta: &'a Metadata, key: &str, path: &Path) -> Result<Vec<&'a str>, TokenizerError> {
    let items = meta
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| load_err(path, format!("the GGUF metadata has no `{key}` array")))?;
    items
        .iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| load_err(path, format!("`{key}` holds a {}", v.kind())))
        })
        .collect()
}

fn pre_tokenizer(pre: &str, path: &Path) -> Result<Json, TokenizerError> {
    match pre {
        "joyai-llm" | "deepseek-v3" => {
            let mut seq: Vec<Json> = V4_SPLITS
                .iter()
                .map(|re| {
                    json!({"type": "Split", "pattern": {"Regex": re},
                           "behavior": "Isolated", "invert": false})
                })
                .collect();
            seq.push(json!({"type": "ByteLevel", "add_prefix_space": false,
                            "trim_offsets": true, "use_regex": false}));
            Ok(json!({"type": "Sequence", "pretokenizers": seq}))
        }
        other => Err(load_err(
            path,
            format!(
                "`tokenizer.ggml.pre` is {other:?}; deepinfer knows DeepSeek-V4's \
                 (\"joyai-llm\", \"deepseek-v3\")"
            ),
        )),
    }
}

/// The `tokenizer.json` that `meta` (a GGUF file's metadata, read from `path`) describes.
pub(super) fn tokenizer_json(meta: &Metadata, path: &Path) -> Result<Json, TokenizerError> {
    let model = meta.get("tokenizer.ggml.model").and_then(Value::as_str);
    if model != Some("gpt2") {
        return Err(load_err(
            path,
            format!("`tokenizer.ggml.model` is {model:?}; V4's is byte-level BPE (\"gpt2\")"),
        ));
    }
    let pre = meta.get("tokenizer.ggml.pre").and_then(Value::as_str);
    let pre = pre_tokenizer(pre.unwrap_or("default"), path)?;
    let tokens = strings(meta, "tokenizer.ggml.tokens", path)?;
    let merges = strings(meta, "tokenizer.ggml.merges", path)?;
    let types = meta
        .get("tokenizer.ggml.token_type")
        .and_then(Value::as_array);
    let type_of = |i: usize| types.and_then(|t| t.get(i)).and_then(Value::as_u64);
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, &t) in tokens.iter().enumerate() {
        if vocab.insert(t.to_string(), json!(id)).is_some() {
            return Err(load_err(
                path,
                format!("token {t:?} appears twice in the vocabulary"),
            ));
        }
        let ty = type_of(id);
        if matches!(ty, Some(CONTROL | USER_DEFINED)) {
            added.push(
                json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false,
                              "special": ty == Some(CONTROL)}),
            );
        }
    }
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": []},
        "pre_tokenizer": pre,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true,
                           "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": merges},
    }))
}

/// `(bos, eos, add_bos, add_eos)` as the metadata states them.
pub(super) fn specials(meta: &Metadata) -> (Option<u32>, Option<u32>, bool, bool) {
    let id = |k: &str| meta.get(k).and_then(Value::as_u64).map(|v| v as u32);
    let flag = |k: &str| meta.get(k).and_then(Value::as_bool).unwrap_or(false);
    (
        id("tokenizer.ggml.bos_token_id"),
        id("tokenizer.ggml.eos_token_id"),
        flag("tokenizer.ggml.add_bos_token"),
        flag("tokenizer.ggml.add_eos_token"),
    )
}
