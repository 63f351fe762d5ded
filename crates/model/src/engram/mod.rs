//! DeepSeek-V4.1 Engram n-gram hashing: which rows of each Engram table a token looks up.
//!
//! Bit-exact with vLLM 0.33's `deepseek_v41/common/engram.py` (the tables were trained with
//! these hashes): [`CompressedTokenMap`] folds tokens that normalise alike, [`EngramLayout`]
//! holds the per-layer multipliers (NumPy's generator, reproduced in `numpy_rng`), primes and
//! offsets, and [`NgramHasher`] turns a chunk of tokens plus its history into table rows.

mod error;
mod hash;
mod layout;
mod numpy_rng;
mod token_map;

#[cfg(test)]
mod tests;

pub use error::EngramError;
pub use hash::{NgramHasher, TokenChunk};
pub use layout::{hash_multipliers, EngramLayout, EngramParams};
pub use token_map::CompressedTokenMap;
