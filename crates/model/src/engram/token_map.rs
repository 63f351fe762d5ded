//! Token id -> compressed id: tokens that read alike once normalised share one id.
//!
//! Engram hashes n-grams over these ids, so " The", "the" and "THE" look up the same rows. The
//! map must equal the one the tables were trained with (vLLM's `build_compressed_token_map`):
//! each token's raw decode (no cleanup of tokenisation spaces) goes through
//! NFKC -> NFD -> strip accents -> lowercase -> whitespace runs to one space -> strip, with a
//! lone space kept; a decode holding U+FFFD (a partial UTF-8 byte token) has nothing to
//! normalise and is keyed by its raw vocabulary piece. Ids are handed out in order of first
//! appearance, so the compressed size (99092 for the V4 tokenizer) also seeds every multiplier.

use std::collections::HashMap;
use std::path::Path;

use rayon::prelude::*;
use tokenizers::normalizers::replace::ReplacePattern;
use tokenizers::normalizers::{Lowercase, Replace, Sequence, Strip, StripAccents, NFD, NFKC};
use tokenizers::{NormalizedString, Normalizer, Tokenizer};

use super::EngramError;

/// A private-use char standing in for a token that is exactly one space, so `Strip` does not
/// empty it and merge it with unrelated tokens.
const LONE_SPACE: &str = "\u{e000}";

/// Token id -> compressed id for every id of a tokenizer's vocabulary (added tokens included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompressedTokenMap {
    ids: Vec<u32>,
    size: usize,
}

/// The normaliser sequence of `build_compressed_token_map`, in its order.
fn key_normalizer() -> Result<Sequence, EngramError> {
    let err = |e: tokenizers::Error| EngramError::Normalizer(e.to_string());
    let whitespace = Replace::new(ReplacePattern::Regex(r"[ \t\r\n]+".into()), " ").map_err(err)?;
    let lone_space = Replace::new(ReplacePattern::Regex("^ $".into()), LONE_SPACE).map_err(err)?;
    let restore = Replace::new(LONE_SPACE, " ").map_err(err)?;
    Ok(Sequence::new(vec![
        NFKC.into(),
        NFD.into(),
        StripAccents.into(),
        Lowercase.into(),
        whitespace.into(),
        lone_space.into(),
        Strip::new(true, true).into(),
        restore.into(),
    ]))
}

/// The key two tokens must share to share a compressed id.
fn token_key(
    tokenizer: &Tokenizer,
    normalizer: &Sequence,
    token: u32,
) -> Result<String, EngramError> {
    let text = tokenizer
        .decode(&[token], false)
        .map_err(|e| EngramError::Decode {
            token,
            message: e.to_string(),
        })?;
    if text.contains('\u{fffd}') {
        // An id the vocabulary lacks decodes to "" and never reaches this branch.
        return Ok(tokenizer.id_to_token(token).unwrap_or(text));
    }
    let mut normalized = NormalizedString::from(text.as_str());
    normalizer
        .normalize(&mut normalized)
        .map_err(|e| EngramError::Normalize {
            token,
            message: e.to_string(),
        })?;
    let key = normalized.get();
    Ok(if key.is_empty() { text } else { key.to_owned() })
}

impl CompressedTokenMap {
    /// Builds the map from a `tokenizer.json`.
    pub fn from_tokenizer_file(path: impl AsRef<Path>) -> Result<Self, EngramError> {
        let path = path.as_ref();
        let tokenizer = Tokenizer::from_file(path).map_err(|e| EngramError::TokenizerLoad {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Self::from_tokenizer(&tokenizer)
    }

    /// Builds the map over ids `0..get_vocab_size(true)` (transformers' `len(tokenizer)`).
    /// Keys are computed in parallel, ids assigned in token order.
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Result<Self, EngramError> {
        let vocab = tokenizer.get_vocab_size(true);
        let last = u32::try_from(vocab).map_err(|_| EngramError::VocabTooLarge(vocab))?;
        let normalizer = key_normalizer()?;
        let keys = (0..last)
            .into_par_iter()
            .map(|token| token_key(tokenizer, &normalizer, token))
            .collect::<Result<Vec<_>, _>>()?;
        let mut key_to_id: HashMap<String, u32> = HashMap::with_capacity(vocab);
        let mut ids = Vec::with_capacity(vocab);
        for key in keys {
            let next = key_to_id.len() as u32;
            ids.push(*key_to_id.entry(key).or_insert(next));
        }
        Ok(Self {
            ids,
            size: key_to_id.len(),
        })
    }

    /// Compressed id of `token`.
    ///
    /// # Panics
    /// If `token` is not below [`Self::vocab_size`]; use [`Self::get`] for unchecked ids.
    pub fn id(&self, token: u32) -> u32 {
        self.ids[token as usize]
    }

    /// Compressed id of `token`, `None` outside the vocabulary.
    pub fn get(&self, token: u32) -> Option<u32> {
        self.ids.get(token as usize).copied()
    }

    /// Number of distinct compressed ids (`engram_compressed_vocab_size`).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Number of token ids the map covers.
    pub fn vocab_size(&self) -> usize {
        self.ids.len()
    }

    /// The whole map, indexed by token id.
    pub fn as_slice(&self) -> &[u32] {
        &self.ids
    }
}
