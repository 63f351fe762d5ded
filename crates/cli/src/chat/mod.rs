//! `deepinfer chat`: an interactive conversation with the model in this process, as
//! `llama-cli` and `ollama run` offer. The model loads as for `deepinfer serve` (the same
//! engine flags; without `--model` the same small synthetic model); each answer streams token
//! by token, its reasoning shown apart, and the conversation is kept: every turn renders the
//! whole history in DeepSeek-V4's chat format, so the prefix cache reuses the earlier turns.

mod answer;
mod display;
mod events;
mod history;
mod input;
mod session;

use crate::chat_format_args::ChatFormatArgs;
use crate::engine_args::EngineArgs;
use crate::script_args::ScriptArgs;
use crate::serve::{default_model, load_model, DEFAULT_MODEL_NAME};
use anyhow::{Context, Result};
use clap::Args;
use deepinfer_engine::engine;
use deepinfer_engine::sampling_params::SamplingParams;
use deepinfer_server::tokenizer::Tokenizer;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Checkpoint directory (safetensors + config.json + tokenizer.json) or a Hugging Face
    /// repo id (org/name). Default: the small synthetic model `deepinfer serve` uses.
    #[arg(long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    chat_format: ChatFormatArgs,
    /// Sampling temperature; 0 is greedy (the same answer every time). The default is vLLM's.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Nucleus sampling mass in (0, 1]; 1 disables.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the K most likely tokens; 0 disables.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Most tokens of one answer, reasoning included (the context length also ends it).
    #[arg(long, default_value_t = 8192)]
    max_tokens: usize,
    /// Sampling seed: answer i of the session uses seed + i, so a session replays.
    #[arg(long)]
    seed: Option<u64>,
    /// Start with thinking mode off (`/think` turns it on).
    #[arg(long)]
    no_think: bool,
    #[command(flatten)]
    script: ScriptArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

impl ChatArgs {
    /// The sampling settings of every answer (the seed is set per answer).
    fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            max_tokens: self.max_tokens,
            ..SamplingParams::default()
        }
    }
}

pub fn run(mut args: ChatArgs) -> Result<()> {
    // One conversation runs at a time: its cache pools need no room for other sequences'
    // state, so the whole budget holds its context and its earlier turns.
    args.engine.max_num_seqs.get_or_insert(1);
    let (dir, name) = match &args.model {
        Some(d) => (args.engine.load.resolve(d)?, d.display().to_string()),
        None => (default_model()?, DEFAULT_MODEL_NAME.to_string()),
    };
    let tokenizer = Tokenizer::from_dir(&dir)?;
    let start = Instant::now();
    let model = load_model(&dir, &args.engine)?;
    let format = args.chat_format.resolve(&dir, &model.config, &tokenizer)?;
    let mut config = args.engine.config(&model.config, &name)?;
    args.script.apply(&mut config, &tokenizer)?;
    // Checked before the engine starts: a bad flag should not wait for the first message.
    args.params()
        .validate(model.config.vocab_size)
        .context("the sampling flags")?;
    let (handle, join) = engine::start(model, config)?;
    eprintln!(
        "loaded {} in {:.1} s",
        dir.display(),
        start.elapsed().as_secs_f64()
    );
    let chatted = events::start().and_then(|(tx, rx)| {
        let mut chat = session::Chat::new(handle.clone(), tokenizer, format, &args, tx, rx);
        eprintln!(
            "chatting with `{name}`, thinking {}; /help for commands, Ctrl-D to leave",
            session::on_off(chat.thinking())
        );
        chat.run()
    });
    handle.shutdown();
    let engine_result = join.join();
    chatted?;
    match engine_result {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e).context("the engine failed"),
        Err(_) => anyhow::bail!("the engine thread panicked"),
    }
}
