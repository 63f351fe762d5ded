//! `deepinfer bench vision`: the vision tower's time per image size against the f32 FMA
//! roof (the tower's products are BF16 weights times f32 activations, on the FMA kernels):
//! preprocessing (resize, pad, patches), then the ViT and aligner, with the flops they do.

use anyhow::{bail, Context, Result};
use clap::Args;
use deepinfer_model::checkpoint::Checkpoint;
use deepinfer_model::config::{ModelConfig, VisionConfig};
use deepinfer_model::vision::{ImagePlan, Pixels, VisionTower};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct VisionArgs {
    /// Checkpoint directory with a vision tower (`deepinfer synth --preset vision-v41` writes
    /// V4.1-Flash's tower at its real widths).
    #[arg(long)]
    pub model: PathBuf,
    /// Source image sizes, `WIDTHxHEIGHT`, comma-separated; each is brought to the tower's
    /// canvas as a request's image would be.
    #[arg(long, default_value = "224x224,448x448,896x896")]
    pub sizes: String,
    /// Encodes per size; the fastest is reported.
    #[arg(long, default_value_t = 1)]
    pub reps: usize,
}

pub fn run(args: VisionArgs) -> Result<()> {
    let path = args.model.join("config.json");
    let config =
        ModelConfig::from_file(&path).with_context(|| format!("reading {}", path.display()))?;
    let Some(vc) = config.vision.clone() else {
        bail!(
            "--model {}: its config declares no vision tower",
            args.model.display()
        );
    };
    let ck = Checkpoint::open(&args.model)?;
    let tower = VisionTower::load(&ck, &vc, config.hidden_size, 0)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let peak = deepinfer_kernels::roofline::fma_peak(threads, 3);
    println!(
        "deepinfer bench vision: {} ({} blocks of {}, {} heads, MLP {}, aligner to {}); \
         f32 FMA peak {peak:.0} GFLOP/s on {threads} threads",
        args.model.display(),
        vc.n_layers,
        vc.dim,
        vc.n_heads,
        vc.inter_dim,
        config.hidden_size
    );
    println!(
        "{:>11} {:>11} {:>8} {:>7} {:>9} {:>10} {:>8} {:>9} {:>7}",
        "image", "canvas", "patches", "tokens", "prep ms", "tower ms", "GFLOP", "GFLOP/s", "% peak"
    );
    for size in args.sizes.split(',') {
        let (w, h) = parse_size(size)?;
        let image = gradient(w, h);
        let (mut prep, mut enc) = (f64::INFINITY, f64::INFINITY);
        let mut plan = None;
        for _ in 0..args.reps.max(1) {
            let t = Instant::now();
            let (p, patches) = tower.prepare(&image)?;
            prep = prep.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            std::hint::black_box(tower.encode_patches(p, &patches));
            enc = enc.min(t.elapsed().as_secs_f64());
            plan = Some(p);
        }
        let p = plan.expect("at least one rep");
        let gflop = tower_flops(&vc, &p, config.hidden_size) / 1e9;
        let rate = gflop / enc;
        println!(
            "{:>11} {:>11} {:>8} {:>7} {:>9.1} {:>10.1} {:>8.1} {:>9.1} {:>6.0}%",
            size,
            format!("{}x{}", p.width, p.height),
            p.patches(),
            tower.span(&p, 0).len(),
            prep * 1e3,
            enc * 1e3,
            gflop,
            rate,
            100.0 * rate / peak
        );
    }
    Ok(())
}

fn parse_size(s: &str) -> Result<(usize, usize)> {
    let parsed = s
        .split_once('x')
        .and_then(|(w, h)| Some((w.trim().parse().ok()?, h.trim().parse().ok()?)));
    match parsed {
        Some((w, h)) if w > 0 && h > 0 => Ok((w, h)),
        _ => bail!("--sizes: {s:?} is not WIDTHxHEIGHT (e.g. 448x448)"),
    }
}

/// A smooth RGB gradient: the tower's cost does not depend on the pixels.
fn gradient(w: usize, h: usize) -> Pixels {
    let rgb = (0..h)
        .flat_map(|y| {
            (0..w).flat_map(move |x| [(x % 256) as u8, (y % 256) as u8, ((x + y) % 256) as u8])
        })
        .collect();
    Pixels {
        width: w,
        height: h,
        rgb,
    }
}

/// Multiply-adds ×2 of one image through the ViT (patch embedding, per block the qkv, output
/// and MLP products and attention's two n × n products) and the aligner.
fn tower_flops(vc: &VisionConfig, p: &ImagePlan, hidden: usize) -> f64 {
    let (n, d, i) = (p.patches() as f64, vc.dim as f64, vc.inter_dim as f64);
    let block = n * (3.0 * d * d + d * d + 2.0 * i * d + i * d) + 2.0 * n * n * d;
    let embed = n * vc.patch_values() as f64 * d;
    let r2 = (vc.downsample_ratio * vc.downsample_ratio) as f64;
    let h = hidden as f64;
    let aligner = p.rows() as f64 * (d * r2 * h + h * h);
    2.0 * (vc.n_layers as f64 * block + embed + aligner)
}
