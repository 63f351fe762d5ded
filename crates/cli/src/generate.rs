//! `deepinfer generate`: offline generation through the engine, all prompts in flight
//! together, one JSON line per prompt (greedy unless sampling flags say otherwise).

use crate::engine_args::EngineArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use deepinfer_engine::engine;
use deepinfer_engine::sampling_params::SamplingParams;
use deepinfer_server::tokenizer::Tokenizer;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Checkpoint directory (config.json + safetensors, official or HF names) or a Hugging
    /// Face repo id (org/name).
    #[arg(long)]
    model: PathBuf,
    /// A prompt as comma-separated token ids; repeat for several prompts.
    #[arg(long = "prompt-ids", value_parser = parse_ids)]
    prompt_ids: Vec<Vec<u32>>,
    /// A text prompt, encoded with the checkpoint's tokenizer.json; repeatable.
    #[arg(long = "prompt")]
    prompts: Vec<String>,
    /// Add N random prompts of --input-len tokens (seeded by --seed, default 0).
    #[arg(long, default_value_t = 0)]
    num_prompts: usize,
    #[arg(long, default_value_t = 32)]
    input_len: usize,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 16)]
    max_tokens: usize,
    /// Also report the K most likely tokens with their log-probabilities at every step.
    #[arg(long, default_value_t = 0)]
    top_logprobs: usize,
    /// Keep generating after the end-of-sequence token.
    #[arg(long)]
    ignore_eos: bool,
    /// Sampling temperature (0 = greedy, the default).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Per-request sampling seed (request i uses seed + i).
    #[arg(long)]
    seed: Option<u64>,
    /// Print one JSON object per prompt instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    engine: EngineArgs,
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
    finish_reason: &'static str,
    /// The decoded output, when the prompts were given as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
}

/// Deterministic pseudo-random prompts (splitmix64), the same on every machine.
pub fn random_prompts(n: usize, len: usize, vocab: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    (0..n)
        .map(|_| (0..len).map(|_| (next() % vocab as u64) as u32).collect())
        .collect()
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let dir = args.engine.load.resolve(&args.model)?;
    let model = args.engine.load_model(&dir, |_, _| {})?;
    let vocab = model.config.vocab_size;
    let mut prompts = args.prompt_ids.clone();
    let tokenizer = if args.prompts.is_empty() {
        None
    } else {
        Some(Tokenizer::from_dir(&dir)?)
    };
    if let Some(tok) = &tokenizer {
        for text in &args.prompts {
            prompts.push(
                tok.encode(text, false)
                    .with_context(|| format!("encoding {text:?}"))?,
            );
        }
    }
    prompts.extend(random_prompts(
        args.num_prompts,
        args.input_len,
        vocab,
        args.seed.unwrap_or(0),
    ));
    if prompts.is_empty() {
        bail!("no prompts: give --prompt-ids or --prompt (repeatable) or --num-prompts");
    }
    let config = args.engine.config(&model.config, "deepinfer")?;
    let (handle, join) = engine::start(model, config)?;
    let mut streams = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let params = SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            seed: args.seed.map(|s| s.wrapping_add(i as u64)),
            max_tokens: args.max_tokens,
            ignore_eos: args.ignore_eos,
            logprobs: (args.top_logprobs > 0).then_some(args.top_logprobs),
            ..SamplingParams::default()
        };
        let (_, rx) = handle
            .add_request(p.clone(), params)
            .with_context(|| format!("prompt {i}"))?;
        streams.push(rx);
    }
    let mut outs = Vec::with_capacity(prompts.len());
    for (p, rx) in prompts.into_iter().zip(streams) {
        let mut o = Output {
            prompt_ids: p,
            token_ids: Vec::new(),
            top_logprobs: Vec::new(),
            finish_reason: "abort",
            text: None,
        };
        for delta in rx {
            o.token_ids.extend(&delta.new_token_ids);
            for lp in delta.logprobs.into_iter().flatten() {
                o.top_logprobs.push(
                    lp.top
                        .iter()
                        .map(|&(id, l)| TopLogprob {
                            id,
                            logprob: l as f64,
                        })
                        .collect(),
                );
            }
            if let Some(r) = delta.finish_reason {
                o.finish_reason = r.as_str();
            }
        }
        if let Some(tok) = &tokenizer {
            o.text = Some(tok.decode(&o.token_ids, false));
        }
        outs.push(o);
    }
    handle.shutdown();
    join.join()
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))??;
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    for o in &outs {
        if args.json {
            serde_json::to_writer(&mut w, o)?;
            writeln!(w)?;
        } else {
            writeln!(
                w,
                "{:?} -> {:?} ({})",
                o.prompt_ids, o.token_ids, o.finish_reason
            )?;
        }
    }
    Ok(())
}
