//! `deepinfer bench --workload multi-turn`: conversations that resend their whole history
//! every turn (what a chat client or an agent does), TTFT per turn with prefix caching and
//! without, beside the time to prefill each turn's new tokens alone (the target: a turn costs
//! what its new tokens cost). With `--prefix-cache-dir`, also with the engine restarted
//! between turns, so every turn's prefix comes from the disk tier.

use super::BenchArgs;
use crate::generate::random_prompts;
use anyhow::{Context, Result};
use deepinfer_engine::engine::{self, EngineConfig};
use deepinfer_engine::sampling_params::SamplingParams;
use deepinfer_model::v4::Model;
use serde::Serialize;
use std::time::Instant;

/// One turn of one conversation as a run saw it.
#[derive(Serialize, Clone, Copy, Default)]
struct Turn {
    prompt_tokens: usize,
    cached_tokens: usize,
    ttft_s: f64,
}

/// Per turn, averaged over the conversations.
#[derive(Serialize)]
struct TurnRow {
    turn: usize,
    prompt_tokens: f64,
    cached_tokens: f64,
    new_tokens: f64,
    ttft_cached_ms: f64,
    ttft_uncached_ms: f64,
    /// The engine restarted before the turn: its prefix read from disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    ttft_restarted_ms: Option<f64>,
    /// Prompt tokens the restarted engine found cached (on disk).
    #[serde(skip_serializing_if = "Option::is_none")]
    cached_restarted: Option<f64>,
    /// A fresh prompt as long as the turn's new tokens, nothing cached.
    prefill_new_alone_ms: f64,
}

/// The messages and answers of every conversation: `turns` user messages of
/// `--input-len` tokens each; answers are `--output-len` tokens, whatever the model says.
fn messages(args: &BenchArgs, vocab: usize) -> Vec<Vec<Vec<u32>>> {
    let all = random_prompts(
        args.num_prompts * args.turns,
        args.input_len,
        vocab,
        args.seed,
    );
    all.chunks(args.turns).map(|c| c.to_vec()).collect()
}

/// Runs every conversation turn by turn (conversations side by side, each turn sent when
/// the last one's answer is complete); returns `[conversation][turn]`.
fn conversations(
    model: Model,
    config: EngineConfig,
    msgs: &[Vec<Vec<u32>>],
    output_len: usize,
) -> Result<(Vec<Vec<Turn>>, Model)> {
    let (handle, join) = engine::start(model, config)?;
    let params = answer_params(output_len);
    let workers: Vec<_> = msgs
        .iter()
        .cloned()
        .map(|conv| {
            let (handle, params) = (handle.clone(), params.clone());
            std::thread::spawn(move || -> Result<Vec<Turn>> {
                let mut history = Vec::new();
                let mut turns = Vec::new();
                for msg in conv {
                    history.extend(msg);
                    let sent = Instant::now();
                    let (_, rx) = handle.add_request(history.clone(), params.clone())?;
                    turns.push(answer(sent, rx, &mut history));
                }
                Ok(turns)
            })
        })
        .collect();
    let mut out = Vec::new();
    for w in workers {
        out.push(
            w.join()
                .map_err(|_| anyhow::anyhow!("a conversation panicked"))??,
        );
    }
    handle.shutdown();
    let core = join
        .join()
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))??;
    Ok((out, core.into_model()))
}

/// One turn of every conversation at once: each history grows by its message, then by the
/// answer.
fn one_turn(
    handle: &engine::EngineHandle,
    histories: &mut [Vec<u32>],
    msgs: &[Vec<Vec<u32>>],
    turn: usize,
    output_len: usize,
) -> Result<Vec<Turn>> {
    let params = answer_params(output_len);
    let mut waiting = Vec::new();
    for (history, conv) in histories.iter_mut().zip(msgs) {
        history.extend(&conv[turn]);
        let sent = Instant::now();
        let (_, rx) = handle.add_request(history.clone(), params.clone())?;
        waiting.push((sent, rx));
    }
    let answers = waiting.into_iter().zip(histories);
    Ok(answers.map(|((sent, rx), h)| answer(sent, rx, h)).collect())
}

/// Greedy answers of exactly `output_len` tokens.
fn answer_params(output_len: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens: output_len,
        min_tokens: output_len,
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

/// Reads a turn's answer from `rx` into `history` (sent at `sent`, with `history` as its
/// prompt): what the turn cost.
fn answer(
    sent: Instant,
    rx: std::sync::mpsc::Receiver<deepinfer_engine::request::RequestOutput>,
    history: &mut Vec<u32>,
) -> Turn {
    let mut t = Turn {
        prompt_tokens: history.len(),
        ..Turn::default()
    };
    for delta in rx {
        if t.ttft_s == 0.0 && !delta.new_token_ids.is_empty() {
            t.ttft_s = sent.elapsed().as_secs_f64();
        }
        t.cached_tokens = delta.num_cached_tokens;
        history.extend(delta.new_token_ids);
    }
    t
}

/// Every conversation turn by turn, the engine stopped (its cache written to the disk tier)
/// and started again before each turn; returns `[conversation][turn]`.
fn conversations_restarting(
    mut model: Model,
    config: EngineConfig,
    msgs: &[Vec<Vec<u32>>],
    args: &BenchArgs,
) -> Result<(Vec<Vec<Turn>>, Model)> {
    let turns = msgs.first().map_or(0, Vec::len);
    let mut histories = vec![Vec::new(); msgs.len()];
    let mut out = vec![Vec::new(); msgs.len()];
    for turn in 0..turns {
        if args.drop_page_cache {
            drop_page_cache()?;
        }
        let (handle, join) = engine::start(model, config.clone())?;
        let got = one_turn(&handle, &mut histories, msgs, turn, args.output_len)?;
        for (conv, t) in out.iter_mut().zip(got) {
            conv.push(t);
        }
        handle.shutdown();
        let core = join
            .join()
            .map_err(|_| anyhow::anyhow!("the engine thread panicked"))??;
        // Dropping the rest of the engine writes what its cache holds to the directory.
        model = core.into_model();
    }
    Ok((out, model))
}

/// [`conversations_restarting`] over a fresh directory inside `disk.dir` (removed after), so
/// the first turn finds nothing from earlier runs.
fn restarting(
    model: Model,
    with: &EngineConfig,
    mut disk: deepinfer_engine::cache::disk::DiskConfig,
    msgs: &[Vec<Vec<u32>>],
    args: &BenchArgs,
) -> Result<(Vec<Vec<Turn>>, Model)> {
    disk.dir = disk.dir.join(format!("bench-{}", std::process::id()));
    let config = EngineConfig {
        prefix_disk: Some(disk.clone()),
        ..with.clone()
    };
    eprintln!(
        "multi-turn: prefix caching on, restarted before every turn ({})",
        disk.dir.display()
    );
    let result = conversations_restarting(model, config, msgs, args);
    let _ = std::fs::remove_dir_all(&disk.dir);
    result
}

/// Writes the page cache's dirty pages out and empties it (`--drop-page-cache`).
fn drop_page_cache() -> Result<()> {
    std::process::Command::new("sync")
        .status()
        .context("running sync")?;
    std::fs::write("/proc/sys/vm/drop_caches", "3").context(
        "--drop-page-cache: cannot write /proc/sys/vm/drop_caches (Linux only, as root); \
         leave the flag out to time reads from the page cache",
    )
}

/// TTFT of fresh prompts of the given lengths, one at a time, nothing cached.
fn alone(
    model: Model,
    config: EngineConfig,
    lens: &[usize],
    seed: u64,
) -> Result<(Vec<f64>, Model)> {
    let (handle, join) = engine::start(model, config)?;
    let vocab = handle.vocab_size();
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 1,
        ..SamplingParams::default()
    };
    let mut out = Vec::new();
    for (i, &len) in lens.iter().enumerate() {
        let prompt = random_prompts(1, len.max(1), vocab, seed ^ (0xA11 + i as u64)).remove(0);
        let sent = Instant::now();
        let (_, rx) = handle.add_request(prompt, params.clone())?;
        let mut ttft = 0.0;
        for delta in rx {
            if ttft == 0.0 && !delta.new_token_ids.is_empty() {
                ttft = sent.elapsed().as_secs_f64();
            }
        }
        out.push(ttft);
    }
    handle.shutdown();
    let core = join
        .join()
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))??;
    Ok((out, core.into_model()))
}

pub fn run(args: &BenchArgs, model: Model, config: EngineConfig) -> Result<()> {
    anyhow::ensure!(args.turns > 0, "--turns must be at least 1");
    let msgs = messages(args, model.config.vocab_size);
    let disk = config.prefix_disk.clone();
    anyhow::ensure!(
        disk.is_some() || !args.drop_page_cache,
        "--drop-page-cache empties the page cache before each restarted turn, and only \
         --prefix-cache-dir DIR restarts them: add it, or drop the flag"
    );
    let mut with = config.clone();
    with.cache.prefix_caching = true;
    with.prefix_disk = None;
    let mut without = with.clone();
    without.cache.prefix_caching = false;
    eprintln!(
        "multi-turn: {} conversations × {} turns, prefix caching off",
        args.num_prompts, args.turns
    );
    let (cold, model) = conversations(model, without.clone(), &msgs, args.output_len)?;
    eprintln!("multi-turn: prefix caching on");
    let (warm, model) = conversations(model, with.clone(), &msgs, args.output_len)?;
    let (restarted, model) = match disk {
        Some(disk) => {
            let (runs, model) = restarting(model, &with, disk, &msgs, args)?;
            (Some(runs), model)
        }
        None => (None, model),
    };
    let mean = |f: &dyn Fn(&Turn) -> f64, runs: &[Vec<Turn>], t: usize| {
        runs.iter().map(|c| f(&c[t])).sum::<f64>() / runs.len() as f64
    };
    let new_tokens: Vec<usize> = (0..args.turns)
        .map(|t| mean(&|x| (x.prompt_tokens - x.cached_tokens) as f64, &warm, t).round() as usize)
        .collect();
    // Same engine settings as the cached run (fresh random prompts find nothing cached), so
    // the comparison is what resuming costs, not the kernels' summation order.
    eprintln!("multi-turn: each turn's new tokens alone");
    let (alone_s, _) = alone(model, with, &new_tokens, args.seed)?;
    let rows: Vec<TurnRow> = (0..args.turns)
        .map(|t| TurnRow {
            turn: t + 1,
            prompt_tokens: mean(&|x| x.prompt_tokens as f64, &warm, t),
            cached_tokens: mean(&|x| x.cached_tokens as f64, &warm, t),
            new_tokens: new_tokens[t] as f64,
            ttft_cached_ms: mean(&|x| x.ttft_s, &warm, t) * 1e3,
            ttft_uncached_ms: mean(&|x| x.ttft_s, &cold, t) * 1e3,
            ttft_restarted_ms: restarted.as_ref().map(|r| mean(&|x| x.ttft_s, r, t) * 1e3),
            cached_restarted: restarted
                .as_ref()
                .map(|r| mean(&|x| x.cached_tokens as f64, r, t)),
            prefill_new_alone_ms: alone_s[t] * 1e3,
        })
        .collect();
    print_rows(&rows);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The report: every turn with caching on and off, then the restarted run if there was one.
fn print_rows(rows: &[TurnRow]) {
    println!("{:=^96}", " Multi-turn Benchmark Result ");
    println!(
        "{:>4} {:>8} {:>8} {:>8} {:>14} {:>14} {:>14} {:>8} {:>8}",
        "turn",
        "prompt",
        "cached",
        "new",
        "TTFT on (ms)",
        "TTFT off (ms)",
        "new alone (ms)",
        "on/new",
        "off/on"
    );
    for r in rows {
        println!(
            "{:>4} {:>8.0} {:>8.0} {:>8.0} {:>14.1} {:>14.1} {:>14.1} {:>8.2} {:>8.2}",
            r.turn,
            r.prompt_tokens,
            r.cached_tokens,
            r.new_tokens,
            r.ttft_cached_ms,
            r.ttft_uncached_ms,
            r.prefill_new_alone_ms,
            r.ttft_cached_ms / r.prefill_new_alone_ms,
            r.ttft_uncached_ms / r.ttft_cached_ms,
        );
    }
    println!("{}", "=".repeat(96));
    if rows.iter().any(|r| r.ttft_restarted_ms.is_some()) {
        println!("With a restart before every turn (prefix from the disk tier):");
        println!(
            "{:>4} {:>8} {:>18} {:>14} {:>12}",
            "turn", "cached", "TTFT restart (ms)", "TTFT on (ms)", "restart/on"
        );
        for r in rows {
            let restarted = r.ttft_restarted_ms.unwrap_or(f64::NAN);
            println!(
                "{:>4} {:>8.0} {:>18.1} {:>14.1} {:>12.2}",
                r.turn,
                r.cached_restarted.unwrap_or(f64::NAN),
                restarted,
                r.ttft_cached_ms,
                restarted / r.ttft_cached_ms
            );
        }
    }
}
