//! From how many activation rows the GEMM path takes over from the fused kernels: measured
//! once per process and kernel family, since it differs between cores.
//!
//! Both paths give the same bits (batch invariance: see the x86 GEMM path), so the choice is
//! speed alone. On the Intel Xeon of PERFORMANCE.md the fused kernels (groups of 8 rows)
//! multiplied 35–70 % faster than the GEMM at 16–32 rows, which at 16 rows spends as long
//! decoding and packing a group's weights as multiplying them; at 48 rows the two were
//! within 10 %. On Zen 4 they were about even at 16 rows.

use super::{matmuls_at, Matmul};
use crate::cpu::Isa;
use crate::matrix::QMatrix;
use std::time::{Duration, Instant};

/// The batch sizes tried, in order: the GEMM takes over at the first where it is as fast as
/// the fused kernels.
const TRIED: [usize; 3] = [16, 32, 48];
/// Where it takes over if it wins at none: past it the fused kernels, which read each
/// tile's weights again for every 8 rows, are not worth measuring.
const FALLBACK: usize = 64;
/// Timed runs of each path per batch size; the best counts: on a shared machine a run
/// took twice as long about every other time (a core away), for either path.
const REPS: usize = 7;

/// The crossover of family `isa`, timed on an FP8 product of the shape of an attention
/// projection (1 024 × 2 048, 2 MiB, power-of-two block scales as V4 checkpoints have), each
/// path's best of [`REPS`] alternating runs per batch size: 20–60 ms, once.
pub(super) fn measure(isa: Isa) -> usize {
    let (n, k) = (1024, 2048);
    let w = probe_matrix(n, k);
    let x: Vec<f32> = (0..FALLBACK * k)
        .map(|i| (i * 7919 % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let mut y = vec![0.0; FALLBACK * n];
    // The process's first products pay for its scratch, page faults and idle threads.
    for from in [usize::MAX, 1] {
        let job = Matmul::new(&w, &x, FALLBACK, &mut y);
        matmuls_at(&mut [job], (isa, false, false), from);
    }
    for m in TRIED {
        let mut run = |from: usize| {
            let t = Instant::now();
            let job = Matmul::new(&w, &x[..m * k], m, &mut y[..m * n]);
            matmuls_at(&mut [job], (isa, false, false), from);
            t.elapsed()
        };
        let (mut fused, mut gemm) = (Duration::MAX, Duration::MAX);
        for _ in 0..REPS {
            fused = fused.min(run(usize::MAX));
            gemm = gemm.min(run(m));
        }
        if gemm <= fused {
            return m;
        }
    }
    FALLBACK
}

/// An FP8 matrix of normal codes (no NaN; no zero exponent field, whose f32 decodes are
/// subnormal and cost some cores a microcode assist each, as trained weights rarely do).
fn probe_matrix(n: usize, k: usize) -> QMatrix {
    let codes: Vec<u8> = (0..n * k)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2_654_435_761) >> 24;
            let exp = 1 + h % 14;
            ((h & 0x80) | (exp << 3) | (h & 7)) as u8
        })
        .collect();
    let grid = n.div_ceil(128) * k.div_ceil(128);
    QMatrix::fp8(
        n,
        k,
        &codes,
        vec![2f32.powi(-8); grid],
        k.div_ceil(128),
        128,
        128,
    )
    .expect("the probe's shape")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever the measurement picks, the result is the same: at every size tried the
    /// fused kernels and the GEMM give the same bits, and the pick is one of the sizes.
    #[test]
    fn either_path_gives_the_same_bits_and_the_pick_is_a_tried_size() {
        let (n, k) = (300, 2048);
        let w = probe_matrix(n, k);
        let x: Vec<f32> = (0..FALLBACK * k)
            .map(|i| (i * 31 % 977) as f32 / 500.0 - 1.0)
            .collect();
        for isa in crate::cpu::families()
            .into_iter()
            .filter(|&f| f != Isa::Scalar)
        {
            for m in TRIED.into_iter().chain([FALLBACK - 1]) {
                let mut out = [vec![f32::NAN; m * n], vec![f32::NAN; m * n]];
                for (y, from) in out.iter_mut().zip([usize::MAX, m]) {
                    let job = Matmul::new(&w, &x[..m * k], m, y);
                    matmuls_at(&mut [job], (isa, false, false), from);
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out[0]), bits(&out[1]), "{isa:?} m={m}");
                assert!(out[0].iter().all(|v| v.is_finite()), "{isa:?} m={m}");
            }
            let pick = measure(isa);
            assert!(TRIED.contains(&pick) || pick == FALLBACK, "{isa:?}: {pick}");
        }
    }
}
