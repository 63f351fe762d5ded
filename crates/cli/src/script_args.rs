//! The scripted-output test hooks of `serve` and `chat` (hidden from --help, never for
//! serving): what a model with random weights is made to write, so end-to-end tests see
//! reasoning, answers and tool calls through the whole path (engine::scripted).

use anyhow::{Context, Result};
use clap::Args;
use deepinfer_engine::engine::EngineConfig;
use deepinfer_engine::scripted::{ScriptedOutput, ScriptedTurn};
use deepinfer_server::tokenizer::Tokenizer;

#[derive(Args, Debug, Clone, Default)]
pub struct ScriptArgs {
    /// Test hook, hidden from --help: every request generates exactly the tokens of TEXT,
    /// then EOS, through the whole engine path (scheduler, sampler, detokenizer, stop strings,
    /// chat parsers). A tiny model with random weights never writes tool calls or reasoning,
    /// so end-to-end tests script its output with this. Never use it to serve.
    #[arg(long, hide = true, value_name = "TEXT")]
    pub debug_force_output: Option<String>,
    /// Test hook, hidden from --help, repeatable: a request whose prompt ends with the tokens
    /// of AFTER (give or take the generation prompt) generates TEXT instead; the first that
    /// matches wins, --debug-force-output is the rest's. So a script holds a conversation:
    /// `--debug-force-output-after 'tool_result>' 'Done.'` answers a tool's result where
    /// --debug-force-output made the call.
    #[arg(long, hide = true, num_args = 2, value_names = ["AFTER", "TEXT"])]
    pub debug_force_output_after: Vec<String>,
}

impl ScriptArgs {
    /// Puts the script, tokenized, into the engine's config (nothing when no hook is given).
    pub fn apply(&self, config: &mut EngineConfig, tokenizer: &Tokenizer) -> Result<()> {
        let encode = |what: &str, flag: &str| {
            tokenizer
                .encode(what, false)
                .with_context(|| format!("tokenizing {flag}"))
        };
        let mut turns = Vec::new();
        for pair in self.debug_force_output_after.chunks_exact(2) {
            turns.push(ScriptedTurn {
                after: Some(encode(&pair[0], "--debug-force-output-after's AFTER")?),
                output: encode(&pair[1], "--debug-force-output-after's TEXT")?,
            });
        }
        if let Some(text) = &self.debug_force_output {
            turns.push(ScriptedTurn {
                after: None,
                output: encode(text, "--debug-force-output")?,
            });
        }
        if !turns.is_empty() {
            tracing::warn!(
                turns = turns.len(),
                "--debug-force-output: requests generate the scripted text (a test hook)"
            );
            config.forced_output = Some(ScriptedOutput { turns });
        }
        Ok(())
    }
}
