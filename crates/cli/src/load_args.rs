//! How the weights are held: resident, or the routed experts streamed from disk.

use std::path::Path;

use anyhow::{Context, Result};
use clap::Args;
use deepinfer_model::experts::{available_memory, MemoryPlan};
use deepinfer_model::v4::Model;

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
}

/// Left for what the process needs besides weights and cache pools (scratch, tokenizer,
/// the page cache of the dense part while it loads): 512 MiB and 5 % of what is available.
fn margin(available: usize) -> usize {
    (512 << 20) + available / 20
}

impl LoadArgs {
    /// The plan's inputs; `cache_pools` bytes are set aside for the cache pools.
    pub fn memory_plan(&self, cache_pools: usize) -> MemoryPlan {
        let budget = match self.memory_budget_mib {
            Some(mib) => Some(mib << 20),
            None => {
                available_memory().map(|a| a.saturating_sub(cache_pools).saturating_sub(margin(a)))
            }
        };
        MemoryPlan {
            budget,
            expert_cache: self.expert_cache_mib.map(|mib| mib << 20),
        }
    }

    /// Loads `dir` under the plan and says on stderr which plan it chose and why.
    pub fn load(
        &self,
        dir: &Path,
        cache_pools: usize,
        progress: impl FnMut(usize, usize),
    ) -> Result<Model> {
        let plan = self.memory_plan(cache_pools);
        let model = Model::load_with(dir, &plan, progress)
            .with_context(|| format!("loading {}", dir.display()))?;
        if model.weights.expert_store.is_some() {
            eprintln!("memory plan: {}", model.memory_plan());
        }
        Ok(model)
    }
}
