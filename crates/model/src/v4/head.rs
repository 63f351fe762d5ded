//! The model's last step: the final streams collapsed to one vector per token, normed, and
//! projected onto the vocabulary (whole, or split by rows over ranks).

use super::hyper::{hc_head, HcHead};
use super::tensor_parallel::split_head;
use super::workspace::Workspace;
use crate::batch::Logits;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use crate::linear::Linear;
use crate::parallel::{Collectives, HeadPart, Placement};
use crate::profile::{scope, Op};
use deepinfer_kernels::norm::rms_norm_rows;
use std::sync::Arc;

/// The vocabulary head, whole or this rank's rows of it.
#[derive(Debug)]
pub enum HeadWeights {
    Whole(Linear),
    Split {
        part: HeadPart,
        comm: Arc<dyn Collectives>,
    },
}

impl HeadWeights {
    /// Whole, or this rank's rows when the model is split by tensor parallelism.
    pub(crate) fn load(
        ck: &Checkpoint,
        c: &ModelConfig,
        placement: Option<&Placement>,
    ) -> Result<Self, CheckpointError> {
        if let Some(pl) = placement {
            if let Some(part) = pl.head_part(ck, c)? {
                let comm = Arc::clone(&pl.comm);
                return Ok(HeadWeights::Split { part, comm });
            }
        }
        let (v, d) = (c.vocab_size, c.hidden_size);
        Ok(HeadWeights::Whole(Linear::load(ck, "head", v, d)?))
    }
}

/// The hyper head, final norm and vocabulary projection: the main model's or the MTP
/// block's own (which shares the main head unless the checkpoint ships a different copy).
/// How the final streams become one vector per token.
pub(crate) enum FinalCollapse<'a> {
    /// V4's hyper head.
    Hyper(&'a HcHead),
    /// V4.1: the last sublayer's `pre`, `[N, hc]` over the whole batch.
    Pre(&'a [f32]),
}

pub(crate) struct Head<'a> {
    pub collapse: FinalCollapse<'a>,
    pub norm: &'a [f32],
    pub head: &'a HeadWeights,
}

impl Head<'_> {
    /// Logits of the flat rows `rows` of the streams `x: [N, hc, D]`; only those rows go
    /// through the head.
    pub(crate) fn logits(
        &self,
        c: &ModelConfig,
        x: &[f32],
        rows: &[usize],
        logits: &mut Logits,
        ws: &mut Workspace,
    ) {
        let (d, hc, m) = (c.hidden_size, c.hc_mult, rows.len());
        let mut picked = ws.take(m * hc * d);
        for (o, &r) in picked.chunks_exact_mut(hc * d).zip(rows) {
            o.copy_from_slice(&x[r * hc * d..(r + 1) * hc * d]);
        }
        let mut h = match self.collapse {
            FinalCollapse::Hyper(hh) => hc_head(&picked, m, &hh.fn_, &hh.base, hh.scale, c, ws),
            FinalCollapse::Pre(pre) => {
                let mut h = ws.take(m * d);
                for ((out, &r), streams) in h
                    .chunks_exact_mut(d)
                    .zip(rows)
                    .zip(picked.chunks_exact(hc * d))
                {
                    for (s, stream) in streams.chunks_exact(d).enumerate() {
                        deepinfer_kernels::vector::axpy(out, pre[r * hc + s], stream);
                    }
                }
                h
            }
        };
        {
            let _p = scope(Op::NormRope);
            rms_norm_rows(&mut h, self.norm, c.rms_norm_eps);
            c.numerics.dense_input(&mut h);
        }
        logits.vocab = c.vocab_size;
        logits.data.clear();
        logits.data.resize(m * c.vocab_size, 0.0);
        match self.head {
            HeadWeights::Whole(head) => head.forward_dense(&h, m, &mut logits.data, c.numerics),
            HeadWeights::Split { part, comm } => {
                let shape = (c.vocab_size, c.numerics.inputs());
                split_head(&**comm, part, shape, &mut h, m, &mut logits.data, ws)
            }
        }
        ws.give(picked);
        ws.give(h);
    }
}
