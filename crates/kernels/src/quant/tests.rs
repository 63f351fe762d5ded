use super::*;
use crate::formats::e2m1_to_f32;

/// Deterministic values spanning many binades, with exact zeros and both signs.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            let binade = ((s >> 20) % 12) as i32 - 6;
            if i % 17 == 0 {
                0.0
            } else {
                u * 2f32.powi(binade)
            }
        })
        .collect()
}

/// The nearest of `grid` (ascending magnitudes with their codes) to `x`, ties to the even
/// code: an exhaustive search, independent of the encoders' bit manipulation.
fn nearest(x: f32, grid: &[(u8, f32)]) -> f32 {
    let mut best = grid[0];
    for &(c, v) in grid {
        let (d, db) = ((x - v).abs(), (x - best.1).abs());
        if d < db || (d == db && c % 2 == 0 && best.0 % 2 == 1) {
            best = (c, v);
        }
    }
    best.1
}

/// Scale from `log2` in f64 (exact for these values), not from the exponent bits.
fn pow2_ceil(amax: f32, floor: f32, max: f32) -> f32 {
    let s = amax.max(floor) as f64 / max as f64;
    2f64.powi(s.log2().ceil() as i32) as f32
}

fn reference_round_trip(
    x: &[f32],
    block: usize,
    grid: &[(u8, f32)],
    floor: f32,
    max: f32,
) -> Vec<f32> {
    let mut out = Vec::new();
    for b in x.chunks(block) {
        let s = pow2_ceil(b.iter().fold(0.0f32, |m, v| m.max(v.abs())), floor, max);
        out.extend(b.iter().map(|&v| {
            let y = (v / s).clamp(-max, max);
            nearest(y.abs(), grid).copysign(y) * s
        }));
    }
    out
}

#[test]
fn fp8_round_trip_equals_nearest_e4m3_in_pow2_blocks() {
    let grid: Vec<(u8, f32)> = (0..0x7Fu8).map(|c| (c, e4m3_to_f32(c))).collect();
    for (n, block) in [(512, 128), (192, 128), (448, 64), (48, 64), (7, 4)] {
        let x = values(n, n as u64 + block as u64);
        let want = reference_round_trip(&x, block, &grid, FP8_AMAX_FLOOR, E4M3_MAX);
        let mut got = x.clone();
        fp8_round_trip(&mut got, block);
        for i in 0..n {
            assert_eq!(
                got[i].to_bits() & 0x7FFF_FFFF,
                want[i].to_bits() & 0x7FFF_FFFF,
                "n {n} block {block} i {i}: {} -> {} vs {}",
                x[i],
                got[i],
                want[i]
            );
        }
    }
}

/// MXFP8 (V4.1's activations): 32-blocks and no 1e-4 amax floor, so a block of tiny values
/// keeps its precision where DeepSeek-V4's floored FP8 flushes it to a coarse grid.
#[test]
fn mxfp8_round_trip_equals_nearest_e4m3_without_a_floor() {
    let grid: Vec<(u8, f32)> = (0..0x7Fu8).map(|c| (c, e4m3_to_f32(c))).collect();
    for (n, tiny) in [(512, 1.0), (80, 1.0), (64, 1e-6)] {
        let x: Vec<f32> = values(n, 99 + n as u64).iter().map(|v| v * tiny).collect();
        let want = reference_round_trip(&x, MX_BLOCK, &grid, f32::MIN_POSITIVE, E4M3_MAX);
        let mut got = x.clone();
        mxfp8_round_trip(&mut got);
        let bits = |v: &[f32]| {
            v.iter()
                .map(|f| f.to_bits() & 0x7FFF_FFFF)
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&got), bits(&want), "n {n} tiny {tiny}");
        let mut floored = x.clone();
        fp8_round_trip(&mut floored, MX_BLOCK);
        assert_eq!(
            tiny < 1.0,
            floored != got,
            "n {n}: only tiny blocks feel the floor"
        );
    }
    let mut zeros = [0.0f32; 32];
    mxfp8_round_trip(&mut zeros);
    assert_eq!(zeros, [0.0; 32]);
}

#[test]
fn fp4_round_trip_equals_nearest_e2m1_in_pow2_blocks() {
    let grid: Vec<(u8, f32)> = (0..8u8).map(|c| (c, e2m1_to_f32(c))).collect();
    for (n, block) in [(128, 32), (64, 32), (40, 32)] {
        let x = values(n, 7 + n as u64);
        let want = reference_round_trip(&x, block, &grid, FP4_AMAX_FLOOR, E2M1_MAX);
        let mut got = x.clone();
        fp4_round_trip(&mut got, block);
        for i in 0..n {
            assert_eq!(
                got[i].abs(),
                want[i].abs(),
                "n {n} i {i}: {} -> {} vs {}",
                x[i],
                got[i],
                want[i]
            );
            assert!(got[i] == 0.0 || got[i].signum() == x[i].signum());
        }
    }
}

#[test]
fn a_block_at_the_format_maximum_keeps_its_values() {
    // amax 448·2^k gives scale 2^k exactly, so the values already on the grid stay put.
    let mut x = vec![448.0, -224.0, 1.75, 0.0];
    fp8_round_trip(&mut x, 4);
    assert_eq!(x, vec![448.0, -224.0, 1.75, 0.0]);
    let mut x = vec![12.0, -3.0, 1.0, 0.5];
    fp4_round_trip(&mut x, 4);
    assert_eq!(x, vec![12.0, -3.0, 1.0, 0.0]);
}

#[test]
fn hadamard_equals_the_sylvester_matrix_and_is_its_own_inverse() {
    for n in [1usize, 2, 8, 64, 128] {
        let x = values(n, n as u64);
        let mut got = x.clone();
        hadamard(&mut got);
        let scale = 1.0 / (n as f64).sqrt();
        for (i, g) in got.iter().enumerate() {
            let want: f64 = (0..n)
                .map(|j| {
                    let sign = if (i & j).count_ones() % 2 == 0 {
                        1.0
                    } else {
                        -1.0
                    };
                    sign * x[j] as f64
                })
                .sum::<f64>()
                * scale;
            assert!(
                (*g as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "n {n} i {i}"
            );
        }
        hadamard(&mut got);
        for (a, b) in got.iter().zip(&x) {
            assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()));
        }
    }
}

#[test]
fn e2m1_round_trips_its_grid_and_rounds_ties_to_even() {
    for c in 0..16u8 {
        if c == 8 {
            continue; // -0 encodes as +0
        }
        assert_eq!(f32_to_e2m1(e2m1_to_f32(c)), c, "code {c}");
    }
    for (x, want) in [
        (0.25, 0.0),
        (0.75, 1.0),
        (1.25, 1.0),
        (1.75, 2.0),
        (2.5, 2.0),
        (3.5, 4.0),
        (5.0, 4.0),
        (5.01, 6.0),
        (100.0, 6.0),
        (-0.26, -0.5),
        (-0.1, 0.0),
    ] {
        assert_eq!(e2m1_to_f32(f32_to_e2m1(x)), want, "{x}");
    }
}

#[test]
fn scale_is_the_smallest_power_of_two_that_fits() {
    assert_eq!(e8m0_to_f32(pow2_scale_byte(448.0, 1e-4, 448.0)), 1.0);
    assert_eq!(e8m0_to_f32(pow2_scale_byte(448.1, 1e-4, 448.0)), 2.0);
    assert_eq!(e8m0_to_f32(pow2_scale_byte(6.0, 0.0, 6.0)), 1.0);
    assert_eq!(
        e8m0_to_f32(pow2_scale_byte(0.0, 1e-4, 448.0)),
        2f32.powi(-22)
    );
    let b = pow2_scale_byte(0.0, FP4_AMAX_FLOOR, E2M1_MAX);
    assert_eq!(e8m0_to_f32(b), f32::MIN_POSITIVE);
}
