//! Exact scalar codecs for the number formats found in DeepSeek-V4 checkpoints.
//!
//! Every decode here is exact in f32 (each format is a subset of f32), so dequantising a weight
//! with these functions reproduces the reference's values bit for bit; only summation order can
//! differ downstream. Encoders round to nearest, ties to even, as the reference kernels do.

use half::{bf16, f16};

/// Builds one E4M3FN value from its bit fields without floating-point arithmetic, so the
/// table below is exact and usable in `const` context.
const fn e4m3_bits_to_f32(b: u8) -> f32 {
    let sign = ((b as u32) >> 7) << 31;
    let exp = ((b >> 3) & 0xF) as u32;
    let man = (b & 0x7) as u32;
    if exp == 0xF && man == 0x7 {
        return f32::from_bits(sign | 0x7FC0_0000);
    }
    if exp == 0 {
        // Subnormal: man * 2^-9. Normalise into an f32 normal by hand.
        if man == 0 {
            return f32::from_bits(sign);
        }
        // Position of the leading one in the 3-bit mantissa (0, 1 or 2).
        let lead = 31 - man.leading_zeros();
        let f32_exp = (lead as i32 - 9 + 127) as u32;
        let frac = (man & !(1 << lead)) << (23 - lead);
        return f32::from_bits(sign | (f32_exp << 23) | frac);
    }
    f32::from_bits(sign | ((exp + 127 - 7) << 23) | (man << 20))
}

const fn build_e4m3_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_bits_to_f32(i as u8);
        i += 1;
    }
    t
}

/// A table because weight dequantisation decodes billions of these bytes.
static E4M3_TABLE: [f32; 256] = build_e4m3_table();

/// Decodes FP8 E4M3FN (bias 7, subnormals, no infinities; `0x7F`/`0xFF` are NaN, max ±448).
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    E4M3_TABLE[b as usize]
}

/// Largest finite E4M3FN magnitude; inputs beyond it saturate rather than become NaN, matching
/// the reference's clamp-then-cast.
pub const E4M3_MAX: f32 = 448.0;

/// Encodes to FP8 E4M3FN: clamps to ±448 (so ±inf saturate), rounds to nearest even,
/// maps NaN to `0x7F`. The sign of zero is kept.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs().min(E4M3_MAX);
    // Below the smallest normal (2^-6) the grid is uniform with step 2^-9; the scaled value is
    // exact in f32, and a result of 8 is exactly the code of 2^-6 (exponent 1, mantissa 0).
    if a < 1.0 / 64.0 {
        let q = (a * 512.0).round_ties_even() as u8;
        return sign | q;
    }
    let bits = a.to_bits();
    let mut exp = ((bits >> 23) & 0xFF) as i32 - 127;
    let frac = bits & 0x7F_FFFF;
    let mut keep = frac >> 20;
    let rem = frac & 0xF_FFFF;
    const HALF: u32 = 0x8_0000;
    if rem > HALF || (rem == HALF && keep & 1 == 1) {
        keep += 1;
        if keep == 8 {
            keep = 0;
            exp += 1;
        }
    }
    // After the clamp the largest result is 448 = exponent 15, mantissa 6: never the NaN code.
    sign | (((exp + 7) as u8) << 3) | keep as u8
}

/// Decodes an unsigned E8M0 scale byte, `2^(b-127)`; 255 is NaN. `b = 0` is the f32 subnormal
/// 2^-127, built from its bits because `powi`-style arithmetic may flush or round it.
#[inline]
pub fn e8m0_to_f32(b: u8) -> f32 {
    match b {
        255 => f32::NAN,
        0 => f32::from_bits(0x0040_0000),
        _ => f32::from_bits((b as u32) << 23),
    }
}

/// The E8M0 byte of `s` if `s` is exactly a power of two in E8M0's range (or NaN → 255).
pub fn f32_to_e8m0(s: f32) -> Option<u8> {
    if s.is_nan() {
        return Some(255);
    }
    let bits = s.to_bits();
    match bits {
        0x0040_0000 => Some(0),
        _ if bits & 0x807F_FFFF == 0 && bits >> 23 != 0 && bits >> 23 != 255 => {
            Some((bits >> 23) as u8)
        }
        _ => None,
    }
}

const E2M1_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Decodes a 4-bit FP4 E2M1 code (bit 3 = sign); only the low nibble of `code` is read.
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    let m = E2M1_MAGNITUDES[(code & 0x7) as usize];
    if code & 0x8 != 0 {
        -m
    } else {
        m
    }
}

/// Decodes a packed FP4 row without its scale. The low nibble is the earlier element
/// (element 2k), as in the reference's `float4_e2m1fn_x2` storage and HF's `_unpack_fp4`.
///
/// # Panics
/// If `out.len() != 2 * packed.len()`: callers size both from the same tensor shape, so a
/// mismatch is a programming error, not bad input.
pub fn unpack_fp4_row(packed: &[u8], out: &mut [f32]) {
    assert_eq!(
        out.len(),
        2 * packed.len(),
        "unpack_fp4_row: output must hold two values per packed byte"
    );
    for (pair, &b) in out.chunks_exact_mut(2).zip(packed) {
        pair[0] = e2m1_to_f32(b & 0xF);
        pair[1] = e2m1_to_f32(b >> 4);
    }
}

/// Decodes bfloat16 bits (exact: bf16 is the top half of an f32).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    bf16::from_bits(bits).to_f32()
}

/// Decodes IEEE half bits (exact).
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// Rounds to bfloat16, nearest even, the rounding every "bf16" step in the references uses.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent E4M3FN decode from the bit fields in f64 arithmetic.
    fn e4m3_reference(b: u8) -> f64 {
        let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let exp = ((b >> 3) & 0xF) as i32;
        let man = (b & 0x7) as f64;
        if exp == 15 && man == 7.0 {
            return f64::NAN;
        }
        if exp == 0 {
            sign * (man / 8.0) * 2f64.powi(-6)
        } else {
            sign * (1.0 + man / 8.0) * 2f64.powi(exp - 7)
        }
    }

    #[test]
    fn e8m0_encodes_exactly_its_own_values() {
        for b in 0..=255u8 {
            assert_eq!(f32_to_e8m0(e8m0_to_f32(b)), Some(b), "byte {b}");
        }
        for s in [0.0f32, -1.0, 0.75, 3.0, f32::INFINITY, 2f32.powi(-128)] {
            assert_eq!(f32_to_e8m0(s), None, "{s}");
        }
    }

    #[test]
    fn e4m3_decodes_every_byte() {
        for b in 0..=255u8 {
            let got = e4m3_to_f32(b);
            let want = e4m3_reference(b);
            if want.is_nan() {
                assert!(got.is_nan(), "byte {b:#04x} should be NaN, got {got}");
                assert!(b == 0x7F || b == 0xFF);
            } else {
                assert_eq!(got as f64, want, "byte {b:#04x}");
                assert_eq!(got.is_sign_negative(), b & 0x80 != 0, "sign of {b:#04x}");
            }
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0x38), 1.0);
    }

    #[test]
    fn e4m3_round_trips_every_finite_byte() {
        for b in 0..=255u8 {
            if b == 0x7F || b == 0xFF {
                continue;
            }
            assert_eq!(f32_to_e4m3(e4m3_to_f32(b)), b, "byte {b:#04x}");
        }
    }

    #[test]
    fn e4m3_rounds_midpoints_to_even_and_neighbours_to_nearest() {
        // Walk the positive grid; the midpoint of each pair of neighbours must go to the code
        // with an even mantissa, and values a hair either side to the nearer code.
        for b in 0u8..0x7E {
            let lo = e4m3_to_f32(b) as f64;
            let hi = e4m3_to_f32(b + 1) as f64;
            let mid = ((lo + hi) / 2.0) as f32;
            assert_eq!(mid as f64, (lo + hi) / 2.0, "midpoint exact in f32");
            let even = if b % 2 == 0 { b } else { b + 1 };
            assert_eq!(
                f32_to_e4m3(mid),
                even,
                "midpoint of {b:#04x}/{:#04x}",
                b + 1
            );
            assert_eq!(
                f32_to_e4m3(-mid),
                even | 0x80,
                "negative midpoint of {b:#04x}"
            );
            let below = f32::from_bits(mid.to_bits() - 1);
            let above = f32::from_bits(mid.to_bits() + 1);
            assert_eq!(f32_to_e4m3(below), b, "just below midpoint of {b:#04x}");
            assert_eq!(f32_to_e4m3(above), b + 1, "just above midpoint of {b:#04x}");
        }
        // Hand-picked ties: 1.0625 lies between 1.0 (m=0) and 1.125 (m=1) -> 1.0;
        // 1.1875 between 1.125 (m=1) and 1.25 (m=2) -> 1.25.
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.0625)), 1.0);
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.1875)), 1.25);
        // Subnormal ties: 2^-10 -> 0, 3*2^-10 -> 2^-8, 15*2^-10 -> 2^-6 (crosses into normals).
        assert_eq!(f32_to_e4m3(2f32.powi(-10)), 0x00);
        assert_eq!(
            e4m3_to_f32(f32_to_e4m3(3.0 * 2f32.powi(-10))),
            2f32.powi(-8)
        );
        assert_eq!(f32_to_e4m3(15.0 * 2f32.powi(-10)), 0x08);
        // Tiny negatives keep their sign as negative zero.
        assert_eq!(f32_to_e4m3(-1e-30), 0x80);
    }

    #[test]
    fn e4m3_clamps_and_maps_nan() {
        assert_eq!(f32_to_e4m3(448.0), 0x7E);
        assert_eq!(f32_to_e4m3(464.0), 0x7E, "tie above max clamps, never NaN");
        assert_eq!(f32_to_e4m3(500.0), 0x7E);
        assert_eq!(f32_to_e4m3(1e30), 0x7E);
        assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7E);
        assert_eq!(f32_to_e4m3(-1e9), 0xFE);
        assert_eq!(f32_to_e4m3(f32::NEG_INFINITY), 0xFE);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7F);
        assert_eq!(f32_to_e4m3(0.0), 0x00);
        assert_eq!(f32_to_e4m3(-0.0), 0x80);
        // 432 is the midpoint of 416 (m=5) and 448 (m=6): even mantissa wins.
        assert_eq!(f32_to_e4m3(432.0), 0x7E);
        assert_eq!(f32_to_e4m3(430.0), 0x7D);
    }

    #[test]
    fn e8m0_decodes_every_byte() {
        for b in 0..=255u8 {
            let got = e8m0_to_f32(b);
            if b == 255 {
                assert!(got.is_nan());
                continue;
            }
            let want = 2f64.powi(b as i32 - 127);
            assert_eq!(got as f64, want, "byte {b}");
        }
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_to_f32(0).to_bits(), 0x0040_0000);
        assert!(e8m0_to_f32(0).is_subnormal());
        assert_eq!(e8m0_to_f32(254), 2f32.powi(127));
    }

    #[test]
    fn e2m1_decodes_every_code() {
        for code in 0..16u8 {
            let sign = if code & 8 != 0 { -1.0 } else { 1.0 };
            let exp = ((code >> 1) & 3) as i32;
            let man = (code & 1) as f64;
            let want = if exp == 0 {
                sign * man * 0.5
            } else {
                sign * (1.0 + man / 2.0) * 2f64.powi(exp - 1)
            };
            assert_eq!(e2m1_to_f32(code) as f64, want, "code {code}");
        }
        let all: Vec<f32> = (0..8).map(e2m1_to_f32).collect();
        assert_eq!(all, [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]);
        assert_eq!(e2m1_to_f32(0xF), -6.0);
        assert!(e2m1_to_f32(0x8).is_sign_negative(), "code 8 is -0");
    }

    #[test]
    fn fp4_low_nibble_is_the_earlier_element() {
        // 0x72: low nibble 2 (1.0) is element 0, high nibble 7 (6.0) is element 1.
        // 0xB9: low 9 (-0.5), high 0xB (-1.5).
        let mut out = [0.0f32; 4];
        unpack_fp4_row(&[0x72, 0xB9], &mut out);
        assert_eq!(out, [1.0, 6.0, -0.5, -1.5]);
    }

    #[test]
    #[should_panic(expected = "two values per packed byte")]
    fn fp4_unpack_rejects_wrong_output_length() {
        let mut out = [0.0f32; 3];
        unpack_fp4_row(&[0x11, 0x22], &mut out);
    }

    #[test]
    fn bf16_and_f16_conversions() {
        assert_eq!(bf16_to_f32(0x3F80), 1.0);
        assert_eq!(bf16_to_f32(0xC000), -2.0);
        assert_eq!(bf16_to_f32(0x0001), f32::from_bits(0x0001_0000));
        assert!(bf16_to_f32(0x7FC0).is_nan());
        assert_eq!(f16_to_f32(0x3C00), 1.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0xFBFF), -65504.0);
        assert_eq!(f32_to_bf16(1.0), 0x3F80);
        // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3F80);
        // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82);
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 0x3F81);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    }
}
