//! A model split over ranks by real MPI: this test binary starts itself under `mpirun -n 2`
//! and `-n 3` (oversubscribed), each rank running [`ranks_scenario`]. Rank 0 compares the
//! split model — experts split whole, alone or with the dense projections (tensor
//! parallel), and tensor parallel with every expert split by width —
//! with a single-process one (every position's logits of the golden prompts, fed whole, in
//! chunks and batched; logits within 1e-5), then drives the engine over the split model
//! under forced preemption (HF's greedy tokens) and with aborts and disconnects (pools end
//! empty), restarts on a prefix cache directory (the prefix read back gives the cold
//! split run's bits), drafts with the DSpark drafter (whole on rank 0) over the split target
//! as one process does, and sees the step fail (V4 and V4.1), naming them, when the other ranks' experts
//! cannot be read. The other ranks serve their part of each model rank 0 loads, in the same order.

mod common;

use common::*;
use deepinfer_engine::cache::disk::DiskConfig;
use deepinfer_engine::cache::{CacheManager, SeqId};
use deepinfer_engine::dist::context::ContextWorker;
use deepinfer_engine::engine::{self, EngineConfig, EngineCore, EngineError, EngineHandle};
use deepinfer_engine::request::FinishReason;
use deepinfer_engine::runner::ModelRunner;
use deepinfer_engine::sampling_params::SamplingParams;
use deepinfer_engine::scheduler::SchedulerConfig;
use deepinfer_engine::spec::SpeculativeConfig;
use deepinfer_model::experts::MemoryPlan;
use deepinfer_model::numerics::Numerics;
use deepinfer_model::parallel::{Collectives, Grid, Placement};
use deepinfer_model::v4::dspark::Draft;
use deepinfer_model::v4::{Model, Worker};
use std::process::Command;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The models split by position (context parallelism), each rank holding the whole model.
const CONTEXT_RUNS: [&str; 2] = ["tiny-a", "tiny-v41-b"];

/// The models the scenario runs in official numerics, each in every split: the experts
/// whole, tensor parallel with them, and every expert by width (the ranks round the blocks
/// of `wo_b`'s and `w2`'s inputs their parts cut together).
const OFFICIAL_RUNS: [&str; 3] = ["tiny-a", "tiny-v41-a", "tiny-v41-b"];

fn official_runs() -> impl Iterator<Item = (&'static str, (bool, bool))> {
    OFFICIAL_RUNS
        .into_iter()
        .flat_map(|c| [EXPERTS, BOTH, WIDTH].map(|split| (c, split)))
}

/// Set in the ranks' environment: the scenario runs only under the parent test.
const CHILD: &str = "DEEPINFER_PARALLEL_CHILD";
/// What rank 0 prints when every check passed.
const PASSED: &str = "parallel scenario passed";

/// How a scenario splits the model: `(tensor parallel, experts split whole)`.
const EXPERTS: (bool, bool) = (false, true);
const BOTH: (bool, bool) = (true, true);
const WIDTH: (bool, bool) = (true, false);

/// The models the scenario splits, in the order both sides load them: `(config, layout,
/// experts streamed, split)`.
const MODELS: [(&str, &str, bool, (bool, bool)); 16] = [
    ("tiny-a", "official", false, EXPERTS),
    ("tiny-b", "hf", false, EXPERTS),
    ("tiny-c", "official", false, EXPERTS),
    ("tiny-a", "official", true, EXPERTS),
    ("tiny-a", "official", false, BOTH),
    ("tiny-b", "hf", false, BOTH),
    ("tiny-c", "official", true, BOTH),
    ("tiny-a", "official", false, WIDTH),
    ("tiny-b", "hf", false, WIDTH),
    ("tiny-c", "official", false, WIDTH),
    ("tiny-v41-a", "official", false, EXPERTS),
    ("tiny-v41-b", "official", false, EXPERTS),
    ("tiny-v41-a", "official", false, BOTH),
    ("tiny-v41-b", "official", true, BOTH),
    ("tiny-v41-a", "official", false, WIDTH),
    ("tiny-v41-b", "official", false, WIDTH),
];

/// The models whose step fails when the other ranks' experts cannot be read: V4's and
/// V4.1's.
const FAILING: [&str; 2] = ["tiny-a", "tiny-v41-b"];

/// The DSpark scenario's drafters (V4's and V4.1's) and splits: experts split whole, and
/// tensor parallel (the target's head split, which the drafter's logits go through).
const DSPARK_RUNS: [(&str, (bool, bool)); 4] = [
    ("tiny-a-dspark", EXPERTS),
    ("tiny-a-dspark", BOTH),
    ("tiny-v41-a", EXPERTS),
    ("tiny-v41-a", BOTH),
];

fn mpirun(n: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--oversubscribe",
        "--allow-run-as-root",
        "-n",
        &n.to_string(),
    ]);
    cmd
}

fn run_ranks(n: usize) {
    let exe = std::env::current_exe().unwrap();
    let out = mpirun(n)
        .arg(exe)
        .args([
            "ranks_scenario",
            "--exact",
            "--include-ignored",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .expect("mpirun runs (install Open MPI: apt-get install openmpi-bin libopenmpi-dev)");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains(PASSED),
        "mpirun -n {n} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // (libtest's "test ranks_scenario ... " may precede the first line.)
    for line in stdout
        .lines()
        .filter_map(|l| l.find("fp ranks").map(|i| &l[i..]))
    {
        println!("{line} on {n} ranks");
    }
}

#[test]
fn two_ranks_equal_one_process() {
    run_ranks(2);
}

#[test]
fn three_ranks_equal_one_process() {
    run_ranks(3);
}

#[test]
fn four_ranks_as_two_context_groups_of_two() {
    run_ranks(4);
}

#[test]
#[ignore = "runs on every rank of the mpirun the tests above start"]
fn ranks_scenario() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let world = deepinfer_engine::dist::init()
        .expect("joins the job")
        .expect("started by mpirun with more than one rank");
    match world.size() {
        4 => grid_scenario(&world),
        _ => scenarios(&world),
    }
    if world.rank() == 0 {
        println!("{PASSED} on {} ranks", world.size());
    }
    drop(world);
    deepinfer_engine::dist::finalize();
}

/// Context parallelism composed with the tensor and expert split, under `mpirun -n 4`: two
/// groups of two ranks (0-1, 2-3), each one copy of the model split within it, ranks 0 and 2
/// handing the state on. `(config, split, numerics)`.
const GRID_RUNS: [(&str, (bool, bool), Numerics); 4] = [
    ("tiny-a", BOTH, Numerics::Reference),
    ("tiny-v41-b", WIDTH, Numerics::Reference),
    ("tiny-v41-b", EXPERTS, Numerics::Official),
    ("tiny-v41-b", BOTH, Numerics::Official),
];

fn grid_scenario(world: &Arc<dyn Collectives>) {
    let grid = Grid::new(world, 2);
    for (config, split, numerics) in GRID_RUNS {
        if let Some(model) = grid_model(world, &grid, config, split, numerics) {
            let label = format!("{config} {numerics:?} split {split:?} in 2 context groups");
            let context = grid.context.as_ref().unwrap();
            prefills_split_as_one_process(config, model, context, &label, within);
        }
    }
    // DSpark drafting over split prefills, tensor parallel within the groups: two models.
    let drafting = || grid_model(world, &grid, DSPARK_CONTEXT, BOTH, Numerics::Reference);
    match &grid.context {
        Some(context) if world.rank() == 0 => {
            drafts_split_as_one_process(&|| drafting().unwrap(), context, within);
        }
        _ => {
            drafting();
            drafting();
        }
    }
}

/// Rank 0's model of `config` split by `split` within its group and by position over the
/// groups; the other ranks serve their parts until it goes (`None`).
fn grid_model(
    world: &Arc<dyn Collectives>,
    grid: &Grid,
    config: &str,
    split: (bool, bool),
    numerics: Numerics,
) -> Option<Model> {
    let placement = Placement {
        comm: Arc::clone(&grid.tensor),
        tensor: split.0,
        expert_parallel: split.1,
    };
    let Some(context) = &grid.context else {
        serve_in(placement, config, numerics);
        return None;
    };
    let dir = model_dir(config, "official");
    let mut model = Model::load_split(&dir, &plan(false), placement, |_, _| {})
        .unwrap_or_else(|e| world.abort(&format!("{config}: {e}")));
    model.set_numerics(numerics).unwrap();
    if context.rank() != 0 {
        let worker = ContextWorker::new(model, Arc::clone(context)).unwrap();
        if let Err(e) = worker.run() {
            world.abort(&format!("{config} context parallel: {e}"));
        }
        return None;
    }
    model.set_context_parallel(Arc::clone(context), 2);
    Some(model)
}

/// A rank other than a group's first: its part of `config` in `numerics` until the first
/// drops the model.
fn serve_in(placement: Placement, config: &str, numerics: Numerics) {
    let comm = Arc::clone(&placement.comm);
    let mut worker = Worker::load(&model_dir(config, "official"), &plan(false), placement)
        .unwrap_or_else(|e| comm.abort(&format!("{config}: {e}")));
    worker.set_numerics(numerics);
    if let Err(e) = worker.run() {
        comm.abort(&format!("{config}: {e}"));
    }
}

/// Every scenario but the grid's, under `mpirun -n 2` and `-n 3`.
fn scenarios(world: &Arc<dyn Collectives>) {
    let placement = |(tensor, expert_parallel)| Placement {
        comm: Arc::clone(world),
        tensor,
        expert_parallel,
    };
    if world.rank() == 0 {
        for (config, layout, streamed, split) in MODELS {
            let label = format!("{config}/{layout} streamed {streamed} split {split:?}");
            let dir = model_dir(config, layout);
            let model = Model::load_split(&dir, &plan(streamed), placement(split), |_, _| {});
            let model = model.unwrap();
            compare_with_single_process(config, layout, model, &label, (usize::MAX, 0));
        }
        // Official numerics (V4.1's is vLLM's FP8), the experts split whole: the other ranks
        // round their experts' w2 inputs. Prompts of up to 40 tokens: a longer one meets
        // activations so near an FP8 rounding boundary that a different summation order
        // (the MoE's reduction over ranks) sends them the other way.
        for (config, split) in official_runs() {
            let dir = model_dir(config, "official");
            let mut model =
                Model::load_split(&dir, &plan(false), placement(split), |_, _| {}).unwrap();
            model.set_numerics(Numerics::Official).unwrap();
            // With the dense products split, the partial sums of `wo_b` and of the shared
            // expert's `w2` meet in another order, and an activation within an f32 rounding
            // error of an FP8 boundary then rounds the other way (tiny-v41-b's 29-token
            // prompt, one position, on some splits): such a position may differ by that step.
            let flips = usize::from(split.0);
            let label = format!("{config} official numerics split {split:?}");
            compare_with_single_process(config, "official", model, &label, (40, flips));
        }
        engine_scenarios(&placement(BOTH));
        prefix_on_disk_scenario(&placement(BOTH));
        for (config, split) in DSPARK_RUNS {
            dspark_scenario(config, &placement(split));
        }
        for config in FAILING {
            another_rank_fails(config, placement(BOTH));
        }
        for config in CONTEXT_RUNS {
            context_scenario(config, world);
        }
        context_dspark_scenario(world);
    } else {
        for (config, layout, streamed, split) in MODELS {
            serve_part(placement(split), config, layout, streamed);
        }
        let comm = Arc::clone(world);
        for (config, split) in official_runs() {
            let dir = model_dir(config, "official");
            let mut worker = Worker::load(&dir, &plan(false), placement(split))
                .unwrap_or_else(|e| comm.abort(&format!("{config} official: {e}")));
            worker.set_numerics(Numerics::Official);
            if let Err(e) = worker.run() {
                comm.abort(&format!("{config} official: {e}"));
            }
        }
        // The engine scenarios' two models, then the disk scenario's three.
        for _ in 0..5 {
            serve_part(placement(BOTH), "tiny-a", "official", false);
        }
        for (config, split) in DSPARK_RUNS {
            serve_part(placement(split), config, "official", false);
        }
        for config in FAILING {
            fail_part(config, placement(BOTH));
        }
        let drafting = [DSPARK_CONTEXT; 2];
        for config in CONTEXT_RUNS.into_iter().chain(drafting) {
            let dir = model_dir(config, "official");
            let model = Model::load(&dir).unwrap_or_else(|e| world.abort(&format!("{e}")));
            let worker = ContextWorker::new(model, Arc::clone(world)).unwrap();
            if let Err(e) = worker.run() {
                world.abort(&format!("{config} context parallel: {e}"));
            }
        }
    }
}

fn model_dir(config: &str, layout: &str) -> std::path::PathBuf {
    fixture(config).join(layout)
}

fn plan(streamed: bool) -> MemoryPlan {
    MemoryPlan {
        budget: None,
        // The smallest cache: nearly every step reads.
        expert_cache: streamed.then_some(0),
    }
}

/// A rank other than 0: its part of one model, until rank 0 drops that model.
fn serve_part(placement: Placement, config: &str, layout: &str, streamed: bool) {
    let comm = Arc::clone(&placement.comm);
    let mut worker = Worker::load(&model_dir(config, layout), &plan(streamed), placement)
        .unwrap_or_else(|e| comm.abort(&format!("{config}/{layout}: {e}")));
    if let Err(e) = worker.run() {
        comm.abort(&format!("{config}/{layout}: {e}"));
    }
}

/// Every position's logits within 1e-5 ([`close`]) but at most `flips` positions, which keep
/// the greedy token and differ by less than one FP8 step can move a logit (1e-2).
fn close_but_flips(want: &[Vec<f32>], got: &[Vec<f32>], label: &str, flips: usize) {
    assert_eq!(want.len(), got.len(), "{label}");
    let mut flipped = Vec::new();
    for (pos, (w, g)) in want.iter().zip(got).enumerate() {
        let label = format!("{label} pos {pos}");
        let within = w
            .iter()
            .zip(g)
            .all(|(&x, &y)| (x - y).abs() <= 1e-5 * x.abs().max(1.0));
        if within {
            continue;
        }
        assert!(flipped.len() < flips, "{label}: {}", max_abs_diff(w, g));
        let argmax = |v: &[f32]| (0..v.len()).max_by(|&i, &j| v[i].total_cmp(&v[j]));
        assert_eq!(argmax(w), argmax(g), "{label}: the greedy token");
        assert!(max_abs_diff(w, g) < 1e-2, "{label}: {}", max_abs_diff(w, g));
        flipped.push(pos);
    }
    if !flipped.is_empty() {
        println!("{label}: one FP8 rounding flipped at positions {flipped:?}");
    }
}

fn close(a: &[f32], b: &[f32], label: &str) {
    assert_eq!(a.len(), b.len(), "{label}");
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * x.abs().max(1.0),
            "{label}: logit {i}: {x} vs {y}"
        );
    }
}

/// Every position's logits of the golden prompts of at most `max_len` tokens: fed whole, in
/// chunks of 5, and two prompts in one step, split against one process (in the numerics of
/// the split model).
fn compare_with_single_process(
    config: &str,
    layout: &str,
    split: Model,
    label: &str,
    (max_len, flips): (usize, usize),
) {
    let g = Golden::load(config);
    let mut single = load(config, layout);
    single.set_numerics(split.config.numerics).unwrap();
    let mut one = runner(single, 4, 0);
    let mut many = runner(split, 4, 0);
    let prompts: Vec<Vec<u32>> = g
        .prompts()
        .iter()
        .map(|p| ids(&p["ids"]))
        .filter(|p| p.len() <= max_len)
        .collect();
    // The split logits' bits, printed for tests/fingerprint.rs's comparison between commits.
    let mut fp = Fingerprint::new();
    for (pi, tokens) in prompts.iter().enumerate() {
        let want = chunked_logits(&mut one, tokens, tokens.len());
        for chunk in [tokens.len(), 5] {
            let got = chunked_logits(&mut many, tokens, chunk);
            let label = format!("{label} p{pi} chunk {chunk}");
            close_but_flips(&want, &got, &label, flips);
            got.iter().for_each(|g| fp.f32s(g));
        }
    }
    println!("fp ranks {label}: {:016x}", fp.0);
    let (a, b) = (&prompts[0], &prompts[1]);
    let batched = two_in_one_step(&mut many, a, b);
    let solo = [
        two_in_one_step(&mut one, a, a),
        two_in_one_step(&mut one, b, b),
    ];
    close(&batched[0], &solo[0][0], &format!("{label} batched p0"));
    close(&batched[1], &solo[1][1], &format!("{label} batched p1"));
}

/// The last logits of `a` and `b` fed as two sequences of one step.
fn two_in_one_step(r: &mut TestRunner, a: &[u32], b: &[u32]) -> [Vec<f32>; 2] {
    let (sa, sb): (SeqId, SeqId) = (r.add_sequence().unwrap(), r.add_sequence().unwrap());
    let l = r
        .step(&[
            Feed {
                seq: sa,
                tokens: a,
                all_logits: false,
            },
            Feed {
                seq: sb,
                tokens: b,
                all_logits: false,
            },
        ])
        .unwrap()
        .clone();
    r.free(sa).unwrap();
    r.free(sb).unwrap();
    [l.row(0).to_vec(), l.row(1).to_vec()]
}

type Join = JoinHandle<Result<EngineCore, EngineError>>;

fn start(
    placement: &Placement,
    sched: SchedulerConfig,
    budget: usize,
    max_seqs: usize,
) -> (EngineHandle, Join) {
    start_on(placement, sched, budget, max_seqs, None)
}

/// [`start`] with the prefix cache on `disk`.
fn start_on(
    placement: &Placement,
    sched: SchedulerConfig,
    budget: usize,
    max_seqs: usize,
    disk: Option<DiskConfig>,
) -> (EngineHandle, Join) {
    let dir = model_dir("tiny-a", "official");
    let model = Model::load_split(&dir, &plan(false), placement.clone(), |_, _| {}).unwrap();
    let config = EngineConfig {
        scheduler: sched,
        cache: cache_config(budget, max_seqs, 0),
        model_name: "test".into(),
        forced_output: None,
        speculative: None,
        prefix_disk: disk,
    };
    engine::start(model, config).unwrap()
}

/// Split over ranks, rank 0 holds the cache: a prefix cached by one engine and read back
/// from disk by the next (a restart) gives the tokens and logprobs of a cold split run, bit
/// for bit. Loads three models (the other ranks serve three).
fn prefix_on_disk_scenario(world: &Placement) {
    let sched = SchedulerConfig {
        max_num_seqs: 2,
        max_num_batched_tokens: 64,
        prefill_chunk: Some(16),
        max_model_len: 512,
    };
    let prompt: Vec<u32> = (0..150).map(|i| (i * 37 + 11) % 320).collect();
    let params = SamplingParams {
        logprobs: Some(3),
        ..greedy(8)
    };
    let run = |h: &EngineHandle| {
        let (_, rx) = h.add_request(prompt.clone(), params.clone()).unwrap();
        let (mut tokens, mut bits, mut cached) = (Vec::new(), Vec::new(), 0);
        for d in rx {
            tokens.extend(d.new_token_ids);
            for lp in d.logprobs.iter().flatten() {
                bits.push(lp.logprob.to_bits());
            }
            cached = d.num_cached_tokens;
        }
        (tokens, bits, cached)
    };
    let dir = tempfile::tempdir().unwrap();
    let disk = DiskConfig {
        dir: dir.path().to_path_buf(),
        max_bytes: 1 << 30,
        checkpoint: [1; 32],
        kernels: deepinfer_kernels::cpu::family(),
    };
    let (h, join) = start_on(world, sched.clone(), 64 << 20, 2, None);
    let cold = run(&h);
    h.shutdown();
    drop(join.join());
    let (h, join) = start_on(world, sched.clone(), 64 << 20, 2, Some(disk.clone()));
    assert_eq!(run(&h).0, cold.0);
    h.shutdown();
    drop(join.join()); // a clean stop: what memory cached goes to disk
    let (h, join) = start_on(world, sched, 64 << 20, 2, Some(disk));
    let warm = run(&h);
    assert_eq!(
        (&warm.0, &warm.1),
        (&cold.0, &cold.1),
        "read back from disk"
    );
    assert_eq!(warm.2, 144, "resumed from disk");
    assert!(h.metrics.prefix_disk.hits.get() >= 144);
    h.shutdown();
    assert_pools_empty(join);
}

fn assert_pools_empty(join: Join) {
    let core = join.join().unwrap().unwrap();
    for u in core.cache().usage() {
        assert_eq!((u.used_blocks, u.used_bytes), (0, 0), "pool {}", u.name);
    }
}

/// The engine over the split model: forced preemption gives HF's greedy tokens; an abort
/// and a disconnect free their cache.
fn engine_scenarios(world: &Placement) {
    let g = Golden::load("tiny-a");
    let sched = SchedulerConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 48,
        prefill_chunk: Some(16),
        max_model_len: 732,
    };
    let (h, join) = start(world, sched, budget_for_one("tiny-a", 4, 732), 4);
    expect_golden_greedy_picks(&h, &g, &PREEMPTION_PICKS, "split, under preemption");
    h.drain().unwrap();
    assert!(
        h.metrics.num_preemptions.get() > 0,
        "the budget was meant to force preemption"
    );
    h.shutdown();
    assert_pools_empty(join);

    let sched = SchedulerConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        prefill_chunk: Some(16),
        max_model_len: 4096,
    };
    let (h, join) = start(world, sched, 64 << 20, 8);
    let (id, rx) = h.add_request((0..200).collect(), greedy(1000)).unwrap();
    let (_, dropped) = h.add_request((0..100).collect(), greedy(1000)).unwrap();
    drop(dropped);
    assert_eq!(rx.recv().unwrap().new_token_ids.len(), 1);
    h.abort(id);
    assert_eq!(collect(rx).1, Some(FinishReason::Abort));
    h.drain().unwrap();
    h.shutdown();
    assert_pools_empty(join);
}

/// The target split over ranks drafting with its DSpark drafter (whole on rank 0):
/// `--speculative-config '{"method": "dspark"}'` keeps the reference's greedy output and
/// accepts as many drafts as the reference's own speculative loop, as one process does
/// (tests/dspark.rs).
fn dspark_scenario(cfg: &str, world: &Placement) {
    let dir = model_dir(cfg, "official");
    let model = Model::load_split(&dir, &plan(false), world.clone(), |_, _| {}).unwrap();
    let drafter = model.dspark.as_ref().expect("the drafter loads on rank 0");
    // Its stages' experts are split by id: rank 0 holds the first share of each.
    let n = drafter.config.n_routed_experts;
    for stage in drafter.stage_weights() {
        assert_eq!(
            stage.ffn.experts.held(),
            world.share(n),
            "{cfg}: a stage's experts"
        );
    }
    // Drafts within 1e-5 of one process's, the stages' picks summed over the ranks.
    let one = ModelRunner::new(load(cfg, "official"));
    let (mut one, mut many) = (one, ModelRunner::new(model));
    let g = Golden::load_named(cfg, "dspark_golden");
    let seq = [ids(&g.meta["prompt"]), ids(&g.meta["greedy"])].concat();
    let split = (world.tensor, world.expert_parallel);
    for n in [5, 17, seq.len() - 1] {
        let label = format!("{cfg} split {split:?}: a draft after {n} tokens");
        same_drafts((&mut one, &mut many), &seq[..=n], within, &label);
    }
    drafts_as_the_reference(cfg, many.into_model(), "split");
}

/// DSpark drafting over a target whose prefill is split by position (context parallelism):
/// every rank captures its range's drafter context and hands rank 0 the ring rows the next
/// draft reads; the reference's greedy output and accepted drafts, as one process.
fn context_dspark_scenario(world: &Arc<dyn Collectives>) {
    let split = || {
        let mut model = Model::load(&model_dir(DSPARK_CONTEXT, "official")).unwrap();
        model.set_context_parallel(Arc::clone(world), 2);
        model
    };
    drafts_split_as_one_process(&split, world, same_bits);
}

/// The checkpoint whose DSpark drafter drafts over context-parallel prefills.
const DSPARK_CONTEXT: &str = "tiny-v41-a";

/// Drafts after prefills split by `split()`'s model over `context` (two models, one after
/// the other) equal one process's by `same`, and its engine gives the reference's greedy
/// output and accepted drafts.
fn drafts_split_as_one_process(
    split: &dyn Fn() -> Model,
    context: &Arc<dyn Collectives>,
    same: fn(&[f32], &[f32]) -> bool,
) {
    let cfg = DSPARK_CONTEXT;
    let (mut one, mut many) = (
        ModelRunner::new(load(cfg, "official")),
        ModelRunner::new(split()),
    );
    let seq = long_sequence(&Golden::load(cfg), 3);
    let w = one.model().config.sliding_window;
    let before = context.stats();
    for n in [w / 2, w + 3, 2 * w + 5, 3 * w] {
        let label = format!("{cfg}: a draft after {n} tokens prefilled split");
        same_drafts((&mut one, &mut many), &seq[..=n], same, &label);
    }
    assert!(
        context.stats().since(&before).calls > 0,
        "the prefills were split"
    );
    // The other ranks serve one model at a time.
    drop(many);
    drafts_as_the_reference(cfg, split(), "context parallel");
}

/// The drafts of `one` and `many` after one prefill step of all but the last of `seq` (the
/// anchor) have the same tokens, and confidences and base logits equal by `same`.
fn same_drafts(
    (one, many): (&mut ModelRunner, &mut ModelRunner),
    seq: &[u32],
    same: fn(&[f32], &[f32]) -> bool,
    label: &str,
) {
    let n = seq.len() - 1;
    let (a, b) = (draft_after(one, seq, n), draft_after(many, seq, n));
    assert_eq!(a.tokens, b.tokens, "{label}");
    assert!(same(&a.confidence, &b.confidence), "{label}");
    assert!(same(&a.base_logits, &b.base_logits), "{label}");
}

/// The draft after one prefill step of `seq[..n]` (the block anchored at `seq[n]`) on a
/// cache with the drafter's rings.
fn draft_after(r: &mut ModelRunner, seq: &[u32], n: usize) -> Draft {
    let model = r.model();
    let mut config = cache_config(64 << 20, 1, 0);
    config.draft_layers = model.dspark.as_ref().unwrap().config.stages;
    let mut cache = CacheManager::new(&model.config, config).unwrap();
    let window = model.config.sliding_window;
    let id = cache.add_seq().unwrap();
    cache.ensure_capacity(id, n).unwrap();
    r.clear();
    r.add(id, 0, seq[..n].iter().copied(), 1);
    r.run(&mut cache, false).unwrap();
    let mut draft = Draft::default();
    r.draft(
        &mut cache,
        id,
        n.saturating_sub(window)..n,
        seq[n],
        &mut draft,
    )
    .unwrap();
    draft
}

/// `model` (of `cfg`, whose checkpoint ships a DSpark drafter) in an engine drafting with it
/// gives the reference's greedy output and accepted-draft count.
fn drafts_as_the_reference(cfg: &str, model: Model, how: &str) {
    let g = Golden::load_named(cfg, "dspark_golden");
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 1,
            max_num_batched_tokens: 256,
            prefill_chunk: None,
            max_model_len: 4096,
        },
        cache: cache_config(64 << 20, 1, 0),
        model_name: "test".into(),
        forced_output: None,
        speculative: Some(
            SpeculativeConfig::from_json(r#"{"method": "dspark", "adaptive": false}"#, None)
                .unwrap(),
        ),
        prefix_disk: None,
    };
    let (h, join) = engine::start(model, config).unwrap();
    let (prompt, want) = (ids(&g.meta["prompt"]), ids(&g.meta["greedy"]));
    let (toks, _) = collect(h.add_request(prompt, greedy(want.len())).unwrap().1);
    assert_eq!(
        toks, want,
        "{cfg} {how}: greedy output with DSpark drafting"
    );
    h.drain().unwrap();
    assert_eq!(
        h.metrics.spec_decode_num_accepted_tokens.get(),
        g.meta["speculative"]["accepted_total"].as_u64().unwrap(),
        "{cfg} {how}: accepted drafts"
    );
    h.shutdown();
    assert_pools_empty(join);
}

/// Rank 0's side of a failure elsewhere: the other ranks stream their experts from a copy of
/// the checkpoint that they truncate after loading; the step fails on rank 0 naming every
/// rank that failed, and the ranks stay in step.
fn another_rank_fails(config: &str, placement: Placement) {
    let dir = model_dir(config, "official");
    let size = placement.comm.size();
    let model = Model::load_split(&dir, &plan(true), placement, |_, _| {}).unwrap();
    let mut r = runner(model, 1, 0);
    let seq = r.add_sequence().unwrap();
    let err = r
        .step(&[Feed {
            seq,
            tokens: &[1, 2, 3, 4],
            all_logits: false,
        }])
        .map(|_| ())
        .expect_err("the step fails")
        .to_string();
    let want = match size {
        2 => "ranks [1] could not compute",
        _ => "ranks [1, 2] could not compute",
    };
    assert!(err.contains(want), "{config}: {err}");
}

/// The other ranks' side: load from a private copy, truncate it, serve (the failed step is
/// reported, not fatal here).
fn fail_part(config: &str, placement: Placement) {
    let copy = tempfile::tempdir().unwrap();
    let dir = model_dir(config, "official");
    for f in std::fs::read_dir(&dir).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, copy.path().join(f.file_name().unwrap())).unwrap();
    }
    let comm = Arc::clone(&placement.comm);
    let mut worker = Worker::load(copy.path(), &plan(true), placement)
        .unwrap_or_else(|e| comm.abort(&format!("copy of {config}: {e}")));
    for f in std::fs::read_dir(copy.path()).unwrap() {
        let f = f.unwrap().path();
        if f.extension().is_some_and(|e| e == "safetensors") {
            let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
            file.set_len(64).unwrap();
        }
    }
    if let Err(e) = worker.run() {
        comm.abort(&format!("copy of {config}: {e}"));
    }
}

/// Context parallelism: prompts of 1, 2 and 3 windows and around the compression
/// boundaries, whole and in chunks, split over the ranks by position (each rank the whole
/// model, the state before its range handed over layer by layer) give one process's logits
/// at the same chunk boundaries bit for bit (the products are batch invariant), and so do
/// the decode steps after them on rank 0 alone, which read the state the ranks handed back.
fn context_scenario(config: &str, world: &Arc<dyn Collectives>) {
    let mut split = Model::load(&model_dir(config, "official")).unwrap();
    split.set_context_parallel(Arc::clone(world), 2);
    let label = format!("{config} context parallel");
    prefills_split_as_one_process(config, split, world, &label, same_bits);
}

/// `split`, a model of `config` set to split prefills over the ranks of `context`, gives the
/// logits of one process, equal by `same` (bit for bit, or within 1e-5 when each range's
/// products are split too): prompts of 1-3 windows and around the compression boundaries,
/// whole and in chunks, and the decode steps after them.
fn prefills_split_as_one_process(
    config: &str,
    split: Model,
    context: &Arc<dyn Collectives>,
    label: &str,
    same: fn(&[f32], &[f32]) -> bool,
) {
    let g = Golden::load(config);
    let w = split.config.sliding_window;
    let mut one = load(config, "official");
    one.set_numerics(split.config.numerics).unwrap();
    let (mut many, mut one) = (runner(split, 1, 0), runner(one, 1, 0));
    let seq = long_sequence(&g, 3);
    let lengths = [w, 2 * w, 3 * w, 3 * w + 1, 17, 33, 64];
    let before = context.stats();
    for (n, chunk) in lengths.iter().flat_map(|&n| [(n, n), (n, 13)]) {
        let label = format!("{label}, {n} tokens in chunks of {chunk}");
        let a = prefill_then_decode(&mut one, &seq[..n + 3], n, chunk);
        let b = prefill_then_decode(&mut many, &seq[..n + 3], n, chunk);
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                same(x, y),
                "{label}: row {i} differs by {}",
                max_abs_diff(x, y)
            );
        }
    }
    // The steps were split: rank 0 handed each layer's state on and took the rest back.
    let moved = context.stats().since(&before);
    let layers = many.model().config.layer_types.len() as u64;
    assert!(
        moved.calls >= 2 * layers * lengths.len() as u64,
        "{moved:?}"
    );
    println!("{label}: equals one process on {} groups", context.size());
}

/// Within 1e-5 of each other (relative beyond 1).
fn within(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-5 * x.abs().max(1.0))
}

/// The last logits of each chunk of `tokens[..n]`, then of each of the remaining tokens fed
/// one at a time.
fn prefill_then_decode(
    r: &mut TestRunner,
    tokens: &[u32],
    n: usize,
    chunk: usize,
) -> Vec<Vec<f32>> {
    let seq = r.add_sequence().unwrap();
    let mut out = Vec::new();
    for part in tokens[..n].chunks(chunk).chain(tokens[n..].chunks(1)) {
        out.push(feed(r, seq, part, false).row(0).to_vec());
    }
    r.free(seq).unwrap();
    out
}
