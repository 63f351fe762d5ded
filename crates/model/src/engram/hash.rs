//! The table rows each token looks up: vLLM's `_hash_ids_kernel` on the CPU.
//!
//! For a token at position `p` and shift `s = 0..max_ngram`, `v_s` is the compressed id at
//! `p - s`, or the pad id once this or a smaller shift reached before position 0 or met a dead
//! (image) token — an n-gram never reads across an image. The rolling hash
//! `r ^= v_s * M[s]` after shift `s >= 1` gives the `(s + 1)`-gram, which lands in row
//! `r % P[s - 1][h] + offset` for each head `h`. A chunk needs the `max_ngram - 1` ids before
//! it, so callers hand over that much of the sequence's history and get the same rows whether a
//! sequence is hashed whole or chunk by chunk.

use super::layout::EngramLayout;
use super::token_map::CompressedTokenMap;
use super::EngramError;

/// A run of one sequence's tokens and what comes before it.
#[derive(Clone, Copy, Debug)]
pub struct TokenChunk<'a> {
    /// Ids before the chunk, oldest first; only the last `max_ngram - 1` are read, and that many
    /// are required unless the chunk starts closer to position 0.
    pub history: &'a [u32],
    /// The chunk's ids.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]` in the sequence.
    pub start: usize,
}

/// Hashes token chunks for every engram layer of a layout, with a fixed dead-token rule.
pub struct NgramHasher<'a, D> {
    layout: &'a EngramLayout,
    map: &'a CompressedTokenMap,
    is_dead: D,
}

impl<'a, D: Fn(u32) -> bool> NgramHasher<'a, D> {
    /// `is_dead(token)` marks tokens that take no part in any n-gram (image tokens). The map
    /// must be the one the layout's multipliers were drawn for (same compressed size).
    pub fn new(
        layout: &'a EngramLayout,
        map: &'a CompressedTokenMap,
        is_dead: D,
    ) -> Result<Self, EngramError> {
        if map.size() != layout.compressed_vocab_size() {
            return Err(EngramError::CompressedVocabMismatch {
                built: map.size(),
                expected: layout.compressed_vocab_size(),
            });
        }
        Ok(Self {
            layout,
            map,
            is_dead,
        })
    }

    /// Writes the rows of engram layer `layer` (an index into `layout.layer_ids()`) for every
    /// chunk token: `out[i * n_hash_cols + (n - 2) * n_heads + h]` for token `i`, `n`-gram and
    /// head `h`. `out` must hold exactly `tokens.len() * n_hash_cols` rows.
    pub fn hash_layer(
        &self,
        layer: usize,
        chunk: &TokenChunk<'_>,
        out: &mut [u64],
    ) -> Result<(), EngramError> {
        self.check_layer(layer)?;
        let cols = self.layout.n_hash_cols();
        check_out_len(chunk.tokens.len().checked_mul(cols), out.len())?;
        let window = self.window(chunk)?;
        self.hash_into(layer, chunk, window, out, cols, 0);
        Ok(())
    }

    /// Writes the rows of every engram layer, token-major as vLLM's `[T, layers, cols]`:
    /// `out[(i * layers + layer) * n_hash_cols + col]`.
    pub fn hash_all_layers(
        &self,
        chunk: &TokenChunk<'_>,
        out: &mut [u64],
    ) -> Result<(), EngramError> {
        let cols = self.layout.n_hash_cols();
        let layers = self.layout.layer_ids().len();
        check_out_len(chunk.tokens.len().checked_mul(layers * cols), out.len())?;
        let window = self.window(chunk)?;
        for layer in 0..layers {
            self.hash_into(layer, chunk, window, out, layers * cols, layer * cols);
        }
        Ok(())
    }

    fn check_layer(&self, layer: usize) -> Result<(), EngramError> {
        let layers = self.layout.layer_ids().len();
        if layer >= layers {
            return Err(EngramError::LayerIndex {
                index: layer,
                layers,
            });
        }
        Ok(())
    }

    /// The history ids the chunk reads, after checking that there are enough of them and that
    /// every id read is inside the map, so hashing itself cannot fail.
    fn window<'c>(&self, chunk: &TokenChunk<'c>) -> Result<&'c [u32], EngramError> {
        let needed = chunk.start.min(self.layout.max_ngram() - 1);
        let got = chunk.history.len();
        if got < needed {
            return Err(EngramError::ShortHistory {
                start: chunk.start,
                needed,
                got,
            });
        }
        chunk
            .start
            .checked_add(chunk.tokens.len())
            .ok_or(EngramError::PositionOverflow {
                start: chunk.start,
                len: chunk.tokens.len(),
            })?;
        let window = &chunk.history[got - needed..];
        let vocab = self.map.vocab_size();
        if let Some(&token) = window
            .iter()
            .chain(chunk.tokens)
            .find(|&&t| t as usize >= vocab)
        {
            return Err(EngramError::TokenOutOfRange { token, vocab });
        }
        Ok(window)
    }

    /// Compressed id at chunk offset `back` ids before token `i` (`None`: dead or before the
    /// sequence). `window` is the history's tail of `min(start, max_ngram - 1)` ids.
    fn source(&self, chunk: &TokenChunk<'_>, window: &[u32], i: usize, back: usize) -> Option<u32> {
        let token = if back <= i {
            chunk.tokens[i - back]
        } else {
            let before = back - i;
            *window
                .len()
                .checked_sub(before)
                .and_then(|k| window.get(k))?
        };
        (!(self.is_dead)(token)).then(|| self.map.id(token))
    }

    /// The kernel's loop for one layer: token `i`'s columns go to `out[i * stride + base..]`.
    fn hash_into(
        &self,
        layer: usize,
        chunk: &TokenChunk<'_>,
        window: &[u32],
        out: &mut [u64],
        stride: usize,
        base: usize,
    ) {
        let multipliers = self.layout.multipliers(layer);
        let primes = self.layout.primes(layer);
        let offsets = self.layout.offsets(layer);
        let heads = self.layout.n_heads();
        let pad = u64::from(self.layout.pad_id());
        for i in 0..chunk.tokens.len() {
            let row = &mut out[i * stride + base..];
            let mut blocked = false;
            let mut rolling = 0u64;
            for (shift, &multiplier) in multipliers.iter().enumerate() {
                let source = if blocked {
                    None
                } else {
                    self.source(chunk, window, i, shift)
                };
                blocked = source.is_none();
                let value = source.map_or(pad, u64::from);
                // Cannot wrap: the layout bounds every product below 2^63 (`hash_multipliers`).
                rolling ^= value.wrapping_mul(multiplier);
                if shift == 0 {
                    continue;
                }
                let cols = (shift - 1) * heads..shift * heads;
                for col in cols {
                    row[col] = rolling % primes[col] + offsets[col];
                }
            }
        }
    }
}

/// `expected` is `None` when the needed length overflows usize (no slice can be that long).
fn check_out_len(expected: Option<usize>, got: usize) -> Result<(), EngramError> {
    match expected {
        Some(expected) if expected == got => Ok(()),
        expected => Err(EngramError::OutputLen {
            expected: expected.unwrap_or(usize::MAX),
            got,
        }),
    }
}
