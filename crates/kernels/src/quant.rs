//! Block quantisation with power-of-two (E8M0) scales, the one rule behind DeepSeek's weight
//! converter and its inference code's activation quantisation (docs/MODEL.md §2 `act_quant`,
//! `fp4_act_quant`): per block, `s = 2^ceil(log2(max(amax, floor) / fmt_max))`, then
//! round to nearest even onto FP8 e4m3 or FP4 e2m1 after clamping to the format's range.
//! Because `s` is a power of two, `q · s` is exact in f32: a round trip (quantise, then
//! write back `q · s`) is all a consumer that computes in f32 needs to see.

use crate::formats::{e2m1_to_f32, e4m3_to_f32, e8m0_to_f32, f32_to_e4m3, E4M3_MAX};

/// Largest FP4 e2m1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// The amax floor of FP8 activation and weight blocks (an all-zero block gets scale 2^-22).
pub const FP8_AMAX_FLOOR: f32 = 1e-4;
/// The amax floor of FP4 blocks: the smallest scale is the smallest normal f32.
pub const FP4_AMAX_FLOOR: f32 = E2M1_MAX * f32::MIN_POSITIVE;

/// E8M0 byte of `2^ceil(log2(max(amax, floor) / fmt_max))`: the reference's bit trick (bump
/// the exponent when any mantissa bit is set), which a float `log2` can get wrong just above
/// a power of two. The biased f32 exponent of a power of two is exactly its E8M0 byte.
pub fn pow2_scale_byte(amax: f32, floor: f32, fmt_max: f32) -> u8 {
    let s = amax.max(floor) / fmt_max;
    let bits = s.to_bits();
    let exp = (bits >> 23) & 0xFF;
    let exp = if bits & 0x7F_FFFF != 0 { exp + 1 } else { exp };
    exp.min(254) as u8
}

/// FP4 e2m1 code of `x` (bit 3 = sign), round to nearest even on the grid
/// {0, .5, 1, 1.5, 2, 3, 4, 6} after clamping to ±6. Zero is always stored unsigned, as the
/// converter does. The grid is uniform within [0, 2], [2, 4] and [4, 6] and consecutive codes
/// alternate parity, so rounding the offset within a segment to even rounds the code to even;
/// every subtraction and scaling here is exact.
pub fn f32_to_e2m1(x: f32) -> u8 {
    // Adding and removing 2^23 rounds a small non-negative f32 to an integer, ties to even,
    // without the libm call `round_ties_even` becomes on baseline x86-64.
    let rne = |y: f32| (y + 8_388_608.0) - 8_388_608.0;
    let a = x.abs().min(E2M1_MAX);
    let code = if a < 2.0 {
        rne(2.0 * a)
    } else if a < 4.0 {
        4.0 + rne(a - 2.0)
    } else {
        6.0 + rne((a - 4.0) * 0.5)
    } as u8;
    if code != 0 && x.is_sign_negative() {
        code | 8
    } else {
        code
    }
}

/// The largest magnitude in `block` (0 when empty).
pub fn amax(block: &[f32]) -> f32 {
    block.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// The E8M0 byte of an FP8 block's scale (from its amax, floor 1e-4).
pub fn fp8_block_scale(block: &[f32]) -> u8 {
    pow2_scale_byte(amax(block), FP8_AMAX_FLOOR, E4M3_MAX)
}

/// The E8M0 byte of an FP4 block's scale (from its amax).
pub fn fp4_block_scale(block: &[f32]) -> u8 {
    pow2_scale_byte(amax(block), FP4_AMAX_FLOOR, E2M1_MAX)
}

/// FP8 e4m3 round trip of `x` in blocks of `block` (the last one may be shorter: V4's real
/// widths are whole blocks, the tiny test models' are not, and a short block is quantised
/// with its own amax like any other).
pub fn fp8_round_trip(x: &mut [f32], block: usize) {
    fp8_round_trip_floored(x, block, FP8_AMAX_FLOOR);
}

/// The amax floor of MXFP8 activations: FlashInfer's `mxfp8_quantize` has none (an all-zero
/// block quantises to zeros), which the smallest normal scale reproduces for every block.
pub const MXFP8_AMAX_FLOOR: f32 = E4M3_MAX * f32::MIN_POSITIVE;
/// Block width of MXFP8 (and of DeepSeek-V4.1's FP8 cache records).
pub const MX_BLOCK: usize = 32;

/// MXFP8 round trip of `x`: FP8 e4m3 in 32-blocks with power-of-two scales and no amax floor
/// (the last block may be shorter).
pub fn mxfp8_round_trip(x: &mut [f32]) {
    fp8_round_trip_floored(x, MX_BLOCK, MXFP8_AMAX_FLOOR);
}

fn fp8_round_trip_floored(x: &mut [f32], block: usize, floor: f32) {
    for b in x.chunks_mut(block) {
        fp8_round_piece(b, amax(b), floor);
    }
}

/// FP8 round trip of `piece`, part of a block whose amax (over every part) is `amax`: how
/// a block split over ranks rounds, each rank its part, once the amax is shared.
pub fn fp8_round_piece(piece: &mut [f32], amax: f32, floor: f32) {
    let s = e8m0_to_f32(pow2_scale_byte(amax, floor, E4M3_MAX));
    for v in piece {
        // `/ s` and `· s` are exact (s is a power of two); only the e4m3 cast rounds.
        *v = e4m3_to_f32(f32_to_e4m3(*v / s)) * s;
    }
}

/// FP4 e2m1 round trip of `x` in blocks of `block` (the last one may be shorter).
pub fn fp4_round_trip(x: &mut [f32], block: usize) {
    for b in x.chunks_mut(block) {
        let s = e8m0_to_f32(fp4_block_scale(b));
        for v in b {
            *v = e2m1_to_f32(f32_to_e2m1(*v / s)) * s;
        }
    }
}

/// The orthonormal Walsh–Hadamard transform of `x` in place, `H x / sqrt(n)` with Sylvester's
/// `H[i][j] = (-1)^popcount(i & j)`: the butterflies below produce exactly that order.
///
/// # Panics
/// If `x.len()` is not a power of two (callers check the width when the model loads).
pub fn hadamard(x: &mut [f32]) {
    let n = x.len();
    assert!(
        n.is_power_of_two(),
        "Hadamard width {n} is not a power of two"
    );
    let mut h = 1;
    while h < n {
        for block in x.chunks_exact_mut(2 * h) {
            let (a, b) = block.split_at_mut(h);
            for (u, v) in a.iter_mut().zip(b.iter_mut()) {
                let (p, q) = (*u, *v);
                *u = p + q;
                *v = p - q;
            }
        }
        h *= 2;
    }
    // n^-½ formed in f64 and rounded once, as the reference's Python float scale is.
    let scale = (n as f64).powf(-0.5) as f32;
    x.iter_mut().for_each(|v| *v *= scale);
}

#[cfg(test)]
mod tests;
