//! `deepinfer bench kernels`: each weight format's matrix product against this machine's
//! roofs, measured in the same run.
//!
//! Decode rows stream a working set of matrices far larger than the last-level cache (one
//! pass = every matrix once, as a decode step reads every weight once), so they report
//! DRAM-fed speed against the read roof; prefill rows reuse one matrix, so they report
//! compute speed against the FMA peak. Each timed pass follows a fresh measurement of its
//! roof.

use clap::Args;
use deepinfer_model::kernels::buffer::WeightBytes;
use deepinfer_model::kernels::choice::{bf16_dot_gain, bf16_dots};
use deepinfer_model::kernels::cpu::{amx, bf16_dots_detected, isa};
use deepinfer_model::kernels::formats::f32_to_bf16;
use deepinfer_model::kernels::ggml::Block;
use deepinfer_model::kernels::linear::{matmuls, Matmul};
use deepinfer_model::kernels::matrix::QMatrix;
use deepinfer_model::kernels::roofline::{amx_rates, bf16_dot_peak, fma_peak, read_bandwidth};
use deepinfer_model::numerics::Numerics;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct KernelArgs {
    /// Working set per format for the decode rows, in MiB (well above the last-level cache).
    #[arg(long, default_value_t = 1024)]
    working_set_mib: usize,
    /// Timed passes per row; the median is reported.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Activation rows for the decode (memory-bound) rows.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,16")]
    decode_m: Vec<usize>,
    /// Activation rows for the prefill (compute-bound) rows (0: none). 200 is an MoE
    /// expert's kind of share of a prompt, not a multiple of the GEMM's strip width.
    #[arg(long, value_delimiter = ',', default_value = "128,200,512")]
    prefill_m: Vec<usize>,
    /// Whose activations the products see: `official` marks them exact in bf16, as official
    /// numerics' FP8-rounded projection inputs are (FP8 and FP4 products then run on the AMX
    /// tiles where they are in use, `DEEPINFER_ISA=amx`); the activations here are exact
    /// either way.
    #[arg(long, default_value_t = Numerics::Reference)]
    numerics: Numerics,
    /// Whose matrix shapes: `bench` (the bench preset's, half V4-Flash's width) or `flash`
    /// (V4-Flash's own: the head, a compressor, the attention projections, the experts).
    /// `gguf`: V4-Flash's as llama.cpp's converter stores them (Q8_0 projections, MXFP4
    /// experts, the BF16 head), to run with `--numerics gguf`.
    #[arg(long, default_value = "bench", value_parser = ["bench", "flash", "gguf"])]
    shapes: String,
    #[command(flatten)]
    pub threads: crate::thread_args::ThreadArgs,
}

/// The bench preset's shapes: dense 2048×2048 projections, FP4 experts 768×2048.
const BENCH_SHAPES: &[(&str, usize, usize)] = &[
    ("f32", 2048, 2048),
    ("bf16", 2048, 2048),
    ("bf16", 32768, 2048),
    ("fp8", 2048, 2048),
    ("fp4", 768, 2048),
];

/// V4-Flash's (`synth --preset flash-slice`): the BF16 head (129 280 × 4 096) and a CSA
/// compressor's `wkv`, FP8 `wq_a`, `wq_b` (64 heads × 512 from q-LoRA 1 024) and `wo_b`
/// (8 groups × 1 024 in), an FP4 expert's `w1` and `w2`.
const FLASH_SHAPES: &[(&str, usize, usize)] = &[
    ("bf16", 129280, 4096),
    ("bf16", 1024, 4096),
    ("fp8", 1024, 4096),
    ("fp8", 32768, 1024),
    ("fp8", 4096, 8192),
    ("fp4", 2048, 4096),
    ("fp4", 4096, 2048),
];

/// V4-Flash's shapes in a GGUF file of llama.cpp's converter: [`FLASH_SHAPES`] with the FP8
/// projections as Q8_0 and the FP4 experts as MXFP4; then an expert's matrices as a
/// Q4_K_M quantisation stores them (Q4_K, and Q6_K where it keeps more bits), and as
/// antirez's ds4 q2 file does (gate and up IQ2_XXS, down Q2_K).
const GGUF_SHAPES: &[(&str, usize, usize)] = &[
    ("bf16", 129280, 4096),
    ("q8_0", 1024, 4096),
    ("q8_0", 32768, 1024),
    ("q8_0", 4096, 8192),
    ("mxfp4", 2048, 4096),
    ("mxfp4", 4096, 2048),
    ("q4_K", 2048, 4096),
    ("q6_K", 4096, 2048),
    ("iq2_xxs", 2048, 4096),
    ("q2_K", 4096, 2048),
];

/// A cheap deterministic byte stream (the bytes only need to be varied, not random).
fn fill(buf: &mut [u8], seed: u64) {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        for (b, v) in chunk.iter_mut().zip(s.to_le_bytes()) {
            *b = v;
        }
    }
}

/// A `[rows, cols]` matrix of `format` with varied, finite contents, as a checkpoint's are:
/// no subnormal values. Raw random bits would give BF16 and FP8 codes with exponent zero (one
/// in 128 and one in 16), which no trained weight has in such numbers and which decode to f32
/// subnormals — on Intel cores a microcode assist per multiply, 10–20× slower.
fn make(format: &str, rows: usize, cols: usize, seed: u64) -> QMatrix {
    let mut bytes = vec![0u8; rows * cols * 4];
    fill(&mut bytes, seed);
    let uniform: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| (u32::from_le_bytes([c[0], c[1], c[2], c[3]]) >> 8) as f32 / 8.4e6 - 1.0)
        .collect();
    match format {
        "f32" => QMatrix::from_f32(rows, cols, &uniform).expect("shape"),
        "bf16" => {
            let b: Vec<u8> = uniform
                .iter()
                .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
                .collect();
            QMatrix::bf16_from_bytes(rows, cols, &b).expect("shape")
        }
        "fp8" => {
            // Any code but NaN (0x7F/0xFF) and the subnormals (exponent field 0).
            let codes: Vec<u8> = bytes[..rows * cols]
                .iter()
                .map(|&b| match b & 0x7F {
                    0x7F => 0x3F,
                    m if m >> 3 == 0 => b | 0x08,
                    _ => b,
                })
                .collect();
            let grid = rows.div_ceil(128) * cols.div_ceil(128);
            QMatrix::fp8(
                rows,
                cols,
                &codes,
                vec![2f32.powi(-8); grid],
                cols.div_ceil(128),
                128,
                128,
            )
            .expect("shape")
        }
        "fp4" => {
            let scales = vec![120u8; rows * cols / 32];
            QMatrix::fp4(rows, cols, &bytes[..rows * cols / 2], &scales, 32).expect("shape")
        }
        ggml => {
            let block = Block::from_name(ggml).unwrap_or_else(|| unreachable!("format {ggml}"));
            let mut b = bytes[..rows * block.row_bytes(cols)].to_vec();
            // Scales as a checkpoint's: f16 near 2^-7, or E8M0 near 2^-6.
            for blk in b.chunks_exact_mut(block.bytes()) {
                block.set_scales(blk, 0x2000);
                if block == Block::Mxfp4 {
                    blk[0] = 121;
                }
            }
            QMatrix::ggml_in(rows, cols, block, WeightBytes::copy_from(&b)).expect("shape")
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `f` `reps` times after one warm-up, each time right after measuring the roof it is
/// compared with (`roof()`): on a shared machine the roofs drift from one minute to the
/// next, so each run is set against the roof of its own moment. Returns the median seconds
/// and the median of the per-run shares `units / secs / roof`.
fn paired(
    reps: usize,
    units: f64,
    mut roof: impl FnMut() -> f64,
    mut f: impl FnMut(),
) -> (f64, f64) {
    f();
    let (mut secs, mut shares) = (Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        let r = roof();
        let t = Instant::now();
        f();
        let s = t.elapsed().as_secs_f64();
        secs.push(s);
        shares.push(units / s / r);
    }
    (median(secs), median(shares))
}

/// Which instructions this process multiplies on, and why: the choices `matmuls` makes.
fn print_choice(numerics: Numerics) {
    println!(
        "products: f32 FMAs ({}), {}",
        isa().name(),
        super::gemm_choice()
    );
    if bf16_dots_detected() {
        let (used, gain) = (bf16_dots(), bf16_dot_gain());
        let verdict = if used { "yes" } else { "no" };
        println!(
            "FP4, BF16 and FP8 (from 8 rows to the GEMM) products on bf16 dot products: \
             {verdict} (vdpbf16ps does {gain:.2}x an f32 FMA's flops on this core, used from \
             1.5x and with activations exact in bf16: official numerics; the same bits either \
             way)"
        );
    }
    if numerics.bf16_exact_inputs() && amx() {
        println!("AMX tiles: FP8/FP4 products at every batch size (DEEPINFER_ISA=amx)");
    } else if amx_rates(1, 1).is_some() {
        // The tiles sum in their own order, which no vector kernel reproduces, so they can
        // only take every batch size of a product or none (a row's bits may not depend on
        // its batch); they lose below 16 rows, hence a choice.
        println!("AMX tiles: off (DEEPINFER_ISA=amx runs official numerics' FP8/FP4 on them)");
    }
}

pub fn run(args: KernelArgs) {
    let threads = rayon::current_num_threads();
    print_header(&args, threads);
    let shapes = match args.shapes.as_str() {
        "flash" => FLASH_SHAPES,
        "gguf" => GGUF_SHAPES,
        _ => BENCH_SHAPES,
    };
    for &(format, rows, cols) in shapes {
        bench_shape(&args, threads, format, rows, cols);
    }
}

// Decode rows are compared with the read roof, prefill rows with the FMA peak, each measured
// again just before every timed pass (the "% of" columns are medians of those pairs; the
// roofs the header prints are only a first reading).
fn bw_probe(threads: usize) -> f64 {
    read_bandwidth(256 << 20, threads, 2)
}

fn fma_probe(threads: usize) -> f64 {
    fma_peak(threads, 1)
}

/// The family, the roofs, the choices `matmuls` makes and the table's head.
fn print_header(args: &KernelArgs, threads: usize) {
    let tiles = if args.numerics.bf16_exact_inputs() && amx() {
        ", FP8/FP4 on AMX tiles"
    } else {
        ""
    };
    println!(
        "kernels: {}{tiles} ({threads} threads), {} numerics",
        isa().name(),
        args.numerics
    );
    println!(
        "roofs now: read bandwidth {:.1} GB/s, f32 FMA peak {:.1} GFLOP/s (each row is set against \
         the roof measured right before each of its passes)",
        bw_probe(threads),
        fma_probe(threads)
    );
    if let Some(b) = bf16_dot_peak(threads, 1) {
        // What kernels on bf16 pairs could reach here (official numerics' activations are
        // exact in bf16), beside the f32 FMA peak the kernels use.
        println!("bf16 dot-product peak (vdpbf16ps) {b:.1} GFLOP/s");
    }
    if let Some((flops, loads)) = amx_rates(threads, 1) {
        // The tiles' compute roof, and how fast whole tiles load (what bounds the AMX
        // products at small batches, which load every weight into a tile).
        println!("AMX-BF16 tiles: tdpbf16ps {flops:.1} GFLOP/s, tile loads {loads:.1} GB/s");
    }
    print_choice(args.numerics);
    super::passes::print(threads);
    println!();
    println!(
        "{:<6} {:>12} {:>6} {:>10} {:>10} {:>9} {:>10} {:>9}",
        "format", "matrix", "m", "GB/s", "Gweight/s", "% of BW", "GFLOP/s", "% of FMA"
    );
}

/// The table's rows for one `[rows, cols]` matrix of `format`: each decode row count over
/// enough copies to leave the caches, each prefill row count on one copy.
fn bench_shape(args: &KernelArgs, threads: usize, format: &str, rows: usize, cols: usize) {
    let one = make(format, rows, cols, 1).stored_bytes();
    let copies = ((args.working_set_mib << 20) / one).max(1);
    let mats: Vec<QMatrix> = (0..copies)
        .map(|i| make(format, rows, cols, i as u64 + 2))
        .collect();
    let shape = format!("{rows}x{cols}");
    // In gguf numerics the products quantise their input as llama.cpp's do.
    let inputs = args.numerics.inputs();
    let matmul = |w, x: &[f32], m, y: &mut [f32]| {
        matmuls(&mut [Matmul::new(w, x, m, y).with_inputs(inputs)])
    };
    let line = |m: usize,
                secs: f64,
                bytes: f64,
                weights: f64,
                bw_pct: Option<f64>,
                fma_pct: f64| {
        let flops = 2.0 * m as f64 * weights / secs / 1e9;
        let bw_pct = bw_pct.map_or("-".to_string(), |p| format!("{p:.0}%"));
        println!(
            "{format:<6} {shape:>12} {m:>6} {:>10.1} {:>10.1} {bw_pct:>9} {flops:>10.1} {fma_pct:>8.0}%",
            bytes / secs / 1e9,
            weights / secs / 1e9,
        );
    };
    for &m in args.decode_m.iter().filter(|&&m| m > 0) {
        let x = vec![0.5f32; m * cols];
        let mut y = vec![0.0f32; m * rows];
        let (bytes, weights) = ((one * copies) as f64, (rows * cols * copies) as f64);
        let (secs, share) = paired(
            args.reps,
            bytes / 1e9,
            || bw_probe(threads),
            || {
                for w in &mats {
                    matmul(w, &x, m, &mut y);
                }
            },
        );
        let fma = 2.0 * m as f64 * weights / secs / 1e9 / fma_probe(threads);
        line(m, secs, bytes, weights, Some(100.0 * share), 100.0 * fma);
    }
    for &m in args.prefill_m.iter().filter(|&&m| m > 0) {
        let x = vec![0.5f32; m * cols];
        let mut y = vec![0.0f32; m * rows];
        let w = &mats[0];
        let flops = 2.0 * (m * rows * cols) as f64;
        let (secs, share) = paired(
            args.reps,
            flops / 1e9,
            || fma_probe(threads),
            || matmul(w, &x, m, &mut y),
        );
        let weights = (rows * cols) as f64;
        line(m, secs, one as f64, weights, None, 100.0 * share);
    }
}
