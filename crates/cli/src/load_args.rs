//! How the weights are held: resident, or the routed experts streamed from disk.

use std::path::Path;

use crate::ranks;
use anyhow::{bail, Context, Result};
use clap::Args;
use deepinfer_model::experts::{available_memory, MemoryPlan};
use deepinfer_model::parallel::Collectives;
use deepinfer_model::v4::{ExpertRank, Model};
use std::sync::Arc;

#[derive(Args, Debug, Clone, Default)]
pub struct LoadArgs {
    /// Memory the weights may take, in MiB (default: what the machine has available now,
    /// less the cache pools and a margin). A model larger than that keeps its dense weights
    /// resident and streams its routed experts from disk through a cache of the rest.
    #[arg(long)]
    pub memory_budget_mib: Option<usize>,
    /// Stream the routed experts from disk through a cache of this many MiB, whether or
    /// not they would fit (at least two tokens' worth of experts are kept).
    #[arg(long)]
    pub expert_cache_mib: Option<usize>,
    /// Started by `mpirun -n N`: split the routed experts over the N processes (each loads
    /// only its share; rank 0 also holds the dense part and runs the engine).
    #[arg(long)]
    pub enable_expert_parallel: bool,
    /// Processes the dense layers are split over: 1 (tensor parallelism of the dense
    /// layers is not built yet; use --enable-expert-parallel).
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel_size: usize,
}

/// Left for what the process needs besides weights and cache pools (scratch, tokenizer,
/// the page cache of the dense part while it loads): 512 MiB and 5 % of what is available.
fn margin(available: usize) -> usize {
    (512 << 20) + available / 20
}

impl LoadArgs {
    /// The plan's inputs; `cache_pools` bytes are set aside for the cache pools.
    pub fn memory_plan(&self, cache_pools: usize) -> MemoryPlan {
        // Processes started on one machine share its memory.
        let local = deepinfer_engine::dist::local_size();
        let budget = match self.memory_budget_mib {
            Some(mib) => Some(mib << 20),
            None => available_memory().map(|a| {
                (a / local)
                    .saturating_sub(cache_pools)
                    .saturating_sub(margin(a / local))
            }),
        };
        MemoryPlan {
            budget,
            expert_cache: self.expert_cache_mib.map(|mib| mib << 20),
        }
    }

    /// Loads `dir` under the plan and says on stderr which plan it chose and why.
    ///
    /// In a job of several processes, rank 0 loads its part and returns; every other rank
    /// serves its share of the experts here until rank 0's model is dropped, then ends
    /// the process.
    pub fn load(
        &self,
        dir: &Path,
        cache_pools: usize,
        progress: impl FnMut(usize, usize),
    ) -> Result<Model> {
        let plan = self.memory_plan(cache_pools);
        let world = ranks::world();
        let size = world.as_ref().map_or(1, |w| w.size());
        self.check_parallel(size)?;
        let Some(world) = world else {
            let model = Model::load_with(dir, &plan, progress)
                .with_context(|| format!("loading {}", dir.display()))?;
            if model.weights.expert_store.is_some() {
                eprintln!("memory plan: {}", model.memory_plan());
            }
            return Ok(model);
        };
        if world.rank() != 0 {
            serve_expert_rank(dir, &plan, world);
        }
        let model = Model::load_split(dir, &plan, world, progress)
            .with_context(|| format!("loading {}", dir.display()))?;
        eprintln!("memory plan: {}", model.memory_plan());
        if model.config.n_routed_experts < size {
            bail!(
                "{size} processes for {} routed experts: each process needs at least one",
                model.config.n_routed_experts
            );
        }
        Ok(model)
    }

    /// The parallel flags against the number of processes the job has.
    fn check_parallel(&self, size: usize) -> Result<()> {
        if self.tensor_parallel_size > 1 {
            bail!(
                "--tensor-parallel-size {}: tensor parallelism of the dense layers is not \
                 built yet; start {} processes with mpirun and --enable-expert-parallel",
                self.tensor_parallel_size,
                self.tensor_parallel_size
            );
        }
        if size > 1 && !self.enable_expert_parallel {
            bail!(
                "started as one of {size} processes: pass --enable-expert-parallel to split the \
                 routed experts over them (tensor parallelism of the dense layers is not built \
                 yet)"
            );
        }
        Ok(())
    }
}

/// A rank other than 0: loads its share of the experts, serves rank 0 until told to stop,
/// and ends the process; an error ends the whole job.
fn serve_expert_rank(dir: &Path, plan: &MemoryPlan, world: Arc<dyn Collectives>) -> ! {
    let mut rank = match ExpertRank::load(dir, plan, Arc::clone(&world)) {
        Ok(rank) => rank,
        Err(e) => world.abort(&format!("cannot load {}: {e}", dir.display())),
    };
    eprintln!("memory plan: {}", rank.memory_plan());
    if let Err(e) = rank.run() {
        world.abort(&format!("error: {e}"));
    }
    drop(rank);
    drop(world);
    deepinfer_engine::dist::finalize();
    std::process::exit(0)
}
