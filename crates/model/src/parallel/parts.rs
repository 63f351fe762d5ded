//! A rank's parts of the dense weights under tensor parallelism, cut from the checkpoint's
//! matrices as stored (see `deepinfer_kernels::sub_matrix` for cuts inside a block).

use super::share;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use deepinfer_kernels::sub_matrix::SubMatrix;
use std::ops::Range;

/// `rows × cols` of the matrix `{name}.weight` of shape `[out, inn]` (only the part stays).
fn cut(
    ck: &Checkpoint,
    name: &str,
    (out, inn): (usize, usize),
    rows: Range<usize>,
    cols: Range<usize>,
) -> Result<SubMatrix, CheckpointError> {
    ck.matrix_part(&format!("{name}.weight"), &[out, inn], rows, cols)
}

/// A rank's part of a layer's attention projections: the queries of its heads, the
/// grouped output projection of its output groups, and `wo_b`'s columns of those groups.
#[derive(Debug)]
pub struct AttnPart {
    pub heads: Range<usize>,
    /// Rows `heads · hd` of `wq_b`.
    pub wq_b: SubMatrix,
    pub groups: Range<usize>,
    /// Rows `groups · o_lora` of `wo_a`.
    pub wo_a: SubMatrix,
    /// Columns `groups · o_lora` of `wo_b`.
    pub wo_b: SubMatrix,
}

impl AttnPart {
    pub fn load(
        ck: &Checkpoint,
        c: &ModelConfig,
        prefix: &str,
        rank: usize,
        size: usize,
    ) -> Result<Self, CheckpointError> {
        let (h, hd, g, r) = (c.num_attention_heads, c.head_dim, c.o_groups, c.o_lora_rank);
        let heads = share(h, rank, size);
        let groups = share(g, rank, size);
        let p = format!("{prefix}.attn");
        Ok(Self {
            wq_b: cut(
                ck,
                &format!("{p}.wq_b"),
                (h * hd, c.q_lora_rank),
                heads.start * hd..heads.end * hd,
                0..c.q_lora_rank,
            )?,
            wo_a: cut(
                ck,
                &format!("{p}.wo_a"),
                (g * r, h * hd / g),
                groups.start * r..groups.end * r,
                0..h * hd / g,
            )?,
            wo_b: cut(
                ck,
                &format!("{p}.wo_b"),
                (c.hidden_size, g * r),
                0..c.hidden_size,
                groups.start * r..groups.end * r,
            )?,
            heads,
            groups,
        })
    }
}

/// A rank's share of a SwiGLU expert's intermediate width: rows of `w1` and `w3`, columns
/// of `w2` (the shared expert under tensor parallelism, and every routed expert when they
/// are not split whole).
#[derive(Debug)]
pub struct WidthPart {
    pub width: Range<usize>,
    pub w1: SubMatrix,
    pub w3: SubMatrix,
    pub w2: SubMatrix,
}

impl WidthPart {
    /// Rank `rank` of `size`'s share of the expert at `prefix` (`…ffn.shared_experts`,
    /// `…ffn.experts.E`), `inter` wide.
    pub fn load(
        ck: &Checkpoint,
        c: &ModelConfig,
        prefix: &str,
        inter: usize,
        (rank, size): (usize, usize),
    ) -> Result<Self, CheckpointError> {
        let d = c.hidden_size;
        let width = share(inter, rank, size);
        Ok(Self {
            w1: cut(ck, &format!("{prefix}.w1"), (inter, d), width.clone(), 0..d)?,
            w3: cut(ck, &format!("{prefix}.w3"), (inter, d), width.clone(), 0..d)?,
            w2: cut(ck, &format!("{prefix}.w2"), (d, inter), 0..d, width.clone())?,
            width,
        })
    }
}

/// A rank's rows of the vocabulary head.
#[derive(Debug)]
pub struct HeadPart {
    pub vocab: Range<usize>,
    pub w: SubMatrix,
}

impl HeadPart {
    pub fn load(
        ck: &Checkpoint,
        c: &ModelConfig,
        rank: usize,
        size: usize,
    ) -> Result<Self, CheckpointError> {
        let (v, d) = (c.vocab_size, c.hidden_size);
        let vocab = share(v, rank, size);
        Ok(Self {
            w: cut(ck, "head", (v, d), vocab.clone(), 0..d)?,
            vocab,
        })
    }
}

/// The placement as the loaders consult it: which part of a split tensor this rank holds,
/// or `None` where the tensor stays whole (no tensor parallelism). Rank 0's loaders and the
/// other ranks' ask the same questions here.
impl super::Placement {
    fn rank_of(&self) -> (usize, usize) {
        (self.comm.rank(), self.comm.size())
    }

    /// This rank's part of the attention heads of the layer at `prefix`.
    pub fn attn_part(
        &self,
        ck: &Checkpoint,
        c: &ModelConfig,
        prefix: &str,
    ) -> Result<Option<AttnPart>, CheckpointError> {
        let (rank, size) = self.rank_of();
        self.tensor
            .then(|| AttnPart::load(ck, c, prefix, rank, size))
            .transpose()
    }

    /// This rank's part of the width of the shared expert of the layer at `prefix`.
    pub fn shared_part(
        &self,
        ck: &Checkpoint,
        c: &ModelConfig,
        prefix: &str,
    ) -> Result<Option<WidthPart>, CheckpointError> {
        let inter = c.moe_intermediate_size * c.n_shared_experts;
        let prefix = format!("{prefix}.ffn.shared_experts");
        (self.tensor && c.n_shared_experts > 0)
            .then(|| WidthPart::load(ck, c, &prefix, inter, self.rank_of()))
            .transpose()
    }

    /// This rank's rows of the vocabulary head.
    pub fn head_part(
        &self,
        ck: &Checkpoint,
        c: &ModelConfig,
    ) -> Result<Option<HeadPart>, CheckpointError> {
        let (rank, size) = self.rank_of();
        self.tensor
            .then(|| HeadPart::load(ck, c, rank, size))
            .transpose()
    }
}
