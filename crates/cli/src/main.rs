//! `deepinfer`: the command-line entry point.

mod bench;
mod engine_args;
mod generate;
mod load_args;
mod ranks;
mod serve;
mod synth;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "deepinfer",
    version,
    about = "A serving engine for DeepSeek-V4 models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible API (default model: a small synthetic one).
    Serve(serve::ServeArgs),
    /// Offline generation through the engine (greedy by default), one JSON line per prompt.
    Generate(generate::GenerateArgs),
    /// Run a workload through the engine and report latency and throughput like `vllm bench serve`.
    Bench(bench::BenchArgs),
    /// Write a synthetic checkpoint (random weights, official layout) for trying the engine.
    Synth(synth::SynthArgs),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let world = match ranks::join() {
        Ok(world) => world,
        Err(e) => {
            eprintln!("error: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Synth(args) => synth::run(args),
    };
    match (result, world) {
        (Ok(()), _) => {
            deepinfer_engine::dist::finalize();
            std::process::ExitCode::SUCCESS
        }
        // The other ranks may be waiting for this one: end them all.
        (Err(e), Some(world)) => world.abort(&format!("error: {e:#}")),
        (Err(e), None) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
