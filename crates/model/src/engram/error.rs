//! What can go wrong building or running the Engram hashing.

use std::path::PathBuf;

/// Errors of the Engram token map, layout and hashing. Every one is a bad input (a file, a
/// config number, a slice length), never an internal fault, so callers can report it and go on.
#[derive(Debug, thiserror::Error)]
pub enum EngramError {
    #[error("cannot load tokenizer {path}: {message}")]
    TokenizerLoad { path: PathBuf, message: String },
    #[error("tokenizer vocabulary of {0} ids does not fit u32 token ids")]
    VocabTooLarge(usize),
    #[error("decoding token {token}: {message}")]
    Decode { token: u32, message: String },
    #[error("normalizing token {token}: {message}")]
    Normalize { token: u32, message: String },
    #[error("building the token-key normalizer: {0}")]
    Normalizer(String),
    #[error("engram layout: {0}")]
    Layout(String),
    #[error(
        "compressed vocab size mismatch: the tokenizer gives {built}, the config expects \
         {expected}; every hash multiplier derives from it"
    )]
    CompressedVocabMismatch { built: usize, expected: usize },
    #[error("engram layer index {index} out of range ({layers} engram layers)")]
    LayerIndex { index: usize, layers: usize },
    #[error("token {token} is outside the tokenizer vocabulary of {vocab} ids")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("chunk at position {start} needs the {needed} ids before it as history, got {got}")]
    ShortHistory {
        start: usize,
        needed: usize,
        got: usize,
    },
    #[error("hash output holds {got} rows, the chunk needs {expected}")]
    OutputLen { expected: usize, got: usize },
    #[error("chunk positions overflow usize (start {start}, {len} tokens)")]
    PositionOverflow { start: usize, len: usize },
}
