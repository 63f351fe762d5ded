//! `deepinfer`: the command-line entry point.

mod bench;
mod chat;
mod chat_format_args;
mod engine_args;
mod generate;
mod hub;
mod load_args;
mod memory;
mod ranks;
#[cfg(test)]
mod readme_commands;
mod script_args;
mod serve;
mod synth;
mod thread_args;

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
    Bench(Box<bench::BenchArgs>),
    /// Write a synthetic checkpoint (random weights, official layout) for trying the engine.
    Synth(synth::SynthArgs),
    /// Chat with the model in this process, answers streamed (default model: the synthetic one).
    Chat(chat::ChatArgs),
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
            eprintln!("error: {}", report(&e));
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Bench(args) => bench::run(*args),
        Command::Synth(args) => synth::run(args),
        Command::Chat(args) => chat::run(args),
    };
    match (result, world) {
        (Ok(()), _) => {
            deepinfer_engine::dist::finalize();
            std::process::ExitCode::SUCCESS
        }
        // The other ranks may be waiting for this one: end them all.
        (Err(e), Some(world)) => world.abort(&format!("error: {}", report(&e))),
        (Err(e), None) => {
            eprintln!("error: {}", report(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `e` and its causes joined by ": ", each said once: a cause whose text its outer error
/// already ends with (an error that shows its source in its own message) is not repeated.
fn report(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain().map(|c| c.to_string()) {
        if !out.ends_with(&cause) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&cause);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::report;
    use std::fmt;

    /// An error that shows its source in its own message.
    #[derive(Debug)]
    struct Shows(Inner);

    #[derive(Debug)]
    struct Inner;

    impl fmt::Display for Shows {
        fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "outer: {}", self.0)
        }
    }

    impl fmt::Display for Inner {
        fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("inner: the flag --x is 3")
        }
    }

    impl std::error::Error for Inner {}

    impl std::error::Error for Shows {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let e = anyhow::Error::new(Shows(Inner)).context("loading /m");
        assert_eq!(report(&e), "loading /m: outer: inner: the flag --x is 3");
        let e = anyhow::Error::new(Inner).context("loading /m");
        assert_eq!(report(&e), "loading /m: inner: the flag --x is 3");
    }
}
