//! `deepinfer generate`: greedy decoding of token-id prompts, one JSON line per prompt.
//!
//! Without a cache each step recomputes every active sequence whole; all prompts still run
//! together in one flat batch per step.

use anyhow::{bail, Context, Result};
use clap::Args;
use deepinfer_model::batch::ForwardBatch;
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
    let eos = &model.config.eos_token_ids;
    let mut outs: Vec<Output> = args
        .prompt_ids
        .iter()
        .map(|p| Output {
            prompt_ids: p.clone(),
            token_ids: Vec::new(),
            top_logprobs: Vec::new(),
        })
        .collect();
    let mut active: Vec<usize> = (0..outs.len()).collect();
    for _ in 0..args.max_tokens {
        if active.is_empty() {
            break;
        }
        let seqs: Vec<Vec<u32>> = active
            .iter()
            .map(|&i| [outs[i].prompt_ids.clone(), outs[i].token_ids.clone()].concat())
            .collect();
        let logits = model.forward(&ForwardBatch::from_prompts(&seqs, false))?;
        let mut still = Vec::with_capacity(active.len());
        for (r, &i) in active.iter().enumerate() {
            let row = logits.row(r);
            let tok = argmax(row) as u32;
            outs[i].token_ids.push(tok);
            if args.top_logprobs > 0 {
                outs[i]
                    .top_logprobs
                    .push(top_logprobs(row, args.top_logprobs));
            }
            if args.ignore_eos || !eos.contains(&tok) {
                still.push(i);
            }
        }
        active = still;
    }
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    for o in &outs {
        if args.json {
            serde_json::to_writer(&mut w, o)?;
            writeln!(w)?;
        } else {
            writeln!(w, "{:?} -> {:?}", o.prompt_ids, o.token_ids)?;
        }
    }
    Ok(())
}
