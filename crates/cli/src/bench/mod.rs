//! `deepinfer bench`: a workload through the engine, reported in the layout of
//! `vllm bench serve` (TTFT, TPOT, ITL, E2E; mean, median, p90, p99), plus tokens per step.

mod cache;
mod drafter;
mod harness;
mod kernels;
mod model;
mod multi_turn;
mod passes;
mod streamed;
mod structured;
mod vision;

use crate::engine_args::EngineArgs;
use crate::generate::random_prompts;
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use deepinfer_engine::engine::{self, EngineConfig};
use deepinfer_engine::sampling_params::SamplingParams;
use deepinfer_engine::spec::config::MAX_SPECULATIVE_TOKENS;
use deepinfer_engine::spec::{SpecMethod, SpeculativeConfig};
use deepinfer_model::v4::Model;
use deepinfer_server::structured::Grammar;
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: Option<BenchWhat>,
    /// Checkpoint directory (required for the serving benchmark).
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, default_value_t = 16)]
    num_prompts: usize,
    #[arg(long, default_value_t = 128)]
    input_len: usize,
    #[arg(long, default_value_t = 32)]
    output_len: usize,
    /// Requests per second (Poisson arrivals); default: all at once.
    #[arg(long)]
    request_rate: Option<f64>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// What the requests look like: independent random prompts, or conversations that
    /// resend their history every turn (`--num-prompts` conversations of `--turns` turns,
    /// each turn `--input-len` new tokens and `--output-len` answer tokens).
    #[arg(long, value_enum, default_value_t = Workload::Random)]
    workload: Workload,
    /// Turns per conversation (multi-turn workload).
    #[arg(long, default_value_t = 8)]
    turns: usize,
    /// Multi-turn with --prefix-cache-dir: empty the kernel's page cache before every
    /// restarted turn, so the disk tier's reads come from the disk (Linux, as root: writes
    /// /proc/sys/vm/drop_caches).
    #[arg(long)]
    drop_page_cache: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// A JSON schema file: the workload runs twice, plain and then with every request held
    /// to the schema (structured outputs), and both reports print, the second with the
    /// masks' cost. A schema the answers never finish (an open array) keeps the outputs at
    /// `--output-len` tokens.
    #[arg(long)]
    json_schema: Option<PathBuf>,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Random,
    MultiTurn,
}

#[derive(Subcommand, Debug)]
enum BenchWhat {
    /// Measure this machine's roofs: memory read bandwidth (the decode roof) and f32 FMA
    /// throughput (the prefill roof), with 1 thread and with all threads.
    Roofline {
        /// Buffer size for the bandwidth test, in MiB (well above the last-level cache).
        #[arg(long, default_value_t = 1024)]
        buffer_mib: usize,
        /// Passes per measurement; the best is reported.
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Also the disk's read bandwidth, reading this file (a checkpoint shard, say):
        /// sequential 8 MiB reads, and random 1 MiB reads (an expert's size) eight in
        /// flight, around the page cache where the file system allows.
        #[arg(long)]
        disk: Option<PathBuf>,
        /// Bytes each disk measurement reads, in MiB.
        #[arg(long, default_value_t = 1024)]
        disk_mib: usize,
    },
    /// Each weight format's matrix product (decode and prefill shapes) against the roofs.
    Kernels(kernels::KernelArgs),
    /// Decode and prefill speed of a checkpoint against the roofs, like `llama-bench`.
    Model(harness::ModelArgs),
    /// Cache bytes per token of context under each numerics, and the longest context a
    /// budget holds (from config.json alone).
    Cache(cache::CacheArgs),
    /// The vision tower's time per image size against the f32 FMA roof.
    Vision(vision::VisionArgs),
}

/// Where this process's products leave the fused kernels for the GEMM
/// ([`deepinfer_model::kernels::linear::gemm_from`], timed at the first product), in words.
fn gemm_choice() -> String {
    use deepinfer_model::kernels::{cpu::isa, linear::gemm_from};
    match gemm_from(isa()) {
        usize::MAX => "the fused kernels at every batch size".to_string(),
        from => format!(
            "the fused kernels below {from} rows, the GEMM from {from} (the faster from 16, 32, \
             48 on this core, timed at the first product; else 64)"
        ),
    }
}

/// Prints the measured roofs, one thread and all threads.
fn roofline(buffer_mib: usize, reps: usize) {
    use deepinfer_kernels::roofline::{fma_peak, read_bandwidth};
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{:=^50}", " Roofline ");
    for threads in [1, all] {
        let bw = read_bandwidth(buffer_mib << 20, threads, reps);
        let fma = fma_peak(threads, reps);
        println!(
            "{:<40}{:>10.1}",
            format!("Read bandwidth, {threads} thr (GB/s):"),
            bw
        );
        println!(
            "{:<40}{:>10.1}",
            format!("f32 FMA peak, {threads} thr (GFLOP/s):"),
            fma
        );
        if threads == all {
            break;
        }
    }
    println!("{}", "=".repeat(50));
}

fn disk_roofline(path: &std::path::Path, bytes: usize) -> Result<()> {
    use deepinfer_model::experts::file_read_bandwidth;
    let what = |e| anyhow::anyhow!("reading {}: {e}", path.display());
    let seq = file_read_bandwidth(path, 8 << 20, 2, bytes, false).map_err(what)?;
    let random = file_read_bandwidth(path, 1 << 20, 8, bytes, true).map_err(what)?;
    println!("{:<40}{:>10.2}", "Disk sequential read, 8 MiB (GB/s):", seq);
    println!(
        "{:<40}{:>10.2}",
        "Disk random read, 1 MiB x 8 (GB/s):", random
    );
    println!("{}", "=".repeat(50));
    Ok(())
}

#[derive(Serialize, Default)]
struct Stats {
    mean: f64,
    median: f64,
    p90: f64,
    p99: f64,
}

fn stats_ms(mut v: Vec<f64>) -> Stats {
    if v.is_empty() {
        return Stats::default();
    }
    v.sort_by(f64::total_cmp);
    // Linear interpolation between closest ranks, as numpy.percentile does.
    let pct = |p: f64| {
        let x = p / 100.0 * (v.len() - 1) as f64;
        let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
        (v[lo] + (v[hi] - v[lo]) * (x - lo as f64)) * 1e3
    };
    Stats {
        mean: v.iter().sum::<f64>() / v.len() as f64 * 1e3,
        median: pct(50.0),
        p90: pct(90.0),
        p99: pct(99.0),
    }
}

#[derive(Serialize)]
struct Report {
    completed: usize,
    duration_s: f64,
    total_input_tokens: usize,
    total_output_tokens: usize,
    request_throughput: f64,
    output_throughput: f64,
    total_token_throughput: f64,
    ttft_ms: Stats,
    tpot_ms: Stats,
    itl_ms: Stats,
    e2el_ms: Stats,
    engine_steps: u64,
    /// Tokens each forward step computed (prefill, decode and draft tokens).
    tokens_per_step: f64,
    /// Output tokens per engine step, all sequences together.
    output_tokens_per_step: f64,
    preemptions: u64,
    speculative: Option<SpecReport>,
}

/// vLLM's speculative-decoding figures.
#[derive(Serialize)]
struct SpecReport {
    /// Verify rounds (a sequence's drafts checked in one step).
    drafts: u64,
    draft_tokens: u64,
    accepted_tokens: u64,
    acceptance_rate: f64,
    /// Tokens a verify round emits on average: accepted drafts plus the target's own.
    acceptance_length: f64,
    per_position_acceptance: Vec<f64>,
}

struct Timing {
    ttft: f64,
    itls: Vec<f64>,
    e2e: f64,
    tokens: Vec<u32>,
}

/// What the engine counted during a run, and how long the run took.
struct EngineCounts {
    duration_s: f64,
    /// Structured-output masks computed, and the seconds spent on them.
    masks: u64,
    mask_s: f64,
    steps: u64,
    batched_tokens: f64,
    preemptions: u64,
    drafts: u64,
    draft_tokens: u64,
    accepted: u64,
    accepted_per_pos: Vec<u64>,
}

pub fn run(args: BenchArgs) -> Result<()> {
    match args.what {
        Some(BenchWhat::Roofline {
            buffer_mib,
            reps,
            disk,
            disk_mib,
        }) => {
            roofline(buffer_mib, reps);
            if let Some(path) = disk {
                disk_roofline(&path, disk_mib << 20)?;
            }
            return Ok(());
        }
        Some(BenchWhat::Kernels(k)) => {
            k.threads.install()?;
            // As the engine runs them: from inside its compute pool.
            deepinfer_engine::engine::compute_pool()?.install(|| kernels::run(k));
            return Ok(());
        }
        Some(BenchWhat::Model(m)) => return model::run(m),
        Some(BenchWhat::Cache(c)) => return cache::run(c),
        Some(BenchWhat::Vision(v)) => return vision::run(v),
        None => {}
    }
    let Some(dir) = &args.model else {
        anyhow::bail!("--model is required (or run `deepinfer bench roofline`)");
    };
    let dir = &args.engine.load.resolve(dir)?;
    let mut model = args.engine.load_model(dir, |_, _| {})?;
    if args.workload == Workload::MultiTurn {
        let config = args.engine.bench_config(&model.config, "deepinfer")?;
        return multi_turn::run(&args, model, config);
    }
    let prompts = random_prompts(
        args.num_prompts,
        args.input_len,
        model.config.vocab_size,
        args.seed,
    );
    let mut config = args.engine.bench_config(&model.config, "deepinfer")?;
    if let Some(path) = &args.json_schema {
        return structured::run(&args, path, dir, model, config, &prompts);
    }
    let replay = matches!(
        config.speculative,
        Some(SpeculativeConfig {
            method: SpecMethod::Replay { .. },
            ..
        })
    );
    if replay {
        // The replay drafter proposes what a plain run produced: make that run first.
        eprintln!("replay drafter: a plain run first, for the tokens to replay");
        let plain = EngineConfig {
            speculative: None,
            ..config.clone()
        };
        let (timings, counts, back) = workload(model, plain, &prompts, &args, None)?;
        model = back;
        println!("The plain run, for comparison:");
        print_report(&Report::new(&args, &timings, &counts));
        if let Some(SpeculativeConfig {
            method: SpecMethod::Replay { script, .. },
            ..
        }) = &mut config.speculative
        {
            *script = prompts
                .iter()
                .cloned()
                .zip(timings.into_iter().map(|t| t.tokens))
                .collect();
        }
    }
    let (timings, counts, _) = workload(model, config, &prompts, &args, None)?;
    let report = Report::new(&args, &timings, &counts);
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Runs every prompt through an engine (arrivals as `--request-rate` says), each held to
/// `grammar` when given, and returns each request's timings, the engine's counts, and the
/// model back.
fn workload(
    model: Model,
    config: EngineConfig,
    prompts: &[Vec<u32>],
    args: &BenchArgs,
    grammar: Option<&Grammar>,
) -> Result<(Vec<Timing>, EngineCounts, Model)> {
    let (handle, join) = engine::start(model, config)?;
    let bar = indicatif::ProgressBar::new(prompts.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} requests {elapsed_precise}")
            .expect("valid template"),
    );
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: args.output_len,
        min_tokens: args.output_len,
        // A finished grammar allows only the end (which `min_tokens` then cannot hold back).
        ignore_eos: grammar.is_none(),
        ..SamplingParams::default()
    };
    let start = Instant::now();
    let mut rng_state = args
        .seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut workers = Vec::with_capacity(prompts.len());
    for p in prompts {
        if let Some(rate) = args.request_rate {
            // Exponential inter-arrival times from a small LCG: reproducible for a seed.
            rng_state = rng_state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((rng_state >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            std::thread::sleep(Duration::from_secs_f64(-u.ln() / rate));
        }
        let submitted = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        let constraint = grammar.map(|g| g.constraint(false));
        handle.add_constrained_request_to(p.clone(), params.clone(), constraint, Box::new(tx))?;
        let bar = bar.clone();
        workers.push(std::thread::spawn(move || {
            let mut t = Timing {
                ttft: 0.0,
                itls: Vec::new(),
                e2e: 0.0,
                tokens: Vec::new(),
            };
            let mut last = submitted;
            for delta in rx {
                let now = Instant::now();
                if !delta.new_token_ids.is_empty() {
                    if t.tokens.is_empty() {
                        t.ttft = (now - submitted).as_secs_f64();
                    } else {
                        t.itls.push((now - last).as_secs_f64());
                    }
                    t.tokens.extend(delta.new_token_ids);
                    last = now;
                }
                if delta.finish_reason.is_some() {
                    t.e2e = (now - submitted).as_secs_f64();
                }
            }
            bar.inc(1);
            t
        }));
    }
    let timings: Vec<Timing> = workers
        .into_iter()
        .map(|w| w.join().expect("worker"))
        .collect();
    let duration_s = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let m = &handle.metrics;
    let counts = EngineCounts {
        duration_s,
        masks: m.structured_output_masks.get(),
        mask_s: m.structured_output_mask_time.get_sample_sum(),
        steps: m.iteration_tokens.get_sample_count(),
        batched_tokens: m.iteration_tokens.get_sample_sum(),
        preemptions: m.num_preemptions.get(),
        drafts: m.spec_decode_num_drafts.get(),
        draft_tokens: m.spec_decode_num_draft_tokens.get(),
        accepted: m.spec_decode_num_accepted_tokens.get(),
        accepted_per_pos: (0..MAX_SPECULATIVE_TOKENS)
            .map(|p| m.spec_decode_accepted_at(p))
            .collect(),
    };
    handle.shutdown();
    let core = join
        .join()
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))??;
    Ok((timings, counts, core.into_model()))
}

impl Report {
    fn new(args: &BenchArgs, timings: &[Timing], c: &EngineCounts) -> Self {
        let duration = c.duration_s;
        let total_in = args.num_prompts * args.input_len;
        let total_out: usize = timings.iter().map(|t| t.tokens.len()).sum();
        let spec = (c.drafts > 0).then(|| {
            let drafts = c.drafts as f64;
            let positions = c
                .accepted_per_pos
                .iter()
                .rposition(|&a| a > 0)
                .map_or(0, |p| p + 1);
            SpecReport {
                drafts: c.drafts,
                draft_tokens: c.draft_tokens,
                accepted_tokens: c.accepted,
                acceptance_rate: c.accepted as f64 / c.draft_tokens.max(1) as f64,
                acceptance_length: 1.0 + c.accepted as f64 / drafts,
                per_position_acceptance: c.accepted_per_pos[..positions]
                    .iter()
                    .map(|&a| a as f64 / drafts)
                    .collect(),
            }
        });
        Report {
            completed: timings.len(),
            duration_s: duration,
            total_input_tokens: total_in,
            total_output_tokens: total_out,
            request_throughput: timings.len() as f64 / duration,
            output_throughput: total_out as f64 / duration,
            total_token_throughput: (total_in + total_out) as f64 / duration,
            ttft_ms: stats_ms(timings.iter().map(|t| t.ttft).collect()),
            tpot_ms: stats_ms(
                timings
                    .iter()
                    .filter(|t| t.tokens.len() > 1)
                    .map(|t| (t.e2e - t.ttft) / (t.tokens.len() - 1) as f64)
                    .collect(),
            ),
            itl_ms: stats_ms(
                timings
                    .iter()
                    .flat_map(|t| t.itls.iter().copied())
                    .collect(),
            ),
            e2el_ms: stats_ms(timings.iter().map(|t| t.e2e).collect()),
            engine_steps: c.steps,
            tokens_per_step: c.batched_tokens / c.steps.max(1) as f64,
            output_tokens_per_step: total_out as f64 / c.steps.max(1) as f64,
            preemptions: c.preemptions,
            speculative: spec,
        }
    }
}

fn print_report(r: &Report) {
    let line = |k: &str, v: String| println!("{k:<40}{v:>10}");
    println!("{:=^50}", " Serving Benchmark Result ");
    line("Successful requests:", r.completed.to_string());
    line("Benchmark duration (s):", format!("{:.2}", r.duration_s));
    line("Total input tokens:", r.total_input_tokens.to_string());
    line("Total generated tokens:", r.total_output_tokens.to_string());
    line(
        "Request throughput (req/s):",
        format!("{:.2}", r.request_throughput),
    );
    line(
        "Output token throughput (tok/s):",
        format!("{:.2}", r.output_throughput),
    );
    line(
        "Total Token throughput (tok/s):",
        format!("{:.2}", r.total_token_throughput),
    );
    for (title, short, s) in [
        ("Time to First Token", "TTFT", &r.ttft_ms),
        (
            "Time per Output Token (excl. 1st token)",
            "TPOT",
            &r.tpot_ms,
        ),
        ("Inter-token Latency", "ITL", &r.itl_ms),
        ("End-to-end Latency", "E2EL", &r.e2el_ms),
    ] {
        println!("{:-^50}", title);
        line(&format!("Mean {short} (ms):"), format!("{:.2}", s.mean));
        line(&format!("Median {short} (ms):"), format!("{:.2}", s.median));
        line(&format!("P90 {short} (ms):"), format!("{:.2}", s.p90));
        line(&format!("P99 {short} (ms):"), format!("{:.2}", s.p99));
    }
    println!("{:-^50}", "Engine");
    line("Engine steps:", r.engine_steps.to_string());
    line("Tokens per step:", format!("{:.2}", r.tokens_per_step));
    line(
        "Output tokens per step:",
        format!("{:.2}", r.output_tokens_per_step),
    );
    line("Preemptions:", r.preemptions.to_string());
    if let Some(sp) = &r.speculative {
        println!("{:-^50}", "Speculative Decoding");
        line(
            "Acceptance rate (%):",
            format!("{:.2}", 100.0 * sp.acceptance_rate),
        );
        line("Acceptance length:", format!("{:.2}", sp.acceptance_length));
        line("Drafts:", sp.drafts.to_string());
        line("Draft tokens:", sp.draft_tokens.to_string());
        line("Accepted tokens:", sp.accepted_tokens.to_string());
        println!("Per-position acceptance rate (%):");
        for (p, a) in sp.per_position_acceptance.iter().enumerate() {
            line(&format!("  position {p}:"), format!("{:.2}", 100.0 * a));
        }
    }
    println!("{}", "=".repeat(50));
}
