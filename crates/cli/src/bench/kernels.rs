//! `deepinfer bench kernels`: each weight format's matrix product against this machine's
//! roofs, measured in the same run.
//!
//! Decode rows stream a working set of matrices far larger than the last-level cache (one
//! pass = every matrix once, as a decode step reads every weight once), so they report
//! DRAM-fed speed; prefill rows reuse one matrix, so they report compute speed.

use clap::Args;
use deepinfer_model::kernels::cpu::isa;
use deepinfer_model::kernels::linear::matmul;
use deepinfer_model::kernels::matrix::QMatrix;
use deepinfer_model::kernels::roofline::{fma_peak, read_bandwidth};
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
    /// Activation rows for the prefill (compute-bound) rows.
    #[arg(long, value_delimiter = ',', default_value = "128,512")]
    prefill_m: Vec<usize>,
}

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

/// A `[rows, cols]` matrix of `format` with varied, finite contents.
fn make(format: &str, rows: usize, cols: usize, seed: u64) -> QMatrix {
    let mut bytes = vec![0u8; rows * cols * 4];
    fill(&mut bytes, seed);
    match format {
        "f32" => {
            let v: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| (u32::from_le_bytes([c[0], c[1], c[2], c[3]]) >> 8) as f32 / 8.4e6 - 1.0)
                .collect();
            QMatrix::from_f32(rows, cols, &v).expect("shape")
        }
        "bf16" => {
            // Clear the exponent's top bit: finite values in (-2, 2).
            let b: Vec<u8> = bytes[..rows * cols * 2]
                .chunks_exact(2)
                .flat_map(|c| [c[0], c[1] & 0xBF])
                .collect();
            QMatrix::bf16_from_bytes(rows, cols, &b).expect("shape")
        }
        "fp8" => {
            let codes: Vec<u8> = bytes[..rows * cols]
                .iter()
                .map(|&b| if b & 0x7F == 0x7F { 0x3F } else { b })
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
        other => unreachable!("format {other}"),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of `reps` runs of `f` after one warm-up.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..reps.max(1))
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

pub fn run(args: KernelArgs) {
    let threads = rayon::current_num_threads();
    println!("kernels: {} ({threads} threads)", isa().name());
    let bw = read_bandwidth(1 << 30, threads, 5);
    let peak = fma_peak(threads, 5);
    println!("measured roofs: read bandwidth {bw:.1} GB/s, f32 FMA peak {peak:.1} GFLOP/s");
    println!();
    println!(
        "{:<6} {:>12} {:>6} {:>10} {:>10} {:>9} {:>10} {:>9}",
        "format", "matrix", "m", "GB/s", "Gweight/s", "% of BW", "GFLOP/s", "% of FMA"
    );
    // The bench preset's shapes: dense 2048×2048 projections, FP4 experts 768×2048.
    for (format, rows, cols) in [
        ("f32", 2048, 2048),
        ("bf16", 2048, 2048),
        ("bf16", 32768, 2048),
        ("fp8", 2048, 2048),
        ("fp4", 768, 2048),
    ] {
        let one = make(format, rows, cols, 1).stored_bytes();
        let copies = ((args.working_set_mib << 20) / one).max(1);
        let mats: Vec<QMatrix> = (0..copies)
            .map(|i| make(format, rows, cols, i as u64 + 2))
            .collect();
        let shape = format!("{rows}x{cols}");
        let line = |m: usize, secs: f64, bytes: f64, weights: f64| {
            let flops = 2.0 * m as f64 * weights / secs / 1e9;
            println!(
                "{format:<6} {shape:>12} {m:>6} {:>10.1} {:>10.1} {:>8.0}% {flops:>10.1} {:>8.0}%",
                bytes / secs / 1e9,
                weights / secs / 1e9,
                100.0 * bytes / secs / 1e9 / bw,
                100.0 * flops / peak
            );
        };
        for &m in &args.decode_m {
            let x = vec![0.5f32; m * cols];
            let mut y = vec![0.0f32; m * rows];
            let secs = time(args.reps, || {
                for w in &mats {
                    matmul(w, &x, m, &mut y);
                }
            });
            line(
                m,
                secs,
                (one * copies) as f64,
                (rows * cols * copies) as f64,
            );
        }
        for &m in &args.prefill_m {
            let x = vec![0.5f32; m * cols];
            let mut y = vec![0.0f32; m * rows];
            let w = &mats[0];
            let secs = time(args.reps, || matmul(w, &x, m, &mut y));
            line(m, secs, one as f64, (rows * cols) as f64);
        }
    }
}
