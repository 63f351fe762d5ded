//! A minimal [`CacheView`] for running the model inside this crate's tests (the engine's
//! paged pools live a layer up).

use std::collections::HashMap;

use crate::cache::{CacheView, Stream};
use crate::config::{AttnKind, ModelConfig};

/// Every cache row dense in memory: one sequence, positions below `cap`.
pub(super) struct DenseCache {
    window_slots: usize,
    cap: usize,
    window: Vec<Vec<f32>>,
    pending: HashMap<(usize, Stream), (usize, Vec<f32>)>,
    entries: HashMap<(usize, Stream), (usize, Vec<f32>)>,
}

impl DenseCache {
    pub(super) fn new(c: &ModelConfig, cap: usize) -> Self {
        let (hd, ihd) = (c.head_dim, c.index_head_dim);
        let mut pending = HashMap::new();
        let mut entries = HashMap::new();
        for l in 0..c.num_hidden_layers {
            let m = c.compress_ratio(l);
            let mut add = |stream, coff: usize, width: usize| {
                let pw = 2 * coff * width;
                pending.insert((l, stream), (pw, vec![0.0; pw * cap]));
                entries.insert((l, stream), (width, vec![0.0; width * (cap / m + 1)]));
            };
            match c.layer_types[l] {
                AttnKind::Sliding => {}
                AttnKind::Csa => {
                    add(Stream::Attn, 2, hd);
                    add(Stream::Indexer, 2, ihd);
                }
                AttnKind::Hca => add(Stream::Attn, 1, hd),
                AttnKind::Shared => {
                    if c.v41.as_ref().and_then(|v| v.kv_source(l)) == Some(l) {
                        add(Stream::Attn, 1, hd);
                        entries.insert((l, Stream::Indexer), (ihd, vec![0.0; ihd * (cap / m + 1)]));
                    }
                }
            }
        }
        Self {
            window_slots: c.sliding_window,
            cap,
            window: vec![vec![0.0; c.sliding_window * hd]; c.num_hidden_layers],
            pending,
            entries,
        }
    }
}

fn row(rows: &(usize, Vec<f32>), i: usize) -> &[f32] {
    &rows.1[i * rows.0..(i + 1) * rows.0]
}

fn row_mut(rows: &mut (usize, Vec<f32>), i: usize) -> &mut [f32] {
    let w = rows.0;
    &mut rows.1[i * w..(i + 1) * w]
}

impl CacheView for DenseCache {
    fn num_layers(&self) -> usize {
        self.window.len()
    }
    fn window_slots(&self) -> usize {
        self.window_slots
    }
    fn pending_slots(&self, _layer: usize) -> usize {
        self.cap
    }
    fn capacity_tokens(&self, _seq: usize) -> usize {
        self.cap
    }
    fn window(&self, _seq: usize, layer: usize, slot: usize) -> &[f32] {
        let w = self.window[layer].len() / self.window_slots;
        &self.window[layer][slot * w..(slot + 1) * w]
    }
    fn window_mut(&mut self, _seq: usize, layer: usize, slot: usize) -> &mut [f32] {
        let w = self.window[layer].len() / self.window_slots;
        &mut self.window[layer][slot * w..(slot + 1) * w]
    }
    fn pending(&self, _seq: usize, layer: usize, stream: Stream, slot: usize) -> &[f32] {
        row(&self.pending[&(layer, stream)], slot)
    }
    fn pending_mut(&mut self, _seq: usize, layer: usize, s: Stream, slot: usize) -> &mut [f32] {
        row_mut(self.pending.get_mut(&(layer, s)).unwrap(), slot)
    }
    fn entry(&self, _seq: usize, layer: usize, stream: Stream, w: usize) -> &[f32] {
        row(&self.entries[&(layer, stream)], w)
    }
    fn entry_mut(&mut self, _seq: usize, layer: usize, stream: Stream, w: usize) -> &mut [f32] {
        row_mut(self.entries.get_mut(&(layer, stream)).unwrap(), w)
    }
}
