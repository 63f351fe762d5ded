//! The engine's knobs, shared by every subcommand that runs one.

use clap::Args;
use deepinfer_engine::cache::{CacheBudget, CacheConfig};
use deepinfer_engine::engine::EngineConfig;
use deepinfer_engine::scheduler::SchedulerConfig;
use deepinfer_model::config::ModelConfig;

#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Most sequences in flight at once.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Most tokens in one forward step (prefill chunks and decode tokens together).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Most prompt tokens one sequence feeds per step (default: the step budget).
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    /// Longest sequence (prompt + output); default: the model's max_position_embeddings.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Memory for the cache pools, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub cache_budget_mib: usize,
}

impl EngineArgs {
    pub fn config(&self, model: &ModelConfig, model_name: &str) -> EngineConfig {
        EngineConfig {
            model_name: model_name.into(),
            scheduler: SchedulerConfig {
                max_num_seqs: self.max_num_seqs,
                max_num_batched_tokens: self.max_num_batched_tokens,
                prefill_chunk: self.prefill_chunk,
                max_model_len: self.max_model_len.unwrap_or(model.max_position_embeddings),
            },
            cache: CacheConfig {
                budget: CacheBudget::Bytes(self.cache_budget_mib << 20),
                max_seqs: self.max_num_seqs,
                rollback_slack: 0,
                block_entries: 16,
            },
            forced_output: None,
        }
    }
}
