//! The state interface between the model and whoever owns cache memory (the engine).
//!
//! The model never allocates or owns per-sequence state. Everything it keeps between steps
//! is addressed by absolute position, so that shortening a sequence (rejected draft tokens,
//! preemption) is a truncation, never an undo: every row past the new length is rewritten
//! before it is read again (docs/MODEL.md §6).
//!
//! Per sequence and layer there are four kinds of state:
//! - the **window ring** of K=V latents, slot `pos mod window_slots`;
//! - the compressors' **pending rows** `[K | Z]` (`2·coff·c` floats; Z with `ape` added), a
//!   ring addressed by `pos mod pending_slots(layer)`; CSA layers have two compressors (the
//!   attention's and the indexer's), HCA layers one;
//! - the **compressed entries**, entry `w = pos div m`;
//! - for CSA layers the **indexer keys**, entry `w` likewise.
//!
//! Latents, entries and keys are stored as [`crate::record`] says: `head_dim` /
//! `index_head_dim` f32 in reference numerics, packed FP8/FP4 records (fewer f32-sized words,
//! read as bytes) in official numerics. Pending rows are always f32.
//!
//! Rings are larger than the model strictly needs (window `W`, `coff·m` pending rows) by the
//! owner's rollback slack: a sequence may be truncated by at most that many tokens.

/// Which compressor of a layer: the attention's (entries of width `head_dim`) or the
/// lightning indexer's (keys of width `index_head_dim`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    Attn,
    Indexer,
}

/// Cache state of the sequences of one [`crate::batch::ForwardBatch`]; `seq` is the index
/// of a span in that batch. Reads happen from several threads at once, hence `Sync`.
pub trait CacheView: Sync {
    /// Layers the cache keeps state for: the main layers, then any draft (MTP) layers.
    fn num_layers(&self) -> usize;
    /// Slots in each window ring (at least the model's sliding window).
    fn window_slots(&self) -> usize;
    /// Slots in the pending-row ring of `layer`'s compressors (at least `coff·m`).
    fn pending_slots(&self, layer: usize) -> usize;
    /// Tokens of sequence `seq` the cache can hold (entries are allocated up to this).
    fn capacity_tokens(&self, seq: usize) -> usize;

    fn window(&self, seq: usize, layer: usize, slot: usize) -> &[f32];
    fn window_mut(&mut self, seq: usize, layer: usize, slot: usize) -> &mut [f32];
    fn pending(&self, seq: usize, layer: usize, stream: Stream, slot: usize) -> &[f32];
    fn pending_mut(&mut self, seq: usize, layer: usize, stream: Stream, slot: usize) -> &mut [f32];
    fn entry(&self, seq: usize, layer: usize, stream: Stream, w: usize) -> &[f32];
    fn entry_mut(&mut self, seq: usize, layer: usize, stream: Stream, w: usize) -> &mut [f32];

    /// Every window row a step computed for `seq` at `layer` (positions `p0..`, one record
    /// each), the ring having kept only its last ones: an owner that snapshots the
    /// state at block boundaries (prefix caching) copies what it needs. Default: nothing.
    fn keep_window(&mut self, _seq: usize, _layer: usize, _p0: usize, _rows: &[f32]) {}
    /// Likewise every pending row of a compressor (`2·coff·c` floats each).
    fn keep_pending(
        &mut self,
        _seq: usize,
        _layer: usize,
        _stream: Stream,
        _p0: usize,
        _rows: &[f32],
    ) {
    }
}
