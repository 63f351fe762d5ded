//! Tokenizer: a thin wrapper over HF `tokenizers` loaded from a checkpoint directory, plus the
//! streaming pieces the server needs — an incremental detokenizer (vLLM / TGI "prefix offset /
//! read offset" algorithm) and a stop-string matcher for the text stream.

mod bytes;
mod gguf;
mod incremental;
mod stop;

pub use bytes::logprob_token_text;

pub use incremental::IncrementalDetokenizer;
pub use stop::{StopSet, StopStrings};

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File name of the HF fast-tokenizer definition inside a checkpoint directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// File name of the HF tokenizer config (bos/eos strings, `add_bos_token`).
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// Errors from loading or running the tokenizer. Load errors name the file.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse {path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot load tokenizer from {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("{path}: token {token:?} ({field}) is not in the vocabulary")]
    UnknownSpecialToken {
        path: PathBuf,
        field: &'static str,
        token: String,
    },
    #[error("tokenization failed: {0}")]
    Encode(String),
    #[error("detokenization failed: {0}")]
    Decode(String),
}

/// A loaded tokenizer. Cheap to clone (the vocabulary is shared).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    add_bos_token: bool,
    add_eos_token: bool,
    /// Added tokens (markers, BOS/EOS): their text is their content, not byte-level symbols.
    added: Arc<HashSet<u32>>,
    /// Whether the vocabulary spells bytes as GPT-2's byte-level symbols (the decoder is
    /// `ByteLevel`), so a token's exact bytes can be read off its string.
    byte_level: bool,
    /// See [`Tokenizer::max_token_bytes`].
    max_token_bytes: Option<usize>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("add_bos_token", &self.add_bos_token)
            .field("add_eos_token", &self.add_eos_token)
            .finish()
    }
}

/// `bos_token` / `eos_token` in `tokenizer_config.json` are either a plain string or an
/// `AddedToken` object with a `content` field.
fn config_token(config: &serde_json::Value, field: &str) -> Option<String> {
    match config.get(field)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` and (if present) `tokenizer_config.json` from a checkpoint
    /// directory. A missing config means no bos/eos and no automatic bos/eos insertion.
    /// A GGUF file (or a directory of GGUF files without a `tokenizer.json`) gives the
    /// tokenizer its metadata describes ([`gguf`]).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let dir = dir.as_ref();
        if dir.is_file() || !dir.join(TOKENIZER_FILE).exists() {
            if let Some(tok) = Self::from_gguf(dir)? {
                return Ok(tok);
            }
        }
        let mut tok = Self::from_file(dir.join(TOKENIZER_FILE))?;
        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        if config_path.exists() {
            let text =
                std::fs::read_to_string(&config_path).map_err(|source| TokenizerError::Io {
                    path: config_path.clone(),
                    source,
                })?;
            let config: serde_json::Value =
                serde_json::from_str(&text).map_err(|source| TokenizerError::Json {
                    path: config_path.clone(),
                    source,
                })?;
            let lookup = |field: &'static str| -> Result<Option<u32>, TokenizerError> {
                match config_token(&config, field) {
                    None => Ok(None),
                    Some(token) => match tok.token_to_id(&token) {
                        Some(id) => Ok(Some(id)),
                        None => Err(TokenizerError::UnknownSpecialToken {
                            path: config_path.clone(),
                            field,
                            token,
                        }),
                    },
                }
            };
            let (bos_id, eos_id) = (lookup("bos_token")?, lookup("eos_token")?);
            tok.bos_id = bos_id;
            tok.eos_id = eos_id;
            let flag = |field: &str| config.get(field).and_then(|v| v.as_bool()).unwrap_or(false);
            tok.add_bos_token = flag("add_bos_token");
            tok.add_eos_token = flag("add_eos_token");
        }
        Ok(tok)
    }

    /// The tokenizer of the GGUF checkpoint at `path`, `None` if it is not one.
    fn from_gguf(path: &Path) -> Result<Option<Self>, TokenizerError> {
        use deepinfer_model::checkpoint::{gguf::is_gguf, Checkpoint};
        let is_one = is_gguf(path)
            || (path.is_dir()
                && std::fs::read_dir(path).is_ok_and(|mut d| {
                    d.any(|e| e.is_ok_and(|e| e.path().extension().is_some_and(|x| x == "gguf")))
                }));
        if !is_one {
            return Ok(None);
        }
        let ck = Checkpoint::open(path).map_err(|e| TokenizerError::Load {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let Some(meta) = ck.gguf_metadata() else {
            return Ok(None);
        };
        let json = gguf::tokenizer_json(meta, path)?;
        let mut tok = Self::from_bytes(&json.to_string().into_bytes(), path)?;
        (tok.bos_id, tok.eos_id, tok.add_bos_token, tok.add_eos_token) = gguf::specials(meta);
        Ok(Some(tok))
    }

    /// Loads a `tokenizer.json` alone (no bos/eos information).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_bytes(&bytes, path)
    }

    /// A `tokenizer.json` body, read from `path` (for messages).
    fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| TokenizerError::Load {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let added = inner.get_added_tokens_decoder().into_keys().collect();
        let byte_level = matches!(
            inner.get_decoder(),
            Some(tokenizers::decoders::DecoderWrapper::ByteLevel(_))
        );
        let normalizes = inner.get_normalizer().is_some_and(|n| {
            let v = serde_json::to_value(n).unwrap_or_default();
            v.get("normalizers")
                .and_then(|list| list.as_array())
                .is_none_or(|list| !list.is_empty())
        });
        let mut tok = Self {
            inner: Arc::new(inner),
            bos_id: None,
            eos_id: None,
            add_bos_token: false,
            add_eos_token: false,
            added: Arc::new(added),
            byte_level,
            max_token_bytes: None,
        };
        if !normalizes {
            let longest = (0..tok.vocab_size() as u32)
                .map(|id| tok.token_bytes(id).len())
                .max();
            tok.max_token_bytes = longest;
        }
        Ok(tok)
    }

    /// The most bytes of text one token stands for, when the tokenizer splits the text as
    /// given (no normaliser that could shrink it): a text of B bytes then has at least
    /// B / this many tokens. `None` when that does not hold.
    pub fn max_token_bytes(&self) -> Option<usize> {
        self.max_token_bytes
    }

    /// Encodes `text`. Added tokens written in the text (`<｜User｜>`, `<think>` …) become single
    /// tokens whatever `add_special_tokens` says; `add_special_tokens` only controls the
    /// post-processor and the config's `add_bos_token` / `add_eos_token` (a bos/eos is not
    /// added twice).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let mut ids = encoding.get_ids().to_vec();
        if add_special_tokens {
            if let (true, Some(bos)) = (self.add_bos_token, self.bos_id) {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
            if let (true, Some(eos)) = (self.add_eos_token, self.eos_id) {
                if ids.last() != Some(&eos) {
                    ids.push(eos);
                }
            }
        }
        Ok(ids)
    }

    /// Decodes `ids` to text. Unknown ids are skipped (as HF does).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        // The byte-level decoder cannot fail; keep a fallible variant for other decoders.
        self.try_decode(ids, skip_special_tokens)
            .unwrap_or_else(|_| String::new())
    }

    /// Decodes `ids` to text, reporting decoder errors.
    pub fn try_decode(
        &self,
        ids: &[u32],
        skip_special_tokens: bool,
    ) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// The id of a token string (model vocabulary or added token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of an id (byte-level form, e.g. `Ġhello`), if the id exists.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The exact bytes token `id` stands for: with a byte-level vocabulary, the bytes its
    /// symbols spell, even when they hold only part of a UTF-8 character (which decoding the
    /// id alone would turn into U+FFFD); an added token's content; otherwise its decoded
    /// text. Empty for an unknown id.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        if self.byte_level && !self.added.contains(&id) {
            if let Some(b) = self
                .id_to_token(id)
                .and_then(|t| bytes::byte_level_bytes(&t))
            {
                return b;
            }
        }
        if self.added.contains(&id) {
            if let Some(t) = self.id_to_token(id) {
                return t.into_bytes();
            }
        }
        self.decode(&[id], false).into_bytes()
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Beginning-of-sequence id from `tokenizer_config.json`.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// End-of-sequence id from `tokenizer_config.json`.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Whether `encode(_, true)` prepends the bos token (`add_bos_token` in the config).
    pub fn add_bos_token(&self) -> bool {
        self.add_bos_token
    }

    /// The wrapped HF tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
