//! A rank other than 0 of a split model (see [`crate::parallel`]): it holds its share of
//! the routed experts and, tensor parallel, its parts of the dense projections, and computes
//! with them whatever rank 0 announces, until rank 0's model is dropped.

use super::dspark;
use super::model::describe_share;
use super::moe::{local_part, reduce_with_status, LocalExperts};
use super::tensor_parallel::{head_part, inputs_of_word, out_part, q_part};
use super::workspace::Workspace;
use super::ModelError;
use crate::checkpoint::Checkpoint;
use crate::checkpoint::CheckpointError;
use crate::config::ModelConfig;
use crate::experts::{expert_store, layer_experts, resident_experts};
use crate::experts::{ExpertPlan, Holding, RoutedExperts};
use crate::experts::{MemoryPlan, StoredBytes};
use crate::numerics::Numerics;
use crate::parallel::{receive_header, Collectives, MoeMessage, Op, Placement};
use crate::parallel::{AttnPart, HeadPart, WidthPart};
use std::path::Path;

/// Rank 0 sent a message out of protocol (a bug): the job cannot go on.
#[derive(Debug, thiserror::Error)]
#[error("rank 0 sent a message out of protocol: {0}")]
pub struct WorkerError(String);

pub struct Worker {
    config: ModelConfig,
    /// The config a DSpark drafter's stages compute with (its expert counts), when the
    /// checkpoint ships one: its stages' experts are split over the ranks too.
    stage_config: Option<ModelConfig>,
    weights: RankWeights,
    placement: Placement,
    ws: Workspace,
    memory_plan: String,
}

impl Worker {
    /// Loads this rank's part of the checkpoint in `dir`, the experts held as `memory`
    /// decides for the part's bytes.
    /// Computes with `numerics` (what rank 0 runs with: [`super::Model::set_numerics`]
    /// checks the split allows it).
    pub fn set_numerics(&mut self, numerics: Numerics) {
        self.config.numerics = numerics.for_model(self.config.v41.is_some());
    }

    pub fn load(dir: &Path, memory: &MemoryPlan, placement: Placement) -> Result<Self, ModelError> {
        let ck = Checkpoint::open(dir)?;
        let (config, _) = ModelConfig::of_checkpoint(dir, &ck)?;
        let (rank, size) = (placement.comm.rank(), placement.comm.size());
        let (tensor, by_id) = (placement.tensor, placement.experts_whole());
        let bytes = StoredBytes::of(&ck).share(&config, (rank, size), tensor, by_id);
        let (plan, why) = memory.choose(bytes, &config)?;
        let stage_config =
            dspark::shipped(&ck, &config).map(|dc| dspark::stage_config(&config, &dc));
        let mut weights = RankWeights::load(&ck, &config, plan, &placement)?;
        if let Some(sc) = &stage_config {
            weights.add_stages(&ck, sc, &placement)?;
        }
        let memory_plan = format!("{}: {why}", describe_share(&config, &placement, bytes));
        Ok(Self {
            config,
            stage_config,
            weights,
            placement,
            ws: Workspace::default(),
            memory_plan,
        })
    }

    /// What this rank holds and how.
    pub fn memory_plan(&self) -> &str {
        &self.memory_plan
    }

    /// Serves rank 0 until it says stop. A part that fails (a streamed expert that cannot
    /// be read) is reported to rank 0, which stops its engine and then the job; a message
    /// out of protocol is returned, and the caller ends the job at once.
    pub fn run(&mut self) -> Result<(), WorkerError> {
        let invariant = true;
        let c = &self.config;
        let widest = [
            c.hidden_size,
            c.moe_intermediate_size * c.n_shared_experts.max(1),
            c.q_lora_rank,
            c.num_attention_heads * c.head_dim,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        rayon::broadcast(|_| {
            deepinfer_kernels::linear::reserve_scratch(16 * widest);
            deepinfer_kernels::linear::set_batch_invariant(invariant);
        });
        loop {
            let (op, layer, tokens) = receive_header(&*self.placement.comm)
                .map_err(|w| WorkerError(format!("op {w}")))?;
            if op == Op::Stop {
                return Ok(());
            }
            deepinfer_kernels::awake::with_workers_awake(|| self.serve(op, layer, tokens))?;
        }
    }

    /// One operation rank 0 announced, on `layer` for `t` rows.
    fn serve(&mut self, op: Op, layer: usize, t: usize) -> Result<(), WorkerError> {
        let Self {
            config: c,
            stage_config,
            weights,
            placement,
            ws,
            ..
        } = self;
        let comm = &*placement.comm;
        let missing = |what: &str| WorkerError(format!("{what} of layer {layer}"));
        let part = weights.layers.get(layer);
        match op {
            Op::Moe => {
                let l = part.ok_or_else(|| missing("experts"))?;
                // A layer after the main ones is a drafter's stage, with its own experts.
                let c = match stage_config {
                    Some(sc) if layer >= c.num_hidden_layers => sc,
                    _ => c,
                };
                serve_moe(c, comm, l, t, ws)?;
            }
            Op::AttnQ => {
                let p = part
                    .and_then(|l| l.attn.as_ref())
                    .ok_or_else(|| missing("wq_b"))?;
                let qr = receive(comm, t * c.q_lora_rank, ws);
                let q = q_part(p, &qr, t, None, ws);
                comm.gather_f32(&q, &[], &mut []);
                ws.give(q);
                ws.give(qr);
            }
            Op::AttnOut => {
                let p = part
                    .and_then(|l| l.attn.as_ref())
                    .ok_or_else(|| missing("wo_a"))?;
                let o = receive(comm, t * c.num_attention_heads * c.head_dim, ws);
                let mut out = out_part(p, c, &o, t, comm, ws);
                comm.reduce_sum(&mut out);
                ws.give(out);
                ws.give(o);
            }
            Op::Head => {
                let p = weights
                    .head
                    .as_ref()
                    .ok_or_else(|| WorkerError("this rank holds no part of the head".into()))?;
                let h = receive(comm, t * c.hidden_size, ws);
                // The head's header carries what rank 0's numerics say of its rows.
                let logits = head_part(p, &h, t, inputs_of_word(layer), ws);
                comm.gather_f32(&logits, &[], &mut []);
                ws.give(logits);
                ws.give(h);
            }
            Op::Context => {
                return Err(WorkerError(
                    "a context-parallel step reached a rank holding a split model part \
                     (context parallelism runs whole models on every rank)"
                        .into(),
                ))
            }
            Op::Stop => {}
        }
        Ok(())
    }
}

/// Rank 0's data for an operation, broadcast to every rank.
fn receive(comm: &dyn Collectives, len: usize, ws: &mut Workspace) -> Vec<f32> {
    let mut buf = ws.take(len);
    comm.broadcast_f32(&mut buf);
    buf
}

/// This rank's part of a MoE: its experts' (and shared part's) sum over the tokens rank 0
/// sent, into the reduction.
fn serve_moe(
    c: &ModelConfig,
    comm: &dyn Collectives,
    l: &RankLayer,
    t: usize,
    ws: &mut Workspace,
) -> Result<(), WorkerError> {
    let (d, k) = (c.hidden_size, c.num_experts_per_tok);
    let buf = receive(comm, MoeMessage::len_for(t, d, k), ws);
    let msg = MoeMessage {
        buf,
        tokens: t,
        d,
        k,
    };
    let mut ids = ws.take_idx(t * k);
    msg.ids_into(&mut ids);
    if let Some(&bad) = ids.iter().find(|&&e| e >= c.n_routed_experts) {
        return Err(WorkerError(format!("expert {bad}")));
    }
    let held = LocalExperts {
        routed: &l.experts,
        shared: None,
        shared_part: l.shared.as_ref(),
        comm: Some(comm),
    };
    let (x, wts) = (msg.x(), msg.wts());
    // A part that fails is reported to rank 0 through the reduction (rank 0 stops
    // its engine, so a server's health turns 503 before the job ends).
    let (mut out, failed) = match local_part(&held, c, x, &ids, wts, ws) {
        Ok(out) => (out, false),
        Err(e) => {
            report(comm, &format!("error: {e}"));
            (ws.take(t * c.hidden_size), true)
        }
    };
    reduce_with_status(comm, &mut out, failed);
    ws.give(out);
    ws.give(msg.buf);
    ws.give_idx(ids);
    Ok(())
}

/// This rank's message on stderr, in one write so the ranks' lines do not interleave.
fn report(comm: &dyn Collectives, what: &str) {
    let line = format!("rank {} of {}: {what}\n", comm.rank(), comm.size());
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// What a rank other than 0 of a split model holds: its share of every main layer's routed
/// experts and, tensor parallel, its parts of the dense projections; nothing else.
pub struct RankWeights {
    /// One per main layer, then one per DSpark stage.
    pub layers: Vec<RankLayer>,
    pub head: Option<HeadPart>,
}

/// A rank's part of one main layer (or of a DSpark stage: its experts alone).
pub struct RankLayer {
    pub experts: RoutedExperts,
    pub attn: Option<AttnPart>,
    pub shared: Option<WidthPart>,
}

impl RankWeights {
    /// This rank's part as `placement` splits the model.
    pub fn load(
        ck: &Checkpoint,
        c: &ModelConfig,
        plan: ExpertPlan,
        placement: &Placement,
    ) -> Result<Self, CheckpointError> {
        let holding = Holding::of(Some(placement), c);
        let store = expert_store(ck, c, plan, &holding)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let p = format!("layers.{l}");
            layers.push(RankLayer {
                experts: layer_experts(ck, c, l, store.as_ref(), &holding)?,
                attn: placement.attn_part(ck, c, &p)?,
                shared: placement.shared_part(ck, c, &p)?,
            });
        }
        let head = placement.head_part(ck, c)?;
        Ok(Self { layers, head })
    }

    /// This rank's share (by id) of the routed experts of each stage of a DSpark drafter
    /// of stage config `sc`, after the main layers (rank 0's `draft_stage`).
    fn add_stages(
        &mut self,
        ck: &Checkpoint,
        sc: &ModelConfig,
        placement: &Placement,
    ) -> Result<(), CheckpointError> {
        let stages = sc.dspark.as_ref().map_or(0, |dc| dc.stages);
        for i in 0..stages {
            let held = placement.share(sc.n_routed_experts);
            self.layers.push(RankLayer {
                experts: resident_experts(ck, sc, &dspark::stage_prefix(i), held)?,
                attn: None,
                shared: None,
            });
        }
        Ok(())
    }
}
