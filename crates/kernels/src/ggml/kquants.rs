//! ggml's K-quants: 256-element super-blocks (`dequantize_row_q2_K` … `_q6_K` in
//! `ggml/src/ggml-quants.c` of llama.cpp 0c1e570). A super-block has an f16 scale `d`
//! (and, for the formats with offsets, an f16 `dmin`) and 16 or 8 sub-blocks, each with a
//! small integer scale (and offset) of its own; a value is `d · sc · q − dmin · m`, the
//! products rounded in the order ggml writes them.

use super::half;
use super::legacy::IQ4_NL_VALUES;

/// Inputs per super-block (`QK_K`).
pub const QK_K: usize = 256;

/// `Q2_K`: 16 scale bytes (low nibble the sub-block's scale, high its offset), 64 bytes of
/// 2-bit codes, `d`, `dmin`. Per 128 values, four 2-bit planes of 32 code bytes; each plane
/// is two sub-blocks of 16.
pub fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, min) = (half(b, 80), half(b, 82));
    let mut out = y.chunks_exact_mut(16);
    for (half_no, q) in qs.chunks_exact(32).enumerate() {
        for plane in 0..4 {
            for part in 0..2 {
                let sc = scales[half_no * 8 + plane * 2 + part];
                let (dl, ml) = (d * (sc & 0xF) as f32, min * (sc >> 4) as f32);
                let o = out.next().expect("16 sub-blocks of 16");
                for (v, &c) in o.iter_mut().zip(&q[16 * part..16 * part + 16]) {
                    *v = dl * ((c >> (2 * plane)) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// `Q3_K`'s 16 six-bit sub-block scales, unpacked from its 12 bytes (the low four bits of
/// each in the first 8 bytes' nibbles, the high two in the last 4 bytes' bit pairs), each
/// less 32.
pub(super) fn q3_k_scales(s: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i32 - 32;
    }
    out
}

/// `Q3_K`: 32 bytes of high bits (`hmask`), 64 bytes of 2-bit codes, 12 bytes of scales,
/// `d`. A code is its two low bits, less 4 where its `hmask` bit is clear; the planes as in
/// [`q2_k`], plane `p` of half `h` taking `hmask` bit `4h + p`.
pub fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs) = (&b[..32], &b[32..96]);
    let scales = q3_k_scales(&b[96..108]);
    let d = half(b, 108);
    let mut out = y.chunks_exact_mut(16);
    for (half_no, q) in qs.chunks_exact(32).enumerate() {
        for plane in 0..4 {
            let bit = 1u8 << (4 * half_no + plane);
            for part in 0..2 {
                let dl = d * scales[half_no * 8 + plane * 2 + part] as f32;
                let o = out.next().expect("16 sub-blocks of 16");
                for (l, v) in o.iter_mut().enumerate() {
                    let i = 16 * part + l;
                    let low = ((q[i] >> (2 * plane)) & 3) as i32;
                    let sub = if hmask[i] & bit != 0 { 0 } else { 4 };
                    *v = dl * (low - sub) as f32;
                }
            }
        }
    }
}

/// Sub-block `j`'s six-bit scale and offset in the 12 scale bytes of `Q4_K` and `Q5_K`
/// (`get_scale_min_k4`): the first four whole in bytes 0–7, the last four split into
/// nibbles of bytes 8–11 and the top bit pairs of bytes 0–7.
pub(super) fn scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// `Q4_K` and `Q5_K`: per 64 values, sub-blocks `2i` (low nibbles of 32 code bytes) and
/// `2i + 1` (their high nibbles); `high(i, l, upper)` gives the fifth bit's value (0 or 16).
fn q45_k(b: &[u8], qs: &[u8], y: &mut [f32], high: impl Fn(usize, usize, bool) -> u8) {
    let (d, min) = (half(b, 0), half(b, 2));
    let scales = &b[4..16];
    for (i, (q, o)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (lo_out, hi_out) = o.split_at_mut(32);
        for (upper, out) in [(false, lo_out), (true, hi_out)] {
            let (sc, m) = scale_min(2 * i + upper as usize, scales);
            let (dl, ml) = (d * sc as f32, min * m as f32);
            for (l, v) in out.iter_mut().enumerate() {
                let nib = if upper { q[l] >> 4 } else { q[l] & 0xF };
                *v = dl * (nib + high(i, l, upper)) as f32 - ml;
            }
        }
    }
}

/// `Q4_K`: `d`, `dmin`, 12 bytes of scales, 128 bytes of 4-bit codes.
pub fn q4_k(b: &[u8], y: &mut [f32]) {
    q45_k(b, &b[16..144], y, |_, _, _| 0);
}

/// `Q5_K`: as `Q4_K`, with 32 bytes of fifth bits before the codes: value `l` of sub-block
/// `s` takes bit `s` of byte `l`.
pub fn q5_k(b: &[u8], y: &mut [f32]) {
    let qh = &b[16..48];
    q45_k(b, &b[48..176], y, |i, l, upper| {
        ((qh[l] >> (2 * i + upper as usize)) & 1) << 4
    });
}

/// `Q6_K`: 128 bytes of low nibbles, 64 of high bit pairs, 16 signed scales, `d`. Per 128
/// values, four groups of 32: group `g` takes the low (g < 2) or high nibble of `ql` bytes
/// `32 (g mod 2) + l` and bit pair `g` of `qh` byte `l`; a code is less 32, a scale covers 16.
pub fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
    let d = half(b, 208);
    for (n, o) in y.chunks_exact_mut(128).enumerate() {
        let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
        for (g, out) in o.chunks_exact_mut(32).enumerate() {
            for (l, v) in out.iter_mut().enumerate() {
                let byte = ql[32 * (g % 2) + l];
                let nib = if g < 2 { byte & 0xF } else { byte >> 4 };
                let q = (nib | (((qh[l] >> (2 * g)) & 3) << 4)) as i32 - 32;
                *v = d * sc[l / 16 + 2 * g] as i8 as f32 * q as f32;
            }
        }
    }
}

/// `IQ4_XS`: `d`, a 16-bit word and 4 bytes of six-bit scales (sub-block `i`'s low four bits
/// in nibble `i mod 2` of byte `i / 2`, its high two in bit pair `i` of the word), then per
/// 32 values 16 bytes of `IQ4_NL` codes laid out as that format's blocks; a value is
/// `d · (scale − 32) · IQ4_NL_VALUES[code]`.
pub fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let high = u16::from_le_bytes([b[2], b[3]]);
    for (i, (qs, o)) in b[8..136]
        .chunks_exact(16)
        .zip(y.chunks_exact_mut(32))
        .enumerate()
    {
        let low = (b[4 + i / 2] >> (4 * (i % 2))) & 0xF;
        let ls = (low as i32) | ((((high >> (2 * i)) & 3) as i32) << 4);
        let dl = d * (ls - 32) as f32;
        for (j, &q) in qs.iter().enumerate() {
            o[j] = dl * IQ4_NL_VALUES[(q & 0xF) as usize] as f32;
            o[j + 16] = dl * IQ4_NL_VALUES[(q >> 4) as usize] as f32;
        }
    }
}
