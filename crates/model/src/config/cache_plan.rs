//! What each layer keeps in the cache beyond its window ring, and the paged pools that hold
//! it (docs/MODEL.md §6, §8.4–5): decided here, from the config, so that the engine lays the
//! cache out the same way whichever model version it serves.

use super::{AttnKind, ModelConfig};

/// A paged pool of compressed attention entries or indexer keys, all of one ratio.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryPool {
    pub name: &'static str,
    pub ratio: usize,
    /// Indexer keys (else attention entries).
    pub keys: bool,
}

/// V4's pools, in allocation order: CSA's and HCA's entries, CSA's indexer keys.
pub const CSA_ENTRIES: &str = "csa_entries";
pub const HCA_ENTRIES: &str = "hca_entries";
pub const INDEXER_KEYS: &str = "indexer_keys";
/// V4.1's pools, by compression ratio: the kv sources' entries and indexer keys.
const V41_POOLS: [(&str, usize, bool); 4] = [
    ("c2_entries", 2, false),
    ("c1_entries", 1, false),
    ("c2_keys", 2, true),
    ("c1_keys", 1, true),
];

/// One layer's compressed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerState {
    pub kind: AttnKind,
    /// Tokens per compressed entry (0: a sliding layer).
    pub ratio: usize,
    /// Pending rows a window position contributes to (2 where windows overlap: CSA).
    pub coff: usize,
    /// The pool of the layer's attention entries, which it compresses from pending rows of
    /// its own; `None`: it keeps none (sliding, or a V4.1 layer reading its kv source's).
    pub entries: Option<usize>,
    /// The pool of its indexer keys, and whether they are compressed from pending rows of
    /// their own (V4's CSA indexer) rather than made from the entries (V4.1's sources).
    pub keys: Option<(usize, bool)>,
}

impl LayerState {
    /// A window-only layer (sliding, or a draft model's block).
    pub const SLIDING: Self = Self {
        kind: AttnKind::Sliding,
        ratio: 0,
        coff: 0,
        entries: None,
        keys: None,
    };
}

/// The pools and every main layer's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachePlan {
    pub pools: Vec<EntryPool>,
    pub layers: Vec<LayerState>,
}

impl ModelConfig {
    /// What the cache must hold for this model, layer by layer.
    pub fn cache_plan(&self) -> CachePlan {
        let pools = match &self.v41 {
            None => vec![
                pool(CSA_ENTRIES, self.compress_rate_csa, false),
                pool(HCA_ENTRIES, self.compress_rate_hca, false),
                pool(INDEXER_KEYS, self.compress_rate_csa, true),
            ],
            Some(_) => V41_POOLS.iter().map(|&(n, r, k)| pool(n, r, k)).collect(),
        };
        let layers = (0..self.layer_types.len())
            .map(|l| self.layer_state(l, &pools))
            .collect();
        CachePlan { pools, layers }
    }

    fn layer_state(&self, layer: usize, pools: &[EntryPool]) -> LayerState {
        let kind = self.layer_types[layer];
        let ratio = self.compress_ratio(layer);
        let in_pool = |keys: bool| {
            pools
                .iter()
                .position(|p| p.ratio == ratio && p.keys == keys)
                .expect("V4.1 ratios are checked to be 1 or 2")
        };
        match kind {
            AttnKind::Sliding => LayerState::SLIDING,
            // Entries of one ratio share a pool: CSA's join HCA's where the ratios agree.
            AttnKind::Csa => LayerState {
                kind,
                ratio,
                coff: 2,
                entries: Some(usize::from(ratio == self.compress_rate_hca)),
                keys: Some((2, true)),
            },
            AttnKind::Hca => LayerState {
                kind,
                ratio,
                coff: 1,
                entries: Some(1),
                keys: None,
            },
            // Only a kv source keeps compressed state: the layers after it read its entries
            // and keys, stored once (docs/MODEL.md §8.4-5).
            AttnKind::Shared => {
                let source = self.v41.as_ref().and_then(|v| v.kv_source(layer)) == Some(layer);
                LayerState {
                    kind,
                    ratio,
                    coff: 1,
                    entries: source.then(|| in_pool(false)),
                    keys: source.then(|| (in_pool(true), false)),
                }
            }
        }
    }
}

fn pool(name: &'static str, ratio: usize, keys: bool) -> EntryPool {
    EntryPool { name, ratio, keys }
}
