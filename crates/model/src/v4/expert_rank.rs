//! A rank other than 0 of a model whose routed experts are split over ranks (see
//! [`crate::parallel`]): it holds its share of every main layer's experts and nothing else,
//! and computes the picks that fall on them whenever rank 0 sends a layer's input.

use super::moe::routed_sum;
use super::workspace::Workspace;
use super::ModelError;
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::experts::{MemoryPlan, StoredBytes};
use crate::parallel::{expert_range, receive_header, Collectives, MoeMessage, Op};
use crate::weights::ExpertShare;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum RankError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("rank 0 sent a message out of protocol: {0}")]
    Protocol(String),
}

pub struct ExpertRank {
    config: ModelConfig,
    share: ExpertShare,
    comm: Arc<dyn Collectives>,
    ws: Workspace,
    memory_plan: String,
}

impl ExpertRank {
    /// Loads this rank's share of the routed experts of the checkpoint in `dir`, held as
    /// `memory` decides for the share's bytes.
    pub fn load(
        dir: &Path,
        memory: &MemoryPlan,
        comm: Arc<dyn Collectives>,
    ) -> Result<Self, ModelError> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let ck = Checkpoint::open(dir)?;
        let n = config.n_routed_experts;
        let bytes = StoredBytes::of(&ck).share(n, comm.rank(), comm.size());
        let (plan, why) = memory.choose(bytes, &config)?;
        let held = expert_range(n, comm.rank(), comm.size());
        let share = ExpertShare::load(&ck, &config, plan, held.clone())?;
        let memory_plan = format!(
            "rank {} of {} holds experts {}..{} of {n} ({} MiB): {why}",
            comm.rank(),
            comm.size(),
            held.start,
            held.end,
            bytes.experts >> 20
        );
        Ok(Self {
            config,
            share,
            comm,
            ws: Workspace::default(),
            memory_plan,
        })
    }

    /// What this rank holds and how.
    pub fn memory_plan(&self) -> &str {
        &self.memory_plan
    }

    /// Serves rank 0's layers until it says stop. An error (a streamed expert that cannot be
    /// read, a message out of protocol) is this rank's to report: rank 0 cannot go on
    /// without it, so the caller ends the job.
    pub fn run(&mut self) -> Result<(), RankError> {
        let invariant = true;
        let widest = self
            .config
            .hidden_size
            .max(self.config.moe_intermediate_size);
        rayon::broadcast(|_| {
            deepinfer_kernels::linear::reserve_scratch(16 * widest);
            deepinfer_kernels::linear::set_batch_invariant(invariant);
        });
        loop {
            match receive_header(&*self.comm) {
                Some((Op::Stop, _, _)) => return Ok(()),
                Some((Op::Moe, layer, tokens)) => self.moe(layer, tokens)?,
                None => return Err(RankError::Protocol("unknown op".into())),
            }
        }
    }

    /// One layer's part: receive the input and routing, compute the picks held here, add
    /// them into the reduction.
    fn moe(&mut self, layer: usize, tokens: usize) -> Result<(), RankError> {
        let c = &self.config;
        let (d, k) = (c.hidden_size, c.num_experts_per_tok);
        let Some(experts) = self.share.layers.get(layer) else {
            return Err(RankError::Protocol(format!("layer {layer}")));
        };
        let ws = &mut self.ws;
        let mut buf = ws.take(MoeMessage::len_for(tokens, d, k));
        self.comm.broadcast_f32(&mut buf);
        let msg = MoeMessage { buf, tokens, d, k };
        let mut ids = ws.take_idx(tokens * k);
        msg.ids_into(&mut ids);
        if let Some(&bad) = ids.iter().find(|&&e| e >= c.n_routed_experts) {
            return Err(RankError::Protocol(format!("expert {bad}")));
        }
        let part = deepinfer_kernels::awake::with_workers_awake(|| {
            routed_sum(experts, None, c, msg.x(), &ids, msg.wts(), ws)
        });
        let mut part = part.map_err(ModelError::from)?;
        self.comm.reduce_sum(&mut part);
        ws.give(part);
        ws.give(msg.buf);
        ws.give_idx(ids);
        Ok(())
    }
}
