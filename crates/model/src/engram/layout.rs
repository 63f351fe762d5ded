//! Where each n-gram hash lands in a layer's Engram table (vLLM's `EngramLayout` and
//! `compute_hash_multipliers`).
//!
//! A position is hashed as `max_ngram - 1` n-grams (2-gram .. max), each over `n_heads` heads.
//! Every (n-gram size, head) owns a prime-sized bucket range of the layer's table; primes are
//! searched upward from `engram_vocab_size - 1` and never reused anywhere in the model, which
//! keeps heads from colliding in the same way. Ranges are laid end to end in (n-gram, head)
//! order, so a layer's table has as many rows as the sum of its primes.

use super::numpy_rng::integers_below;
use super::token_map::CompressedTokenMap;
use super::EngramError;

/// Each engram layer seeds its own generator with `layer_id * 10007`.
const SEED_STRIDE: u64 = 10007;

/// The config numbers an Engram layout derives from (`engram_*` keys of a V4.1 config).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngramParams {
    /// Backbone layers that carry an Engram module (`engram_layer_ids`).
    pub layer_ids: Vec<usize>,
    /// Smallest bucket count before the prime search (`engram_vocab_size`).
    pub engram_vocab_size: u64,
    /// Distinct compressed token ids (`engram_compressed_vocab_size`).
    pub compressed_vocab_size: usize,
    /// Longest n-gram hashed (`engram_max_ngram_size`).
    pub max_ngram: usize,
    /// Heads per n-gram size (`engram_n_heads`).
    pub n_heads: usize,
    /// Token whose compressed id pads n-grams that reach before the sequence or into an image
    /// (`engram_pad_token_id`).
    pub pad_token_id: u32,
}

/// Everything the hashing needs per engram layer: multipliers, primes, offsets, pad id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngramLayout {
    layer_ids: Vec<usize>,
    compressed_vocab_size: usize,
    max_ngram: usize,
    n_heads: usize,
    primes: Vec<Vec<u64>>,
    offsets: Vec<Vec<u64>>,
    multipliers: Vec<Vec<u64>>,
    pad_id: u32,
    rows_per_layer: Vec<u64>,
}

fn layout_err(message: impl Into<String>) -> EngramError {
    EngramError::Layout(message.into())
}

/// `compute_hash_multipliers`: `2 * U + 1` per (layer, shift), `U` drawn by NumPy's
/// `default_rng(10007 * layer_id).integers(0, bound)`. The bound
/// `(i64::MAX / compressed_vocab) / 2` keeps `compressed_id * multiplier` below `2^63`, and so
/// every XOR of such products too: the rolling hash never wraps or goes negative.
pub fn hash_multipliers(
    layer_ids: &[usize],
    max_ngram: usize,
    compressed_vocab_size: usize,
) -> Result<Vec<Vec<u64>>, EngramError> {
    if compressed_vocab_size == 0 {
        return Err(layout_err("compressed vocab size is 0"));
    }
    let bound = (i64::MAX as u64 / compressed_vocab_size as u64 / 2).max(1);
    layer_ids
        .iter()
        .map(|&layer_id| {
            let seed = (layer_id as u64)
                .checked_mul(SEED_STRIDE)
                .ok_or_else(|| layout_err(format!("layer id {layer_id} overflows the seed")))?;
            let mut draws = vec![0u64; max_ngram];
            integers_below(seed, bound, &mut draws);
            Ok(draws.into_iter().map(|u| 2 * u + 1).collect())
        })
        .collect()
}

/// Deterministic Miller-Rabin for every u64 (these bases cover all n < 3.3e24).
fn is_prime(n: u64) -> bool {
    const BASES: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];
    if n < 2 {
        return false;
    }
    if let Some(&p) = BASES.iter().find(|&&p| n.is_multiple_of(p)) {
        return n == p;
    }
    let mul_mod = |a: u64, b: u64| (u128::from(a) * u128::from(b) % u128::from(n)) as u64;
    let pow_mod = |mut base: u64, mut exp: u64| {
        let mut acc = 1u64;
        while exp > 0 {
            if exp & 1 == 1 {
                acc = mul_mod(acc, base);
            }
            base = mul_mod(base, base);
            exp >>= 1;
        }
        acc
    };
    let twos = (n - 1).trailing_zeros();
    let odd = (n - 1) >> twos;
    BASES.iter().all(|&a| {
        let mut x = pow_mod(a, odd);
        if x == 1 || x == n - 1 {
            return true;
        }
        (1..twos).any(|_| {
            x = mul_mod(x, x);
            x == n - 1
        })
    })
}

/// `EngramLayout.__init__`'s prime search: per (layer, n-gram size), `n_heads` primes above
/// `engram_vocab_size - 1` that no earlier search took. Returns `[layer][(n - 2) * heads + h]`.
fn search_primes(params: &EngramParams) -> Result<Vec<Vec<u64>>, EngramError> {
    let mut taken = std::collections::HashSet::new();
    let cols = (params.max_ngram - 1) * params.n_heads;
    let overflow = || layout_err("prime search overflows u64");
    let mut primes = Vec::with_capacity(params.layer_ids.len());
    for _ in &params.layer_ids {
        let mut layer = Vec::with_capacity(cols);
        for _ in 1..params.max_ngram {
            let mut current = params
                .engram_vocab_size
                .checked_sub(1)
                .ok_or_else(overflow)?;
            for _ in 0..params.n_heads {
                current = current.checked_add(1).ok_or_else(overflow)?;
                while !is_prime(current) || taken.contains(&current) {
                    current = current.checked_add(1).ok_or_else(overflow)?;
                }
                taken.insert(current);
                layer.push(current);
            }
        }
        primes.push(layer);
    }
    Ok(primes)
}

/// Start of each bucket range in its layer's table, and the table's row count.
fn offsets_and_rows(primes: &[u64]) -> Result<(Vec<u64>, u64), EngramError> {
    let mut offsets = Vec::with_capacity(primes.len());
    let mut total = 0u64;
    for &p in primes {
        offsets.push(total);
        total = total
            .checked_add(p)
            .ok_or_else(|| layout_err("table rows overflow u64"))?;
    }
    Ok((offsets, total))
}

fn check_params(params: &EngramParams, pad_id: u32) -> Result<(), EngramError> {
    if params.max_ngram < 2 {
        return Err(layout_err(format!(
            "max n-gram {} hashes no n-gram",
            params.max_ngram
        )));
    }
    if params.n_heads == 0 || params.layer_ids.is_empty() {
        return Err(layout_err("no engram heads or no engram layers"));
    }
    if params.engram_vocab_size == 0 {
        return Err(layout_err("engram vocab size is 0"));
    }
    if pad_id as usize >= params.compressed_vocab_size {
        return Err(layout_err(format!(
            "pad id {pad_id} is outside the compressed vocab of {}",
            params.compressed_vocab_size
        )));
    }
    Ok(())
}

impl EngramLayout {
    /// The layout for a config, with the pad id taken from the tokenizer's map. Fails, as vLLM
    /// does, when the map's size differs from the config's compressed vocab size.
    pub fn new(params: &EngramParams, map: &CompressedTokenMap) -> Result<Self, EngramError> {
        if map.size() != params.compressed_vocab_size {
            return Err(EngramError::CompressedVocabMismatch {
                built: map.size(),
                expected: params.compressed_vocab_size,
            });
        }
        let pad_id = map
            .get(params.pad_token_id)
            .ok_or(EngramError::TokenOutOfRange {
                token: params.pad_token_id,
                vocab: map.vocab_size(),
            })?;
        Self::with_pad_id(params, pad_id)
    }

    /// The layout from plain numbers; `pad_id` is the pad token's compressed id
    /// (`map.id(params.pad_token_id)`).
    pub fn with_pad_id(params: &EngramParams, pad_id: u32) -> Result<Self, EngramError> {
        check_params(params, pad_id)?;
        let multipliers = hash_multipliers(
            &params.layer_ids,
            params.max_ngram,
            params.compressed_vocab_size,
        )?;
        let primes = search_primes(params)?;
        let mut offsets = Vec::with_capacity(primes.len());
        let mut rows_per_layer = Vec::with_capacity(primes.len());
        for layer in &primes {
            let (layer_offsets, rows) = offsets_and_rows(layer)?;
            offsets.push(layer_offsets);
            rows_per_layer.push(rows);
        }
        Ok(Self {
            layer_ids: params.layer_ids.clone(),
            compressed_vocab_size: params.compressed_vocab_size,
            max_ngram: params.max_ngram,
            n_heads: params.n_heads,
            primes,
            offsets,
            multipliers,
            pad_id,
            rows_per_layer,
        })
    }

    /// Backbone layer ids; engram layer `i` (the index every other accessor takes) is
    /// `layer_ids()[i]`.
    pub fn layer_ids(&self) -> &[usize] {
        &self.layer_ids
    }

    /// Distinct compressed token ids the multipliers were drawn for.
    pub fn compressed_vocab_size(&self) -> usize {
        self.compressed_vocab_size
    }

    pub fn max_ngram(&self) -> usize {
        self.max_ngram
    }

    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// Table rows looked up per token and layer: `(max_ngram - 1) * n_heads`.
    pub fn n_hash_cols(&self) -> usize {
        (self.max_ngram - 1) * self.n_heads
    }

    /// Bucket sizes of engram layer `layer`, indexed `(n - 2) * n_heads + head`.
    pub fn primes(&self, layer: usize) -> &[u64] {
        &self.primes[layer]
    }

    /// First table row of each bucket range of engram layer `layer`, same indexing.
    pub fn offsets(&self, layer: usize) -> &[u64] {
        &self.offsets[layer]
    }

    /// Hash multipliers of engram layer `layer`, one per shift `0..max_ngram`.
    pub fn multipliers(&self, layer: usize) -> &[u64] {
        &self.multipliers[layer]
    }

    /// Compressed id that replaces tokens before the sequence or behind an image token.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Rows of each engram layer's table (`engram_num_embeddings`).
    pub fn rows_per_layer(&self) -> &[u64] {
        &self.rows_per_layer
    }
}
