//! `deepinfer generate`: greedy decoding of token-id prompts, one JSON line per prompt.
//!
//! All prompts run together through the model runner: each step appends every unfinished
//! sequence's next prompt chunk (`--prefill-chunk`) or its last sampled token to its cache.

use anyhow::{bail, Context, Result};
use clap::Args;
use deepinfer_engine::cache::{CacheBudget, CacheConfig, SeqId};
use deepinfer_engine::runner::{ModelRunner, SeqWork};
use deepinfer_model::kernels::topk::{argmax, topk_indices};
use deepinfer_model::v4::Model;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Checkpoint directory (config.json + safetensors, official or HF names).
    #[arg(long)]
    model: PathBuf,
    /// A prompt as comma-separated token ids; repeat for several prompts.
    #[arg(long = "prompt-ids", required = true, value_parser = parse_ids)]
    prompt_ids: Vec<Vec<u32>>,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 16)]
    max_tokens: usize,
    /// Also report the K most likely tokens with their log-probabilities at every step.
    #[arg(long, default_value_t = 0)]
    top_logprobs: usize,
    /// Keep generating after the end-of-sequence token.
    #[arg(long)]
    ignore_eos: bool,
    /// Feed prompts this many tokens per step (default: whole prompts).
    #[arg(long)]
    prefill_chunk: Option<usize>,
    /// Memory for the cache pools, in MiB.
    #[arg(long, default_value_t = 1024)]
    cache_budget_mib: usize,
    /// Print one JSON object per prompt instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_ids(s: &str) -> Result<Vec<u32>, String> {
    let ids: Result<Vec<u32>, _> = s.split(',').map(|t| t.trim().parse::<u32>()).collect();
    match ids {
        Ok(v) if !v.is_empty() => Ok(v),
        Ok(_) => Err("empty prompt".into()),
        Err(e) => Err(format!(
            "'{s}' is not a comma-separated list of token ids: {e}"
        )),
    }
}

#[derive(Serialize)]
struct TopLogprob {
    id: u32,
    logprob: f64,
}

#[derive(Serialize)]
struct Output {
    prompt_ids: Vec<u32>,
    token_ids: Vec<u32>,
    top_logprobs: Vec<Vec<TopLogprob>>,
}

/// `log_softmax` of the row at the ids of its `k` largest entries.
fn top_logprobs(row: &[f32], k: usize) -> Vec<TopLogprob> {
    let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = mx + row.iter().map(|&v| (v as f64 - mx).exp()).sum::<f64>().ln();
    topk_indices(row, k)
        .into_iter()
        .map(|i| TopLogprob {
            id: i as u32,
            logprob: row[i] as f64 - lse,
        })
        .collect()
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let model =
        Model::load(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    let vocab = model.config.vocab_size;
    for p in &args.prompt_ids {
        if let Some(&id) = p.iter().find(|&&id| id as usize >= vocab) {
            bail!("prompt token id {id} is outside the vocabulary (size {vocab})");
        }
    }
    if args.prefill_chunk == Some(0) {
        bail!("--prefill-chunk must be at least 1");
    }
    let eos = model.config.eos_token_ids.clone();
    let cache = CacheConfig {
        budget: CacheBudget::Bytes(args.cache_budget_mib << 20),
        max_seqs: args.prompt_ids.len(),
        rollback_slack: 0,
        block_entries: 16,
    };
    let mut runner = ModelRunner::new(model, cache)?;
    let mut seqs = Vec::with_capacity(args.prompt_ids.len());
    for p in &args.prompt_ids {
        seqs.push(Seq {
            id: runner.add_sequence()?,
            prompt: p.clone(),
            fed: 0,
            out: Vec::new(),
            tops: Vec::new(),
            done: args.max_tokens == 0,
        });
    }
    // Every step feeds each unfinished sequence its next prompt chunk or its last token, all
    // in one flat batch: chunked prefill and decode share steps.
    while seqs.iter().any(|s| !s.done) {
        let work: Vec<(usize, Vec<u32>)> = seqs
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.done)
            .map(|(i, s)| {
                let feed = if s.fed < s.prompt.len() {
                    let n = args
                        .prefill_chunk
                        .unwrap_or(usize::MAX)
                        .min(s.prompt.len() - s.fed);
                    s.prompt[s.fed..s.fed + n].to_vec()
                } else {
                    vec![*s.out.last().expect("decode follows a sampled token")]
                };
                (i, feed)
            })
            .collect();
        let items: Vec<SeqWork<'_>> = work
            .iter()
            .map(|(i, t)| SeqWork {
                seq: seqs[*i].id,
                tokens: t,
                all_logits: false,
            })
            .collect();
        let logits = runner.step(&items)?;
        for (r, (i, feed)) in work.iter().enumerate() {
            let s = &mut seqs[*i];
            s.fed += feed.len();
            if s.fed < s.prompt.len() {
                continue; // mid-prompt: its logits are not a prediction anyone asked for
            }
            let row = logits.row(r);
            let tok = argmax(row) as u32;
            s.out.push(tok);
            if args.top_logprobs > 0 {
                s.tops.push(top_logprobs(row, args.top_logprobs));
            }
            if s.out.len() >= args.max_tokens || (!args.ignore_eos && eos.contains(&tok)) {
                s.done = true;
                runner.free(s.id)?;
            }
        }
    }
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    for s in seqs {
        let o = Output {
            prompt_ids: s.prompt,
            token_ids: s.out,
            top_logprobs: s.tops,
        };
        if args.json {
            serde_json::to_writer(&mut w, &o)?;
            writeln!(w)?;
        } else {
            writeln!(w, "{:?} -> {:?}", o.prompt_ids, o.token_ids)?;
        }
    }
    Ok(())
}

struct Seq {
    id: SeqId,
    prompt: Vec<u32>,
    /// Prompt tokens already in the cache.
    fed: usize,
    out: Vec<u32>,
    tops: Vec<Vec<TopLogprob>>,
    done: bool,
}
