//! `deepinfer bench cache`: what the cache pools hold per token of context under each
//! numerics, and the longest context a budget holds — arithmetic on the checkpoint's config
//! (no weights are read), the same layout the engine allocates.

use anyhow::{Context, Result};
use clap::Args;
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
    let mut header = false;
    for numerics in [Numerics::Reference, Numerics::Official] {
        let mut c = base.clone();
        c.numerics = numerics.for_model(c.v41.is_some());
        let layout = CacheLayout::new(&c, 0, default_block_tokens(&c), 0)?;
        // One column per paged pool the model has (V4: CSA/HCA entries and indexer keys;
        // V4.1: entries and keys of its ratio-1 and ratio-2 sources).
        let pools: Vec<(&str, f64)> = layout
            .pools
            .iter()
            .map(|p| (p.name, (p.window_floats() * 4) as f64 / p.ratio as f64))
            .collect();
        if !header {
            print!("{:<10} {:>14}", "numerics", "state B/seq");
            for (name, _) in &pools {
                print!(" {:>16}", format!("{name} B/tok"));
            }
            println!(" {:>14} {:>14}", "total B/tok", "longest ctx");
            header = true;
        }
        let cache = CacheConfig {
            budget: CacheBudget::Bytes(args.budget_mib << 20),
            block_tokens: default_block_tokens(&c),
            prefix_caching: false,
            ..CacheConfig::default()
        };
        let longest = CacheManager::max_tokens_for(&c, cache)?;
        print!("{:<10} {:>14}", numerics.name(), layout.slot_bytes());
        for (_, per_token) in &pools {
            print!(" {per_token:>16.1}");
        }
        let total: f64 = pools.iter().map(|(_, b)| b).sum();
        println!(" {total:>14.1} {longest:>14}");
    }
    println!(
        "(state: each sequence's window rings and compressor pending rows; the pools grow per \
         token; longest: one sequence in the budget)"
    );
    Ok(())
}
