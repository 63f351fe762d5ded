//! Rounding drawn f32 values onto the checkpoint's storage formats, exactly as DeepSeek's
//! converter does: power-of-two block scales from the block's absolute maximum (stored as
//! E8M0), then round-to-nearest-even onto FP8 e4m3 or FP4 e2m1.

use deepinfer_kernels::formats::{e8m0_to_f32, f32_to_e4m3, E4M3_MAX};

/// FP8 blocks are 128×128 in every shipped V4-Flash/Pro checkpoint.
pub(super) const FP8_BLOCK: usize = 128;
/// FP4 experts carry one scale per 32 inputs of a row.
pub(super) const FP4_GROUP: usize = 32;
const E2M1_MAX: f32 = 6.0;

/// E8M0 byte of `2^ceil(log2(max(amax, floor) / fmt_max))`: the reference's bit trick (bump
/// the exponent when any mantissa bit is set), which a float `log2` can get wrong just above
/// a power of two. The biased f32 exponent of a power of two is exactly its E8M0 byte.
pub(super) fn pow2_scale_byte(amax: f32, floor: f32, fmt_max: f32) -> u8 {
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
pub(super) fn f32_to_e2m1(x: f32) -> u8 {
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

/// Quantises `rows` full rows of a `cols`-wide matrix onto FP8 with one scale per 128×128
/// block. `rows` must cover whole 128-row blocks (the matrix's last block may be short), so
/// callers chunk on block boundaries. Appends the codes and the chunk's scale rows.
pub(super) fn fp8_rows(x: &[f32], cols: usize, codes: &mut Vec<u8>, scales: &mut Vec<u8>) {
    let col_blocks = cols.div_ceil(FP8_BLOCK);
    for block in x.chunks(FP8_BLOCK * cols) {
        let mut amax = vec![0.0f32; col_blocks];
        for row in block.chunks_exact(cols) {
            for (j, &v) in row.iter().enumerate() {
                let a = &mut amax[j / FP8_BLOCK];
                *a = a.max(v.abs());
            }
        }
        let bytes: Vec<u8> = amax
            .iter()
            .map(|&a| pow2_scale_byte(a, 1e-4, E4M3_MAX))
            .collect();
        let inv: Vec<f32> = bytes.iter().map(|&b| 1.0 / e8m0_to_f32(b)).collect();
        for row in block.chunks_exact(cols) {
            codes.extend(
                row.iter()
                    .enumerate()
                    .map(|(j, &v)| f32_to_e4m3(v * inv[j / FP8_BLOCK])),
            );
        }
        scales.extend_from_slice(&bytes);
    }
}

/// Quantises rows of a `cols`-wide matrix onto FP4 with one scale per 32 inputs of a row,
/// packing two codes a byte, element `2k` in the low nibble. Appends codes and scales.
pub(super) fn fp4_rows(x: &[f32], cols: usize, packed: &mut Vec<u8>, scales: &mut Vec<u8>) {
    for row in x.chunks_exact(cols) {
        for group in row.chunks(FP4_GROUP) {
            let amax = group.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let b = pow2_scale_byte(amax, E2M1_MAX * f32::MIN_POSITIVE, E2M1_MAX);
            let inv = 1.0 / e8m0_to_f32(b);
            scales.push(b);
            packed.extend(
                group
                    .chunks_exact(2)
                    .map(|p| f32_to_e2m1(p[0] * inv) | (f32_to_e2m1(p[1] * inv) << 4)),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deepinfer_kernels::formats::e2m1_to_f32;

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
        let b = pow2_scale_byte(0.0, E2M1_MAX * f32::MIN_POSITIVE, E2M1_MAX);
        assert_eq!(e8m0_to_f32(b), f32::MIN_POSITIVE);
    }
}
