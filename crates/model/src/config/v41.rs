//! DeepSeek-V4.1's configuration (docs/MODEL.md §8): an HF config with `model_type: deepseek_v41` whose
//! text model sits in `text_config` (or, for a text-only export, at the top level). The text
//! fields V4 also has are read as V4's ([`super::hf`]); what V4.1 adds is read here into
//! [`V41`], and the layer topology (which layers own compressors, indexers, candidates) is
//! checked so that every reader has a source.

use super::fields::Fields;
use super::{invalid, ConfigError};

/// What V4.1 changes, beyond V4's fields.
#[derive(Clone, Debug, PartialEq)]
pub struct V41 {
    /// Tokens per compressed entry of each main layer: 0 (window only), 1 or 2.
    pub compress_ratios: Vec<usize>,
    /// Layers that own a compressor and the compressed cache every later compressed layer
    /// (up to the next source) reads.
    pub kv_source_layer_ids: Vec<usize>,
    /// Layers that run an indexer; every other compressed layer reuses the latest one's picks.
    pub index_source_layer_ids: Vec<usize>,
    pub candidates: Option<Candidates>,
    pub engram: Option<EngramConfig>,
    /// Positions holding image embeddings route with `gate.bias_vl`; text never has them.
    pub image_token_id: Option<u32>,
}

/// The two-level indexer: the candidate source publishes the best blocks of compressed
/// entries per query; later index sources score only inside them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidates {
    pub source_layer: usize,
    pub topk_blocks: usize,
    pub block_size: usize,
}

/// Engram's n-gram tables (docs/MODEL.md §8.6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngramConfig {
    pub layer_ids: Vec<usize>,
    /// Table rows of each Engram layer.
    pub num_embeddings: Vec<usize>,
    pub max_ngram_size: usize,
    /// Where the prime search for the bucket sizes starts.
    pub vocab_size: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    /// Distinct ids of the tokenizer-derived map (the hash multipliers depend on it).
    pub compressed_vocab_size: usize,
    pub pad_token_id: u32,
}

impl V41 {
    /// The layer whose compressed cache layer `l` reads (`None` for a window-only layer,
    /// draft layers past the main ones included).
    pub fn kv_source(&self, l: usize) -> Option<usize> {
        latest(&self.kv_source_layer_ids, l).filter(|_| self.compresses(l))
    }

    /// The layer whose index picks layer `l` attends to (`None` for a window-only layer).
    pub fn index_source(&self, l: usize) -> Option<usize> {
        latest(&self.index_source_layer_ids, l).filter(|_| self.compresses(l))
    }

    fn compresses(&self, l: usize) -> bool {
        self.compress_ratios.get(l).is_some_and(|&r| r > 0)
    }

    /// Whether layer `l` scores only inside the candidate source's blocks.
    pub fn uses_candidates(&self, l: usize) -> bool {
        self.candidates.is_some_and(|c| c.source_layer < l) && self.index_source(l) == Some(l)
    }

    /// Whether layer `l` owns Engram tables, and which of them (its index among the layers).
    pub fn engram_index(&self, l: usize) -> Option<usize> {
        let e = self.engram.as_ref()?;
        e.layer_ids.iter().position(|&x| x == l)
    }
}

/// Whether the config declares V4.1 (`model_type` `deepseek_v41`, or a `text_config` whose
/// `model_type` is `deepseek_v41_text`).
pub(super) fn declared(f: &Fields) -> Result<bool, ConfigError> {
    if f.str("model_type")? == Some("deepseek_v41") {
        return Ok(true);
    }
    Ok(match f.obj("text_config")? {
        Some(t) => t.str("model_type")? == Some("deepseek_v41_text"),
        None => false,
    })
}

impl EngramConfig {
    /// The numbers the n-gram hashing is laid out from.
    pub fn params(&self) -> crate::engram::EngramParams {
        crate::engram::EngramParams {
            layer_ids: self.layer_ids.clone(),
            engram_vocab_size: self.vocab_size as u64,
            compressed_vocab_size: self.compressed_vocab_size,
            max_ngram: self.max_ngram_size,
            n_heads: self.n_heads,
            pad_token_id: self.pad_token_id,
        }
    }
}

fn latest(sources: &[usize], l: usize) -> Option<usize> {
    sources.iter().copied().filter(|&s| s <= l).max()
}

/// Reads V4.1's own fields from the text config `t`, for `ratios` (already cut to the main
/// layers), and checks the topology.
pub(super) fn parse(t: &Fields, ratios: Vec<usize>, index_topk: usize) -> Result<V41, ConfigError> {
    let n = ratios.len();
    let list = |key: &str| -> Result<Vec<usize>, ConfigError> {
        let l = t.usize_list(key)?.unwrap_or_default();
        for (i, &v) in l.iter().enumerate() {
            if v >= n {
                return Err(invalid(
                    format!("{}[{i}]", t.name(key)),
                    v,
                    format!("not a layer (num_hidden_layers = {n})"),
                ));
            }
        }
        Ok(l)
    };
    let kv_sources = list("kv_source_layer_ids")?;
    let index_sources = list("index_source_layer_ids")?;
    let candidates = match t.usize("candidate_source_layer_id")? {
        Some(source_layer) if source_layer < n => Some(Candidates {
            source_layer,
            topk_blocks: t.req_usize("candidate_topk_blocks")?,
            block_size: t.req_usize("candidate_block_size")?,
        }),
        _ => None,
    };
    let engram = parse_engram(t, n)?;
    let image_token_id = t
        .usize("image_token_id")?
        .map(|v| id32(t, "image_token_id", v))
        .transpose()?;
    let v = V41 {
        compress_ratios: ratios,
        kv_source_layer_ids: kv_sources,
        index_source_layer_ids: index_sources,
        candidates,
        engram,
        image_token_id,
    };
    check_topology(&v, t, index_topk)?;
    Ok(v)
}

fn parse_engram(t: &Fields, n: usize) -> Result<Option<EngramConfig>, ConfigError> {
    let layer_ids = t.usize_list("engram_layer_ids")?.unwrap_or_default();
    if layer_ids.is_empty() {
        return Ok(None);
    }
    let num_embeddings =
        t.usize_list("engram_num_embeddings")?
            .ok_or_else(|| ConfigError::Missing {
                field: t.name("engram_num_embeddings"),
            })?;
    if num_embeddings.len() != layer_ids.len() {
        return Err(invalid(
            t.name("engram_num_embeddings"),
            format!("{} entries", num_embeddings.len()),
            "needs one entry per engram layer",
        ));
    }
    for (i, &l) in layer_ids.iter().enumerate() {
        // Layer 0's input is the embedding itself; Engram writes into a residual stream.
        if l == 0 || l >= n {
            return Err(invalid(
                format!("{}[{i}]", t.name("engram_layer_ids")),
                l,
                format!("must be a layer in 1..{n}"),
            ));
        }
    }
    let e = EngramConfig {
        layer_ids,
        num_embeddings,
        max_ngram_size: t.req_usize("engram_max_ngram_size")?,
        vocab_size: t.req_usize("engram_vocab_size")?,
        n_heads: t.req_usize("engram_n_heads")?,
        head_dim: t.req_usize("engram_head_dim")?,
        compressed_vocab_size: t.req_usize("engram_compressed_vocab_size")?,
        pad_token_id: id32(
            t,
            "engram_pad_token_id",
            t.usize_or("engram_pad_token_id", 2)?,
        )?,
    };
    for (key, v, lo, hi) in [
        ("engram_max_ngram_size", e.max_ngram_size, 2, 8),
        ("engram_n_heads", e.n_heads, 1, 64),
        ("engram_head_dim", e.head_dim, 1, 4096),
        ("engram_vocab_size", e.vocab_size, 2, 1 << 40),
        (
            "engram_compressed_vocab_size",
            e.compressed_vocab_size,
            1,
            1 << 32,
        ),
    ] {
        if !(lo..=hi).contains(&v) {
            return Err(invalid(t.name(key), v, format!("must be in {lo}..={hi}")));
        }
    }
    Ok(Some(e))
}

/// Every compressed layer needs a kv source and an index source at or below it that agree
/// with it: the source's compressed positions are the ones the reader attends to.
fn check_topology(v: &V41, t: &Fields, index_topk: usize) -> Result<(), ConfigError> {
    check_layer_sources(v, t)?;
    for (i, &l) in v.kv_source_layer_ids.iter().enumerate() {
        if v.compress_ratios[l] == 0 || !v.index_source_layer_ids.contains(&l) {
            return Err(invalid(
                format!("{}[{i}]", t.name("kv_source_layer_ids")),
                l,
                "a kv source compresses and also indexes (its indexer owns the keys)",
            ));
        }
    }
    if let Some(c) = v.candidates {
        check_candidates(v, t, c, index_topk)?;
    }
    Ok(())
}

/// Every compressed layer has a kv source and an index source at or below it, of its ratio
/// and agreeing on the entries.
fn check_layer_sources(v: &V41, t: &Fields) -> Result<(), ConfigError> {
    for (l, &r) in v.compress_ratios.iter().enumerate() {
        let field = format!("{}[{l}]", t.name("compress_ratios"));
        if r > 2 {
            return Err(invalid(
                field,
                r,
                "V4.1 compresses by 1 or 2 (0: window only)",
            ));
        }
        if r == 0 {
            continue;
        }
        let kv = v.kv_source(l).ok_or_else(|| {
            invalid(
                &field,
                r,
                "a compressed layer needs a kv_source_layer_ids entry at or below it",
            )
        })?;
        let ix = v.index_source(l).ok_or_else(|| {
            invalid(
                &field,
                r,
                "a compressed layer needs an index_source_layer_ids entry at or below it",
            )
        })?;
        if v.compress_ratios[kv] != r {
            return Err(invalid(
                field,
                r,
                format!(
                    "its kv source, layer {kv}, compresses by {}",
                    v.compress_ratios[kv]
                ),
            ));
        }
        // The index source scores the keys of its own kv source: that must be this layer's.
        if v.kv_source(ix) != Some(kv) {
            return Err(invalid(
                field,
                r,
                format!("its index source, layer {ix}, reads another kv source than layer {kv}"),
            ));
        }
    }
    Ok(())
}

/// The candidate source indexes, its blocks cover the top-k, and the index sources after it
/// read the entries it indexes.
fn check_candidates(
    v: &V41,
    t: &Fields,
    c: Candidates,
    index_topk: usize,
) -> Result<(), ConfigError> {
    let field = t.name("candidate_source_layer_id");
    if v.index_source(c.source_layer) != Some(c.source_layer) {
        return Err(invalid(field, c.source_layer, "must be an index source"));
    }
    // Later readers take their top-k inside the candidates: fewer than k would leave
    // picks the official kernels fill with masked entries.
    let covered = c.topk_blocks.saturating_sub(1) * c.block_size + 1;
    if c.block_size == 0 || covered < index_topk {
        return Err(invalid(
            t.name("candidate_topk_blocks"),
            c.topk_blocks,
            format!(
                "blocks of {} must cover index_topk = {index_topk} entries",
                c.block_size
            ),
        ));
    }
    for &l in &v.index_source_layer_ids {
        if l > c.source_layer && v.kv_source(l) != v.kv_source(c.source_layer) {
            return Err(invalid(
                field,
                c.source_layer,
                format!("index source {l} reads other entries than the candidates index"),
            ));
        }
    }
    Ok(())
}

/// A token id: it may lie outside the vocabulary (V4.1's image id does in a text-only
/// export), but not outside the ids' 32 bits.
fn id32(t: &Fields, key: &str, v: usize) -> Result<u32, ConfigError> {
    u32::try_from(v).map_err(|_| invalid(t.name(key), v, "a token id must fit 32 bits"))
}
