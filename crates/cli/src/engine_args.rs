//! The engine's knobs, shared by every subcommand that runs one.

use crate::load_args::{available, LoadArgs};
use crate::memory::{Asked, Split, WeightNeeds, MOST_SEQS, UNKNOWN_CACHE};
use crate::ranks;
use anyhow::{Context, Result};
use clap::Args;
use deepinfer_engine::cache::disk::DiskConfig;
use deepinfer_engine::cache::{default_block_tokens, CacheBudget, CacheConfig};
use deepinfer_engine::engine::{self, EngineConfig};
use deepinfer_engine::scheduler::SchedulerConfig;
use deepinfer_engine::spec::{SpecMethod, SpeculativeConfig};
use deepinfer_model::checkpoint::Checkpoint;
use deepinfer_model::config::ModelConfig;
use deepinfer_model::experts::StoredBytes;
use deepinfer_model::v4::Model;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Most sequences in flight at once (default: as many as half the cache pools hold in
    /// state, at most 64).
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Most tokens in one forward step (prefill chunks, decode and draft tokens together).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Most prompt tokens one sequence feeds per step (default: the step budget).
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    /// Longest sequence (prompt + output); default: the longest the cache budget holds,
    /// at most the model's max_position_embeddings.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Memory for the cache pools, in MiB (default: what the weights leave of the memory
    /// this process may use, at least 256 MiB and at most a quarter of it).
    #[arg(long)]
    pub cache_budget_mib: Option<usize>,
    /// Speculative decoding, as vLLM spells it: a JSON object such as
    /// '{"method": "mtp", "num_speculative_tokens": 3}' (drafts from the checkpoint's MTP
    /// block; "adaptive": false keeps drafting where it does not pay).
    #[arg(long)]
    pub speculative_config: Option<String>,
    /// Draft tokens per step; alone it means '{"method": "mtp"}' with that many tokens.
    #[arg(long)]
    pub num_speculative_tokens: Option<usize>,
    /// Tokens per cache block, the unit of prefix reuse: a multiple of the model's
    /// compress ratios (default: the smallest such multiple of at least 128).
    #[arg(long)]
    pub block_size: Option<usize>,
    /// Reuse the cache of earlier requests that share a prompt prefix (on by default, as
    /// in vLLM; snapshots take a quarter of the budget after the state slots).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Turn prefix caching off.
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    /// Keep the prefix cache on disk too, in DIR (off by default): blocks are written as
    /// they are cached and snapshots as they leave memory, so a prefix evicted from memory,
    /// or cached before a restart, is read back instead of computed again.
    #[arg(long, value_name = "DIR")]
    pub prefix_cache_dir: Option<PathBuf>,
    /// The most the prefix cache directory may hold, in GiB (the least recently used
    /// entries go first).
    #[arg(long, default_value_t = 16.0, value_name = "GIB")]
    pub prefix_cache_disk_gib: f64,
    #[command(flatten)]
    pub load: LoadArgs,
    /// The memory split [`Self::load_model`] chose.
    #[arg(skip)]
    split: OnceLock<Split>,
    /// The identity of the checkpoint [`Self::load_model`] loaded (keys the disk cache).
    #[arg(skip)]
    checkpoint: OnceLock<[u8; 32]>,
}

impl EngineArgs {
    /// Loads the model in `dir`, the memory it may use split between its weights and the
    /// cache pools ([`crate::memory`]; one stderr line says how).
    pub fn load_model(&self, dir: &Path, progress: impl FnMut(usize, usize)) -> Result<Model> {
        let split = self
            .memory_split(dir, available())
            .with_context(|| format!("loading {}", dir.display()))?;
        eprintln!("{}", split.line);
        let budget = split.weights;
        let _ = self.split.set(split);
        if self.prefix_cache_dir.is_some() {
            let ck = Checkpoint::open(dir)?;
            let (_, config) = ModelConfig::of_checkpoint(dir, &ck)?;
            let _ = self.checkpoint.set(ck.identity(&config));
        }
        self.load.load(dir, budget, progress)
    }

    /// The disk tier of the prefix cache, if `--prefix-cache-dir` asks for one.
    fn prefix_disk(&self) -> Result<Option<DiskConfig>> {
        let Some(dir) = &self.prefix_cache_dir else {
            return Ok(None);
        };
        anyhow::ensure!(
            !self.no_enable_prefix_caching,
            "--prefix-cache-dir keeps the prefix cache on disk, and --no-enable-prefix-caching \
             turns that cache off: drop one of them"
        );
        let gib = self.prefix_cache_disk_gib;
        anyhow::ensure!(
            gib.is_finite() && gib > 0.0 && gib <= (1u64 << 20) as f64,
            "--prefix-cache-disk-gib {gib}: give the most the directory may hold, in GiB \
             (more than 0, at most 1048576)"
        );
        // Known once the model is loaded; before that (sizing the memory) it does not matter.
        Ok(self.checkpoint.get().map(|&checkpoint| DiskConfig {
            dir: dir.clone(),
            max_bytes: (gib * (1u64 << 30) as f64) as u64,
            checkpoint,
            kernels: deepinfer_kernels::cpu::family(),
        }))
    }

    /// The split for the checkpoint in `dir`, read from its config and tensor index, of
    /// the `available` bytes this process may use.
    fn memory_split(&self, dir: &Path, available: Option<usize>) -> Result<Split> {
        let ck = Checkpoint::open(dir)?;
        let (model, _) = ModelConfig::of_checkpoint(dir, &ck)?;
        let bytes = StoredBytes::of(&ck);
        // The ranks of a job share the weights (roughly evenly: the model's own plan, per
        // rank, is what holds them to their budget).
        let ranks = ranks::world().map_or(1, |w| w.size()) as u64;
        let weights = WeightNeeds {
            all: (bytes.dense + bytes.experts) / ranks,
            least: (bytes.dense + bytes.least_expert_cache(&model)) / ranks,
        };
        let asked = Asked {
            memory_budget: self.load.memory_budget_mib.map(|m| m << 20),
            cache: self.cache_budget_mib.map(|m| m << 20),
            max_num_seqs: self.max_num_seqs,
        };
        let config = self.engine_config(&model, "", 0, 1)?;
        let sizes = engine::cache_sizes(&model, &config)?;
        crate::memory::split(available, weights, sizes, &asked)
    }

    /// The cache pools' bytes and the most sequences: the split's, else the flags' or the
    /// defaults where no model was loaded through [`Self::load_model`].
    fn cache_and_seqs(&self) -> (usize, usize) {
        match self.split.get() {
            Some(s) => (s.cache, s.max_num_seqs),
            None => (
                self.cache_budget_mib.map_or(UNKNOWN_CACHE, |m| m << 20),
                self.max_num_seqs.unwrap_or(MOST_SEQS),
            ),
        }
    }

    pub fn config(&self, model: &ModelConfig, model_name: &str) -> Result<EngineConfig> {
        let config = self.bench_config(model, model_name)?;
        if let Some(SpecMethod::Replay { .. }) = config.speculative.as_ref().map(|s| &s.method) {
            anyhow::bail!(
                "--speculative-config: method \"replay\" replays a plain run's tokens and only \
                 `deepinfer bench` makes that run"
            );
        }
        Ok(config)
    }

    /// [`Self::config`], also taking the replay drafter (which needs a plain run first).
    pub fn bench_config(&self, model: &ModelConfig, model_name: &str) -> Result<EngineConfig> {
        let (cache, seqs) = self.cache_and_seqs();
        let mut config = self.engine_config(model, model_name, cache, seqs)?;
        if self.max_model_len.is_none() {
            config.scheduler.max_model_len = self.default_max_model_len(model, &config)?;
        }
        Ok(config)
    }

    /// The engine's configuration with `cache` bytes of pools for at most `seqs` sequences.
    fn engine_config(
        &self,
        model: &ModelConfig,
        model_name: &str,
        cache: usize,
        seqs: usize,
    ) -> Result<EngineConfig> {
        let speculative = match (&self.speculative_config, self.num_speculative_tokens) {
            (Some(json), k) => Some(SpeculativeConfig::from_json(json, k)?),
            (None, Some(k)) => Some(SpeculativeConfig::from_json(
                &format!(r#"{{"method": "mtp", "num_speculative_tokens": {k}}}"#),
                None,
            )?),
            (None, None) => None,
        };
        Ok(EngineConfig {
            model_name: model_name.into(),
            scheduler: SchedulerConfig {
                max_num_seqs: seqs,
                max_num_batched_tokens: self.max_num_batched_tokens,
                prefill_chunk: self.prefill_chunk,
                max_model_len: self.max_model_len.unwrap_or(model.max_position_embeddings),
            },
            cache: CacheConfig {
                budget: CacheBudget::Bytes(cache),
                max_seqs: seqs,
                block_tokens: self
                    .block_size
                    .unwrap_or_else(|| default_block_tokens(model)),
                prefix_caching: !self.no_enable_prefix_caching,
                ..CacheConfig::default()
            },
            forced_output: None,
            speculative,
            prefix_disk: self.prefix_disk()?,
        })
    }

    /// Without `--max-model-len`: the model's context, or less if the cache budget holds
    /// less (an explicit length that does not fit stays an error, at engine start).
    fn default_max_model_len(&self, model: &ModelConfig, config: &EngineConfig) -> Result<usize> {
        let fits = engine::max_model_len_that_fits(model, config)?;
        let max_pos = model.max_position_embeddings;
        if fits < max_pos {
            eprintln!(
                "max_model_len {fits}: the longest context the cache pools' {} MiB hold (the \
                 model allows {max_pos}; --cache-budget-mib gives them more)",
                config.cache.budget.resolve()? >> 20
            );
            Ok(fits)
        } else {
            Ok(max_pos)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        engine: EngineArgs,
    }

    const GIB: usize = 1 << 30;

    /// A whole V4-Flash GGUF file laid out as antirez's ds4 q2 (81 GiB; the header of
    /// tools/make_gguf_plan_fixture.py, its data section a sparse hole): on a 96 GiB box it
    /// plans every weight resident beside the cache pools; on 64 GiB its experts stream.
    #[test]
    fn a_ds4_q2_file_runs_resident_on_a_96_gib_box() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ds4-q2.gguf");
        let fixture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/gguf/ds4-q2-flash.header.gguf"
        );
        std::fs::copy(fixture, &path).unwrap();
        // Only the header is read: any length past the last tensor's end will do.
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(1 << 40).unwrap();
        let ck = Checkpoint::open(&path).unwrap();
        let bytes = StoredBytes::of(&ck);
        let total = bytes.dense + bytes.experts;
        assert!(
            (80 * GIB as u64..83 * GIB as u64).contains(&total),
            "{} GiB",
            total >> 30
        );
        let args = Cli::parse_from(["deepinfer"]).engine;
        let s = args.memory_split(&path, Some(96 * GIB)).unwrap();
        assert!(s.line.contains("resident"), "{}", s.line);
        assert!(s.weights.unwrap() as u64 >= total, "{}", s.line);
        assert!(s.cache >= 256 << 20 && s.max_num_seqs >= 1, "{}", s.line);
        let s = args.memory_split(&path, Some(64 * GIB)).unwrap();
        assert!(s.line.contains("streamed from disk"), "{}", s.line);
    }
}
