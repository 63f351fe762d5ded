//! How the weights are held: resident, or the routed experts streamed from disk.

use std::path::Path;

use crate::ranks;
use crate::thread_args::ThreadArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use deepinfer_engine::dist::context::ContextWorker;
use deepinfer_model::experts::{available_memory, MemoryPlan};
use deepinfer_model::numerics::Numerics;
use deepinfer_model::parallel::{Collectives, Placement};
use deepinfer_model::v4::{Model, Worker};
use std::sync::Arc;

#[derive(Args, Debug, Clone, Default)]
pub struct LoadArgs {
    /// With a Hugging Face repo id as --model: the branch, tag or commit to load (default
    /// main).
    #[arg(long)]
    pub revision: Option<String>,
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
    /// Started by `mpirun -n N`, N (the default there): split the dense projections over
    /// the processes — the attention heads, the shared expert's width and the vocabulary —
    /// so each holds and reads about an N-th of them, and, without
    /// --enable-expert-parallel, every routed expert by width; 1: the dense part stays on
    /// rank 0 (with --enable-expert-parallel).
    #[arg(long)]
    pub tensor_parallel_size: Option<usize>,
    /// Started by `mpirun -n N`, N: every process holds the whole model, and each prefill
    /// step of one sequence of at least --context-parallel-min-tokens is split into N
    /// contiguous ranges by position, one per process (what a range reads of earlier
    /// positions is handed over layer by layer); decode stays on rank 0. Not combined with
    /// the tensor or expert split yet.
    #[arg(long)]
    pub context_parallel_size: Option<usize>,
    /// With --context-parallel-size: the shortest prefill step that is split.
    #[arg(long, default_value_t = 512)]
    pub context_parallel_min_tokens: usize,
    /// `reference`: f32 between the stored weights, what HF transformers computes in
    /// float32. `official`: also DeepSeek's own quantisation points (FP8 activations into
    /// every FP8/FP4 projection, FP8 KV, Hadamard-rotated FP4 indexer queries and keys), as
    /// the model was trained and is served by its authors; on DeepSeek-V4.1, vLLM's FP8
    /// serving arithmetic (MXFP8 activations, FP8 KV records and indexer keys).
    #[arg(long, default_value = "reference")]
    pub numerics: Numerics,
    #[command(flatten)]
    pub threads: ThreadArgs,
}

/// Memory this process may take: what is available to it (the machine's, or its memory
/// cgroup's room), shared by the processes a launcher started on this machine.
pub fn available() -> Option<usize> {
    available_memory().map(|a| a / deepinfer_engine::dist::local_size())
}

impl LoadArgs {
    /// The checkpoint directory `--model` names: a directory, or a Hugging Face repo id
    /// found in (or downloaded into) the local hub cache ([`crate::hub`]).
    pub fn resolve(&self, model: &Path) -> Result<std::path::PathBuf> {
        crate::hub::resolve(model, self.revision.as_deref())
    }

    /// The weights' budget beside `cache_pools` bytes of cache: `--memory-budget-mib`, or
    /// what this process may use ([`available`]) less the pools and the margin.
    pub fn budget_beside(&self, cache_pools: usize) -> Option<usize> {
        match self.memory_budget_mib {
            Some(mib) => Some(mib << 20),
            None => available().map(|a| {
                a.saturating_sub(cache_pools)
                    .saturating_sub(crate::memory::margin(a))
            }),
        }
    }

    /// The plan's inputs for a weights' budget of `budget` bytes.
    fn memory_plan(&self, budget: Option<usize>) -> MemoryPlan {
        MemoryPlan {
            budget,
            expert_cache: self.expert_cache_mib.map(|mib| mib << 20),
        }
    }

    /// Loads `dir` under the plan and says on stderr which plan it chose and why.
    ///
    /// In a job of several processes, rank 0 loads its part and returns; every other rank
    /// serves its part here until rank 0's model is dropped, then ends the process.
    pub fn load(
        &self,
        dir: &Path,
        budget: Option<usize>,
        progress: impl FnMut(usize, usize),
    ) -> Result<Model> {
        // Before any weight is copied: the copies are bound to the nodes that read them.
        self.threads.install()?;
        let plan = self.memory_plan(budget);
        if let Some(n) = self.context_parallel_size {
            return self.load_context_parallel(dir, n, &plan, progress);
        }
        let Some(placement) = self.placement()? else {
            let mut model = Model::load_with(dir, &plan, progress)
                .with_context(|| format!("loading {}", dir.display()))?;
            model.set_numerics(self.numerics)?;
            if model.weights.expert_store.is_some() {
                eprintln!("memory plan: {}", model.memory_plan());
            }
            return Ok(model);
        };
        if placement.comm.rank() != 0 {
            run_worker(dir, &plan, placement, self.numerics);
        }
        let comm = Arc::clone(&placement.comm);
        let (size, by_id) = (comm.size(), placement.experts_whole());
        let mut model = Model::load_split(dir, &plan, placement, progress)
            .with_context(|| format!("loading {}", dir.display()))?;
        // A refusal here ends the job: the other ranks wait in their first collective.
        if let Err(e) = model.set_numerics(self.numerics) {
            comm.abort(&format!("error: {e}"));
        }
        eprintln!("memory plan: {}", model.memory_plan());
        ranks::report_memory(&*comm);
        if by_id && model.config.n_routed_experts < size {
            bail!(
                "{size} processes for {} routed experts: each process needs at least one",
                model.config.n_routed_experts
            );
        }
        Ok(model)
    }

    /// Every process loads the whole model; rank 0 returns it set to split long prefills
    /// over the `n` processes, the others serve their ranges until it goes.
    fn load_context_parallel(
        &self,
        dir: &Path,
        n: usize,
        plan: &MemoryPlan,
        progress: impl FnMut(usize, usize),
    ) -> Result<Model> {
        let Some(comm) = ranks::world() else {
            bail!(
                "--context-parallel-size {n} needs {n} processes: start them with \
                 `mpirun -n {n} deepinfer …`"
            );
        };
        let size = comm.size();
        if n != size {
            bail!("--context-parallel-size {n} with {size} processes: give {size}");
        }
        if self.enable_expert_parallel || self.tensor_parallel_size.is_some_and(|tp| tp > 1) {
            bail!(
                "--context-parallel-size does not combine with --enable-expert-parallel or \
                 --tensor-parallel-size yet: every process holds the whole model"
            );
        }
        let loaded = Model::load_with(dir, plan, progress)
            .with_context(|| format!("loading {}", dir.display()))
            .and_then(|mut m| m.set_numerics(self.numerics).map(|_| m).map_err(Into::into));
        let mut model = match loaded {
            Ok(m) => m,
            Err(e) => comm.abort(&format!("error: {e:#}")),
        };
        eprintln!("memory plan: {}", model.memory_plan());
        ranks::report_memory(&*comm);
        if comm.rank() != 0 {
            run_context_worker(model, comm);
        }
        model.set_context_parallel(comm, self.context_parallel_min_tokens.max(n));
        Ok(model)
    }

    /// How the job's processes split the model, from the flags; `None` for one process.
    fn placement(&self) -> Result<Option<Placement>> {
        let Some(comm) = ranks::world() else {
            if let Some(tp) = self.tensor_parallel_size.filter(|&tp| tp > 1) {
                bail!(
                    "--tensor-parallel-size {tp} needs {tp} processes: start them with \
                     `mpirun -n {tp} deepinfer …`"
                );
            }
            return Ok(None);
        };
        let size = comm.size();
        let expert_parallel = self.enable_expert_parallel;
        let tensor = match self.tensor_parallel_size.unwrap_or(size) {
            1 if expert_parallel => false,
            1 => bail!(
                "started as one of {size} processes with --tensor-parallel-size 1: pass \
                 --enable-expert-parallel to split the routed experts over them, or leave \
                 --tensor-parallel-size at {size}"
            ),
            tp if tp == size => true,
            tp => bail!(
                "--tensor-parallel-size {tp} with {size} processes: give {size} (split the \
                 dense projections) or, with --enable-expert-parallel, 1 (they stay on rank 0)"
            ),
        };
        Ok(Some(Placement {
            comm,
            tensor,
            expert_parallel,
        }))
    }
}

/// A rank other than 0: loads its part, serves rank 0 until told to stop, and ends the
/// process; an error ends the whole job.
fn run_worker(dir: &Path, plan: &MemoryPlan, placement: Placement, numerics: Numerics) -> ! {
    let comm = Arc::clone(&placement.comm);
    let mut worker = match Worker::load(dir, plan, placement) {
        Ok(worker) => worker,
        Err(e) => comm.abort(&format!("cannot load {}: {e}", dir.display())),
    };
    worker.set_numerics(numerics);
    eprintln!("memory plan: {}", worker.memory_plan());
    ranks::report_memory(&*comm);
    if let Err(e) = worker.run() {
        comm.abort(&format!("error: {e}"));
    }
    drop(worker);
    drop(comm);
    deepinfer_engine::dist::finalize();
    std::process::exit(0)
}

/// A rank other than 0 under context parallelism: computes its range of every split step
/// until rank 0's model goes, then ends the process; an error ends the whole job.
fn run_context_worker(model: Model, comm: Arc<dyn Collectives>) -> ! {
    let worker = match ContextWorker::new(model, Arc::clone(&comm)) {
        Ok(w) => w,
        Err(e) => comm.abort(&format!("error: {e}")),
    };
    if let Err(e) = worker.run() {
        comm.abort(&format!("error: {e}"));
    }
    drop(comm);
    deepinfer_engine::dist::finalize();
    std::process::exit(0)
}
