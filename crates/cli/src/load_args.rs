//! How the weights are held: resident, or the routed experts streamed from disk.

use std::path::Path;

use crate::ranks;
use crate::thread_args::ThreadArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use deepinfer_engine::dist::context::ContextWorker;
use deepinfer_model::experts::{available_memory, MemoryPlan};
use deepinfer_model::numerics::Numerics;
use deepinfer_model::parallel::{Collectives, Grid, Placement};
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
    /// Started by `mpirun -n M`, a divisor N of M: the processes form N groups of M/N
    /// consecutive ranks, each group one copy of the model (split within it by the flags
    /// above when M/N > 1), and each prefill step of one sequence of at least
    /// --context-parallel-min-tokens is split into N contiguous ranges by position, one per
    /// group (what a range reads of earlier positions is handed over layer by layer);
    /// decode stays on the first group.
    #[arg(long)]
    pub context_parallel_size: Option<usize>,
    /// With --context-parallel-size: the shortest prefill step that is split.
    #[arg(long, default_value_t = 512)]
    pub context_parallel_min_tokens: usize,
    /// `reference`: f32 between the stored weights, what HF transformers computes in
    /// float32. `official`: also DeepSeek's own quantisation points (FP8 activations into
    /// every FP8/FP4 projection, FP8 KV, Hadamard-rotated FP4 indexer queries and keys), as
    /// the model was trained and is served by its authors; on DeepSeek-V4.1, vLLM's FP8
    /// serving arithmetic (MXFP8 activations, FP8 KV records and indexer keys). `gguf`:
    /// llama.cpp's CPU arithmetic (each Q8_0/MXFP4 product's input quantised to Q8_0 and
    /// multiplied in integers, BF16 products' inputs rounded to bf16). Default: `gguf` for
    /// a GGUF file, else `reference`.
    #[arg(long)]
    pub numerics: Option<Numerics>,
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
        let Some(world) = ranks::world() else {
            self.refuse_alone()?;
            return self.load_whole(dir, &plan, progress, None);
        };
        let cp = self.context_parallel_size.unwrap_or(1);
        let size = world.size();
        if cp == 0 || size % cp != 0 {
            bail!(
                "--context-parallel-size {cp} with {size} processes: give a divisor of {size} \
                 (the processes form that many groups, each one copy of the model)"
            );
        }
        let grid = Grid::new(&world, cp);
        let mut axes = Vec::new();
        let mut model = match self.placement(grid.tensor, cp)? {
            None => self.load_whole(dir, &plan, progress, Some(&*world))?,
            Some(placement) => {
                let comm = Arc::clone(&placement.comm);
                let model = self.load_split(dir, &plan, placement, progress)?;
                axes.push(ranks::Axis {
                    name: "tensor/expert",
                    comm,
                });
                model
            }
        };
        if let Some(context) = grid.context.filter(|_| cp > 1) {
            if context.rank() != 0 {
                run_context_worker(model, context);
            }
            let comm = Arc::clone(&context);
            model.set_context_parallel(context, self.context_parallel_min_tokens.max(cp));
            axes.push(ranks::Axis {
                name: "context",
                comm,
            });
        }
        ranks::set_axes(axes);
        Ok(model)
    }

    /// One process's flags asking for several.
    fn refuse_alone(&self) -> Result<()> {
        for (flag, n) in [
            ("--tensor-parallel-size", self.tensor_parallel_size),
            ("--context-parallel-size", self.context_parallel_size),
        ] {
            if let Some(n) = n.filter(|&n| n > 1) {
                bail!(
                    "{flag} {n} needs {n} processes: start them with `mpirun -n {n} deepinfer …`"
                );
            }
        }
        Ok(())
    }

    /// `--numerics`, or the checkpoint's own arithmetic: llama.cpp's for a GGUF file.
    pub fn numerics_for(&self, dir: &Path) -> Numerics {
        let gguf = deepinfer_model::checkpoint::gguf::holds_gguf(dir);
        self.numerics.unwrap_or(if gguf {
            Numerics::Gguf
        } else {
            Numerics::Reference
        })
    }

    /// The whole model in this process; in a job (`world`: a context-parallel one whose
    /// groups are one process each), a failure ends every rank.
    fn load_whole(
        &self,
        dir: &Path,
        plan: &MemoryPlan,
        progress: impl FnMut(usize, usize),
        world: Option<&dyn Collectives>,
    ) -> Result<Model> {
        let loaded = Model::load_with(dir, plan, progress)
            .with_context(|| format!("loading {}", dir.display()))
            .and_then(|mut m| {
                m.set_numerics(self.numerics_for(dir))
                    .map(|_| m)
                    .map_err(Into::into)
            });
        let model = match (loaded, world) {
            (Ok(m), _) => m,
            (Err(e), None) => return Err(e),
            (Err(e), Some(w)) => w.abort(&format!("error: {e:#}")),
        };
        if model.weights.expert_store.is_some() || world.is_some() {
            eprintln!("memory plan: {}", model.memory_plan());
        }
        if let Some(w) = world {
            ranks::report_memory(w);
        }
        Ok(model)
    }

    /// This group's share of the model under `placement`: its first rank returns it, the
    /// others serve their part until it goes.
    fn load_split(
        &self,
        dir: &Path,
        plan: &MemoryPlan,
        placement: Placement,
        progress: impl FnMut(usize, usize),
    ) -> Result<Model> {
        if placement.comm.rank() != 0 {
            run_worker(dir, plan, placement, self.numerics_for(dir));
        }
        let comm = Arc::clone(&placement.comm);
        let (size, by_id) = (comm.size(), placement.experts_whole());
        let mut model = Model::load_split(dir, plan, placement, progress)
            .with_context(|| format!("loading {}", dir.display()))?;
        // A refusal here ends the job: the other ranks wait in their first collective.
        if let Err(e) = model.set_numerics(self.numerics_for(dir)) {
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

    /// How the `comm.size()` processes of one group (of `cp` context-parallel groups)
    /// split the model, from the flags; `None`: the group is one process, holding it whole.
    fn placement(&self, comm: Arc<dyn Collectives>, cp: usize) -> Result<Option<Placement>> {
        let size = comm.size();
        let expert_parallel = self.enable_expert_parallel;
        let tp = self.tensor_parallel_size;
        let processes = |what: &str| {
            format!(
                "started as one of {} processes with --context-parallel-size {cp}, so \
                 groups of {size}: {what}",
                size * cp
            )
        };
        if size == 1 {
            return match tp.filter(|&tp| tp > 1) {
                Some(tp) if cp > 1 => bail!(
                    "{}; start {} processes for --tensor-parallel-size {tp}",
                    processes("each holds the whole model"),
                    tp * cp
                ),
                _ if expert_parallel && cp > 1 => bail!(
                    "{}; start a multiple of {cp} processes to split the experts",
                    processes("each holds the whole model")
                ),
                _ => Ok(None),
            };
        }
        let tensor = match tp.unwrap_or(size) {
            1 if expert_parallel => false,
            1 => bail!(
                "started as one of {size} processes with --tensor-parallel-size 1: pass \
                 --enable-expert-parallel to split the routed experts over them, or leave \
                 --tensor-parallel-size at {size}"
            ),
            tp if tp == size => true,
            tp if cp > 1 => bail!(
                "--tensor-parallel-size {tp}: {}",
                processes(&format!("give {size}, or 1 with --enable-expert-parallel"))
            ),
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
