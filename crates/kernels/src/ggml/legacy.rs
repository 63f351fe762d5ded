//! ggml's 32-element blocks of 4- and 5-bit codes (`dequantize_row_q4_0`, `_q4_1`, `_q5_0`,
//! `_q5_1`, `_iq4_nl` in `ggml/src/ggml-quants.c` of llama.cpp 0c1e570). Each block's
//! element `j < 16` is the low nibble of code byte `j`, element `j + 16` its high nibble;
//! the 5-bit formats keep the fifth bits in a little-endian 32-bit word, bit `j` for
//! element `j`.

use super::{half, word};

/// `kvalues_iq4nl`: the 16 levels an `IQ4_NL` code picks, in units of the block's scale.
pub const IQ4_NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 32 unsigned codes of a block: nibbles of `qs` (16 bytes), fifth bits from `qh`.
#[inline(always)]
fn codes(qs: &[u8], qh: u32) -> [u8; 32] {
    let mut c = [0u8; 32];
    for j in 0..16 {
        c[j] = (qs[j] & 0xF) | (((qh >> j) & 1) << 4) as u8;
        c[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
    }
    c
}

/// `Q4_0`: `d`, 16 code bytes; `x = (c - 8) · d`.
pub fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (o, c) in y.iter_mut().zip(codes(&b[2..18], 0)) {
        *o = (c as i32 - 8) as f32 * d;
    }
}

/// `Q4_1`: `d`, `m`, 16 code bytes; `x = c · d + m`.
pub fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    for (o, c) in y.iter_mut().zip(codes(&b[4..20], 0)) {
        *o = c as f32 * d + m;
    }
}

/// `Q5_0`: `d`, the fifth bits, 16 code bytes; `x = (c - 16) · d`.
pub fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (o, c) in y.iter_mut().zip(codes(&b[6..22], word(b, 2))) {
        *o = (c as i32 - 16) as f32 * d;
    }
}

/// `Q5_1`: `d`, `m`, the fifth bits, 16 code bytes; `x = c · d + m`.
pub fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    for (o, c) in y.iter_mut().zip(codes(&b[8..24], word(b, 4))) {
        *o = c as f32 * d + m;
    }
}

/// `IQ4_NL`: `d`, 16 code bytes; `x = d · IQ4_NL_VALUES[c]`.
pub fn iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (o, c) in y.iter_mut().zip(codes(&b[2..18], 0)) {
        *o = d * IQ4_NL_VALUES[c as usize] as f32;
    }
}
