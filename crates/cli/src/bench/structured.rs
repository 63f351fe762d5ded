//! `bench --json-schema FILE`: the cost of structured outputs. The workload runs plain, then
//! with every request held to the schema, on the same engine settings; both reports print,
//! and the second adds what the masks cost: their time per mask (computed on a thread of
//! their own while each forward pass runs, so TPOT shows what they add beyond it).

use super::{print_report, workload, BenchArgs, Report};
use anyhow::{Context, Result};
use deepinfer_engine::engine::EngineConfig;
use deepinfer_model::v4::Model;
use deepinfer_server::structured::{Requested, Spec, Structured};
use deepinfer_server::tokenizer::Tokenizer;
use std::path::Path;

pub fn run(
    args: &BenchArgs,
    schema: &Path,
    dir: &Path,
    model: Model,
    config: EngineConfig,
    prompts: &[Vec<u32>],
) -> Result<()> {
    let text = std::fs::read_to_string(schema)
        .with_context(|| format!("reading --json-schema {}", schema.display()))?;
    let value = serde_json::from_str(&text)
        .with_context(|| format!("--json-schema {} is not JSON", schema.display()))?;
    let tok =
        Tokenizer::from_dir(dir).with_context(|| format!("the tokenizer of {}", dir.display()))?;
    let eos = *model
        .config
        .eos_token_ids
        .first()
        .context("the model names no EOS token")?;
    let structured = Structured::new(&tok, eos).map_err(anyhow::Error::msg)?;
    let requested = Requested {
        spec: Spec::JsonSchema(value),
        field: "--json-schema".into(),
    };
    let grammar = structured
        .compile(&requested)
        .map_err(|e| anyhow::anyhow!("--json-schema {}: {}", schema.display(), e.message))?;
    let (timings, counts, model) = workload(model, config.clone(), prompts, args, None)?;
    println!("Without a schema:");
    print_report(&Report::new(args, &timings, &counts));
    let (timings, counts, _) = workload(model, config, prompts, args, Some(&grammar))?;
    println!("Every request held to {}:", schema.display());
    print_report(&Report::new(args, &timings, &counts));
    println!("{:<40}{:>10}", "Structured-output masks:", counts.masks);
    println!(
        "{:<40}{:>10.3}",
        "Mean time per mask (ms):",
        counts.mask_s * 1e3 / counts.masks.max(1) as f64
    );
    Ok(())
}
