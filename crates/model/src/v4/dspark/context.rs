//! DSpark's context (docs/MODEL.md §7.2; tools/make_dspark_golden.py steps 1-3): every position the
//! target computes leaves one key per stage, `RoPE(kv_norm(wkv · main_x))` with
//! `main_x = main_norm(main_proj(aux))`, in that stage's window ring — the cache's draft
//! layer `num_hidden_layers + stage`, kept in the cache pools like the target's rings (vLLM
//! likewise inserts them into each draft layer's sliding-window cache). A draft block reads
//! its window of them back.

use super::attention::latents;
use super::DsparkWeights;
use crate::cache::CacheView;
use crate::config::ModelConfig;
use crate::record;
use crate::v4::rows::{Angles, BatchRows};
use crate::v4::workspace::Workspace;
use deepinfer_kernels::norm::rms_norm_rows;
use std::ops::Range;

impl DsparkWeights {
    /// Floats of one row's aux streams (one mean stream per aux layer).
    pub fn aux_width(&self) -> usize {
        self.config.aux_layers.len() * self.stage_config.hidden_size
    }

    /// Whether `cache` keeps the context rings (an engine adds them when it drafts with
    /// DSpark; a target run without drafting has none to fill).
    pub fn has_rings(&self, c: &ModelConfig, cache: &dyn CacheView) -> bool {
        cache.num_layers() >= c.num_hidden_layers + self.stages.len()
    }

    /// The context keys of a target pass's rows into the rings: `aux` holds every row's aux
    /// streams (`[N, aux_width]`), `angles` the rows' main-table angles. Only each span's
    /// last ring's worth of rows is computed: the ring keeps no more.
    pub(in crate::v4) fn store_context(
        &self,
        c: &ModelConfig,
        aux: &[f32],
        rows: &BatchRows,
        angles: &Angles,
        cache: &mut dyn CacheView,
        ws: &mut Workspace,
    ) {
        let (d, hd, width) = (c.hidden_size, c.head_dim, self.aux_width());
        let ring = cache.window_slots();
        let mut kept = ws.take_idx(rows.positions.len());
        kept.clear();
        for span in rows.spans {
            kept.extend(span.start + span.len.saturating_sub(ring)..span.start + span.len);
        }
        let n = kept.len();
        let mut picked = ws.take(n * width);
        for (out, &r) in picked.chunks_exact_mut(width).zip(&kept) {
            out.copy_from_slice(&aux[r * width..(r + 1) * width]);
        }
        let mut main_x = ws.take(n * d);
        self.main_proj.forward_into(&picked, n, &mut main_x);
        rms_norm_rows(&mut main_x, &self.main_norm, c.rms_norm_eps);
        let (packed, words) = (c.numerics.packs_cache(), record::kv_words(c));
        for (s, st) in self.stages.iter().enumerate() {
            let kv = latents(st, c, &main_x, |k| angles.row(kept[k]), ws);
            let layer = c.num_hidden_layers + s;
            for (row, &r) in kv.chunks_exact(hd).zip(&kept) {
                let (seq, pos) = (rows.row_seq[r].0, rows.positions[r]);
                let rec = &mut cache.window_mut(seq, layer, pos % ring)[..words];
                match packed {
                    true => record::store_kv(c, row, rec),
                    false => rec.copy_from_slice(row),
                }
            }
            ws.give(kv);
        }
        for v in [picked, main_x] {
            ws.give(v);
        }
        ws.give_idx(kept);
    }
}

/// The context a draft block reads: sequence `seq` of `cache`, whose rings hold the context
/// keys of `positions` (a target pass wrote them, [`DsparkWeights::store_context`]); the
/// block follows them, at `positions.end`.
pub struct DraftContext<'a> {
    pub cache: &'a dyn CacheView,
    pub seq: usize,
    pub positions: Range<usize>,
}

impl DraftContext<'_> {
    /// Stage `stage`'s context keys, `[positions, head_dim]`, as the target `c` stored them.
    pub(super) fn keys(&self, c: &ModelConfig, stage: usize, ws: &mut Workspace) -> Vec<f32> {
        let (hd, ring) = (c.head_dim, self.cache.window_slots());
        let (packed, words) = (c.numerics.packs_cache(), record::kv_words(c));
        let layer = c.num_hidden_layers + stage;
        let mut kv = ws.take(self.positions.len() * hd);
        for (row, pos) in kv.chunks_exact_mut(hd).zip(self.positions.clone()) {
            let rec = &self.cache.window(self.seq, layer, pos % ring)[..words];
            match packed {
                true => record::load_kv(c, rec, row),
                false => row.copy_from_slice(rec),
            }
        }
        kv
    }
}
