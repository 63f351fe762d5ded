//! `deepinfer synth`: writes a synthetic checkpoint (random weights, official layout, real
//! tokenizer) so every other subcommand can be tried at a realistic shape without downloading
//! a model.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use deepinfer_model::synth::{preset, write_checkpoint, PRESETS};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Model shape: `tiny` (every layer kind at toy width, seconds to write), `tiny-gguf`
    /// (`tiny` with the compression ratios llama.cpp's GGUF converter takes), `tiny-kquant`
    /// (`tiny-gguf` with 256-wide rows, for llama.cpp's K-quants), `bench`
    /// (V4-Flash's architecture scaled to one machine, about 3.5 GB with its MTP block),
    /// `bench-bf16` (`bench` with BF16 dense weights, for llama.cpp), `big` (bench's width
    /// with 256 experts over 16 layers, about 12.5 GB: for streaming experts from disk),
    /// `flash-slice` (V4-Flash's exact per-layer shapes over 6 layers of 16 experts, about
    /// 4.7 GB), `tiny-v41` (DeepSeek-V4.1 at toy width), `bench-v41` (V4.1-Flash's
    /// proportions at bench's width, with its DSpark drafter), `tiny-v41-vision` (`tiny-v41`
    /// with a toy vision tower: images through the server), `tiny-v4-vision` (`tiny` with a
    /// toy V4-Flash-Vision-Exp tower: sentinel ids, `bias_vl` routing) or `vision-v41`
    /// (`tiny-v41` with V4.1-Flash's vision tower at its real widths, about 0.9 GB: `bench
    /// vision`).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(PRESETS))]
    preset: String,
    /// Output directory, created if missing.
    #[arg(long)]
    out: std::path::PathBuf,
    /// Seed of the random weights: the same seed writes the same bytes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write into a non-empty directory, replacing the checkpoint files already there.
    #[arg(long)]
    force: bool,
}

/// Whether `name` is a file this command writes (or an earlier, differently sharded run
/// wrote): removed under `--force` so no stale shard lingers beside the new index.
fn is_checkpoint_file(name: &str) -> bool {
    (name.starts_with("model") && name.ends_with(".safetensors"))
        || matches!(
            name,
            "model.safetensors.index.json"
                | "config.json"
                | "tokenizer.json"
                | "tokenizer_config.json"
        )
}

/// Refuses to mix a new checkpoint into a directory holding something else, unless forced.
fn prepare_out(out: &Path, force: bool) -> Result<()> {
    let entries = match std::fs::read_dir(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r.with_context(|| format!("cannot read the output directory {}", out.display()))?,
    };
    let mut names = Vec::new();
    for e in entries {
        let e = e.with_context(|| format!("cannot list {}", out.display()))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    if names.is_empty() {
        return Ok(());
    }
    if !force {
        bail!(
            "the output directory {} is not empty ({} entries); choose another --out or pass \
             --force to overwrite the checkpoint in it",
            out.display(),
            names.len()
        );
    }
    for name in names.iter().filter(|n| is_checkpoint_file(n)) {
        let path = out.join(name);
        std::fs::remove_file(&path)
            .with_context(|| format!("cannot remove the old {}", path.display()))?;
    }
    Ok(())
}

pub fn run(args: SynthArgs) -> Result<()> {
    let spec = preset(&args.preset)?;
    prepare_out(&args.out, args.force)?;

    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )?
        .progress_chars("=> "),
    );
    bar.set_message(format!("synth {}", args.preset));
    let start = Instant::now();
    let mut total = 0;
    write_checkpoint(&spec, &args.out, args.seed, |done, t| {
        total = t;
        bar.set_length(t);
        bar.set_position(done);
    })
    .with_context(|| {
        format!(
            "writing the `{}` checkpoint to {}",
            args.preset,
            args.out.display()
        )
    })?;
    bar.finish_and_clear();
    println!(
        "wrote preset `{}` (seed {}, {:.2} GB) to {} in {:.1} s",
        args.preset,
        args.seed,
        total as f64 / 1e9,
        args.out.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
