//! `deepinfer bench cache`: what the cache pools hold per token of context under each
//! numerics, and the longest context a budget holds — arithmetic on the checkpoint's config
//! (no weights are read), the same layout the engine allocates.

use anyhow::{Context, Result};
use clap::Args;
use deepinfer_engine::cache::layout::{CSA_ENTRIES, HCA_ENTRIES, INDEXER_KEYS};
use deepinfer_engine::cache::CacheManager;
use deepinfer_engine::cache::{default_block_tokens, CacheBudget, CacheConfig, CacheLayout};
use deepinfer_model::config::ModelConfig;
use deepinfer_model::numerics::Numerics;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct CacheArgs {
    /// Checkpoint directory (only its config.json is read).
    #[arg(long)]
    pub model: PathBuf,
    /// Cache budget for the longest-context column, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub budget_mib: usize,
}

pub fn run(args: CacheArgs) -> Result<()> {
    let path = args.model.join("config.json");
    let base =
        ModelConfig::from_file(&path).with_context(|| format!("reading {}", path.display()))?;
    println!(
        "deepinfer bench cache: {} ({} layers), one sequence, budget {} MiB",
        args.model.display(),
        base.num_hidden_layers,
        args.budget_mib
    );
    println!(
        "{:<10} {:>14} {:>14} {:>14} {:>14} {:>16} {:>14}",
        "numerics",
        "state B/seq",
        "CSA KV B/tok",
        "HCA KV B/tok",
        "idx keys B/tok",
        "total B/tok",
        "longest ctx"
    );
    for numerics in [Numerics::Reference, Numerics::Official] {
        let mut c = base.clone();
        c.numerics = numerics;
        let layout = CacheLayout::new(&c, 0, default_block_tokens(&c), 0)?;
        let per_token = |name: &str| {
            layout
                .pools
                .iter()
                .find(|p| p.name == name)
                .map_or(0.0, |p| (p.window_floats() * 4) as f64 / p.ratio as f64)
        };
        let kinds = [CSA_ENTRIES, HCA_ENTRIES, INDEXER_KEYS].map(per_token);
        let cache = CacheConfig {
            budget: CacheBudget::Bytes(args.budget_mib << 20),
            max_seqs: 1,
            rollback_slack: 0,
            block_tokens: default_block_tokens(&c),
            prefix_caching: false,
            draft_layers: 0,
        };
        let longest = CacheManager::max_tokens_for(&c, cache)?;
        println!(
            "{:<10} {:>14} {:>14.1} {:>14.1} {:>14.1} {:>16.1} {:>14}",
            numerics.name(),
            layout.slot_bytes(),
            kinds[0],
            kinds[1],
            kinds[2],
            kinds.iter().sum::<f64>(),
            longest
        );
    }
    println!(
        "(state: each sequence's window rings and compressor pending rows; the pools grow per \
         token; longest: one sequence in the budget)"
    );
    Ok(())
}
