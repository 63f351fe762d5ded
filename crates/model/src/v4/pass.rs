//! What one layer's pass and one layer's loading are handed, in one value each, instead of
//! long argument lists: where the layer sits in the model and the batch it runs on, and
//! where its weights come from.

use super::rows::{Angles, BatchRows};
use crate::config::{AttnKind, MlpKind, ModelConfig};
use crate::parallel::Placement;
use deepinfer_kernels::rope::Rope;

/// What a block needs to know about the batch and its place in the model.
pub struct BlockCtx<'a> {
    pub c: &'a ModelConfig,
    /// The block's layer id in the cache: `0..num_hidden_layers`, or `num_hidden_layers` for
    /// the MTP block.
    pub layer: usize,
    pub token_ids: &'a [u32],
    pub rows: &'a BatchRows<'a>,
    pub rope: &'a Rope,
    pub angles: &'a Angles,
}

/// Where a layer's weights come from and what kind of layer it is.
pub(crate) struct LayerSpec<'a> {
    pub(crate) prefix: &'a str,
    pub(crate) kind: AttnKind,
    pub(crate) mlp: MlpKind,
    pub(crate) ratio: usize,
    /// The ranks this layer is split over (a main layer of a split model, on rank 0).
    pub(crate) placement: Option<&'a Placement>,
    /// The layer's index (what the other ranks keep their parts under).
    pub(crate) index: usize,
}
