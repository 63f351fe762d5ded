//! Where a layer's routed experts are held: resident, streamed through the expert store, or
//! split by width over ranks; and the loaders that place them so.

use super::{ExpertPlan, ExpertSource, ExpertStore, ExpertWeights};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use crate::parallel::{Placement, WidthPart};
use std::ops::Range;
use std::sync::Arc;

/// Where a layer's routed experts are: in memory, or read from disk through the model's
/// expert cache.
#[derive(Debug)]
pub enum RoutedExperts {
    /// The experts `first..first + experts.len()` (all of them in a single process).
    Resident {
        first: usize,
        experts: Vec<ExpertWeights>,
    },
    /// The experts the store holds, read through its cache.
    Streamed {
        store: Arc<ExpertStore>,
        layer: usize,
    },
    /// This rank's share of every expert's width (tensor parallel without expert
    /// parallelism), resident.
    Sharded(Vec<WidthPart>),
}

impl RoutedExperts {
    /// The ids of the experts held here.
    pub fn held(&self) -> Range<usize> {
        match self {
            RoutedExperts::Resident { first, experts } => *first..first + experts.len(),
            RoutedExperts::Streamed { store, .. } => store.experts(),
            RoutedExperts::Sharded(parts) => 0..parts.len(),
        }
    }
}

/// What this process holds of every main layer's routed experts.
#[derive(Clone)]
pub(crate) enum Holding {
    /// These experts, whole (all of them in a single process).
    Whole(Range<usize>),
    /// Rank `.0` of `.1`'s share of every expert's width.
    Width(usize, usize),
}

impl Holding {
    pub(crate) fn of(placement: Option<&Placement>, c: &ModelConfig) -> Self {
        match placement {
            None => Holding::Whole(0..c.n_routed_experts),
            // Split by width only with the shared expert (tensor parallel), which the
            // width path leaves to its own part.
            Some(pl) if pl.experts_whole() => Holding::Whole(pl.share(c.n_routed_experts)),
            Some(pl) => Holding::Width(pl.comm.rank(), pl.comm.size()),
        }
    }
}

/// The experts `held` of the layer at `prefix`, loaded.
pub(crate) fn resident_experts(
    ck: &Checkpoint,
    c: &ModelConfig,
    prefix: &str,
    held: Range<usize>,
) -> Result<RoutedExperts, CheckpointError> {
    let (d, inter) = (c.hidden_size, c.moe_intermediate_size);
    Ok(RoutedExperts::Resident {
        first: held.start,
        experts: held
            .map(|i| ExpertWeights::load(ck, &format!("{prefix}.ffn.experts.{i}"), d, inter))
            .collect::<Result<Vec<_>, _>>()?,
    })
}

/// A main layer's routed experts as `holding` says: through `store` when they are streamed.
pub(crate) fn layer_experts(
    ck: &Checkpoint,
    c: &ModelConfig,
    layer: usize,
    store: Option<&Arc<ExpertStore>>,
    holding: &Holding,
) -> Result<RoutedExperts, CheckpointError> {
    let prefix = format!("layers.{layer}");
    match (store, holding) {
        (Some(store), _) => Ok(RoutedExperts::Streamed {
            store: Arc::clone(store),
            layer,
        }),
        (None, Holding::Whole(held)) => resident_experts(ck, c, &prefix, held.clone()),
        (None, &Holding::Width(rank, size)) => Ok(RoutedExperts::Sharded(
            (0..c.n_routed_experts)
                .map(|e| {
                    let p = format!("{prefix}.ffn.experts.{e}");
                    WidthPart::load(ck, c, &p, c.moe_intermediate_size, (rank, size))
                })
                .collect::<Result<_, _>>()?,
        )),
    }
}

/// The store the routed experts stream through, when the plan streams them.
pub(crate) fn expert_store(
    ck: &Checkpoint,
    c: &ModelConfig,
    plan: ExpertPlan,
    holding: &Holding,
) -> Result<Option<Arc<ExpertStore>>, CheckpointError> {
    let (ExpertPlan::Streamed { cache_bytes }, Holding::Whole(held)) = (plan, holding) else {
        return match plan {
            ExpertPlan::Resident => Ok(None),
            ExpertPlan::Streamed { .. } => Err(CheckpointError::InvalidValue {
                name: "expert cache".into(),
                reason: "experts split by width (tensor parallel without \
                         --enable-expert-parallel) stay resident; split them whole with \
                         --enable-expert-parallel to stream them"
                    .into(),
            }),
        };
    };
    Ok(Some(Arc::new(ExpertStore::new(
        ck,
        expert_sources(ck, c, held)?,
        held.clone(),
        cache_bytes,
        2 * c.num_experts_per_tok,
    )?)))
}

/// Where the routed experts `held` of every main layer lie (`layer · held.len() + expert
/// − held.start`), checked as a load would check them.
pub(crate) fn expert_sources(
    ck: &Checkpoint,
    c: &ModelConfig,
    held: &Range<usize>,
) -> Result<Vec<ExpertSource>, CheckpointError> {
    let (d, inter) = (c.hidden_size, c.moe_intermediate_size);
    let mut out = Vec::with_capacity(c.num_hidden_layers * held.len());
    for l in 0..c.num_hidden_layers {
        for i in held.clone() {
            let p = format!("layers.{l}.ffn.experts.{i}");
            let part = |w: &str, shape: [usize; 2]| {
                let name = format!("{p}.{w}.weight");
                ck.matrix_source(&name, &shape)?
                    .ok_or_else(|| CheckpointError::InvalidValue {
                        name: name.clone(),
                        reason: "stored in a form that is converted at load (F16, FP4 scales \
                                 that are not per-row E8M0, or HF's stacked FP8 experts), so \
                                 it cannot be streamed; load it resident"
                            .into(),
                    })
            };
            out.push(ExpertSource {
                parts: [
                    part("w1", [inter, d])?,
                    part("w2", [d, inter])?,
                    part("w3", [inter, d])?,
                ],
            });
        }
    }
    Ok(out)
}
