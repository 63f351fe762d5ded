//! ggml's lattice formats IQ1_S … IQ3_S (`dequantize_row_iq2_xxs` … `_iq1_m` in
//! `ggml/src/ggml-quants.c` of llama.cpp 0c1e570): 256-element super-blocks where each
//! group of 8 weights (IQ3: two groups of 4) is a point of a fixed grid ([`grids`]), with
//! signs (IQ2/IQ3: seven bits and their parity) or a shift (IQ1: `±1/8`), and a small
//! integer scale per 32 (or 16) weights on the super-block's f16 `d`. The products and
//! their order are ggml's: a group's scale `db` is formed first, then `db · point · sign`.

use super::grids::{grids, signs};
use super::{half, word};

fn u16_at(b: &[u8], at: usize) -> u32 {
    u16::from_le_bytes([b[at], b[at + 1]]) as u32
}

/// Group `ib` (of 8) of an IQ2_XXS block: its four grid indices (a byte each) and the word
/// of four 7-bit sign groups under its 4-bit scale. The decode and the integer products
/// ([`super::kdot`]) read a block through this.
#[inline(always)]
pub fn iq2_xxs_group(b: &[u8], ib: usize) -> (u32, u32) {
    (word(b, 2 + 8 * ib), word(b, 6 + 8 * ib))
}

/// Writes `db · point · (−1 where sign bit j is set)` for one point.
#[inline(always)]
fn signed(y: &mut [f32], db: f32, point: &[i8], signs: u8) {
    for (j, (o, &p)) in y.iter_mut().zip(point).enumerate() {
        let v = db * p as f32;
        *o = if signs & (1 << j) != 0 { -v } else { v };
    }
}

/// `IQ2_XXS` (66 bytes): `d`, then per 32 weights two words: four 8-bit indices into
/// `iq2xxs_grid`, and four 7-bit sign groups under a 4-bit scale `s`;
/// `db = d · (½ + s) · ¼`.
pub fn iq2_xxs(b: &[u8], y: &mut [f32]) {
    let (d, grid) = (half(b, 0), &grids().iq2xxs);
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let (idx, sg) = iq2_xxs_group(b, ib);
        let db = d * (0.5 + (sg >> 28) as f32) * 0.25;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let point = grid.point(((idx >> (8 * l)) & 0xFF) as usize);
            signed(y, db, &point, signs(sg >> (7 * l)));
        }
    }
}

/// `IQ2_XS` (74 bytes): `d`, 32 16-bit codes (a 9-bit `iq2xs_grid` index, 7 sign bits),
/// 8 scale bytes whose nibbles scale 16 weights each; `db = d · (½ + s) · ¼`.
pub fn iq2_xs(b: &[u8], y: &mut [f32]) {
    let (d, grid) = (half(b, 0), &grids().iq2xs);
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let sc = b[66 + ib] as u32;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let db = d * (0.5 + ((sc >> (4 * (l / 2))) & 0xF) as f32) * 0.25;
            let q = u16_at(b, 2 + 2 * (4 * ib + l));
            signed(y, db, &grid.point((q & 511) as usize), signs(q >> 9));
        }
    }
}

/// `IQ2_S` (82 bytes): `d`, 32 index bytes, 32 sign bytes, 8 bytes holding the indices'
/// 2 high bits (`iq2s_grid` has 1024 points), 8 scale bytes as `IQ2_XS`'s.
pub fn iq2_s(b: &[u8], y: &mut [f32]) {
    let (d, grid) = (half(b, 0), &grids().iq2s);
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let (sc, qh) = (b[74 + ib] as usize, b[66 + ib] as usize);
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let db = d * (0.5 + ((sc >> (4 * (l / 2))) & 0xF) as f32) * 0.25;
            let i = b[2 + 4 * ib + l] as usize | ((qh << (8 - 2 * l)) & 0x300);
            signed(y, db, &grid.point(i), b[34 + 4 * ib + l]);
        }
    }
}

/// `IQ3_XXS` (98 bytes): `d`, 64 index bytes into `iq3xxs_grid` (points of 4), then per 32
/// weights a word of four 7-bit sign groups under a 4-bit scale; `db = d · (½ + s) · ½`.
pub fn iq3_xxs(b: &[u8], y: &mut [f32]) {
    let (d, grid) = (half(b, 0), &grids().iq3xxs);
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let sg = word(b, 66 + 4 * ib);
        let db = d * (0.5 + (sg >> 28) as f32) * 0.5;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let s = signs(sg >> (7 * l));
            let q = &b[2 + 8 * ib + 2 * l..];
            signed(&mut y[..4], db, &grid.point(q[0] as usize), s);
            signed(&mut y[4..], db, &grid.point(q[1] as usize), s >> 4);
        }
    }
}

/// `IQ3_S` (110 bytes): `d`, 64 index bytes, 8 bytes of their ninth bits (`iq3s_grid` has
/// 512 points of 4), 32 sign bytes, 4 scale bytes whose nibbles scale 32 weights each;
/// `db = d · (1 + 2s)`.
pub fn iq3_s(b: &[u8], y: &mut [f32]) {
    let (d, grid) = (half(b, 0), &grids().iq3s);
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let db = d * (1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 0xF) as i32) as f32;
        let qh = b[66 + ib] as usize;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let q = &b[2 + 8 * ib + 2 * l..];
            let i1 = q[0] as usize | ((qh << (8 - 2 * l)) & 256);
            let i2 = q[1] as usize | ((qh << (7 - 2 * l)) & 256);
            let s = b[74 + 4 * ib + l];
            signed(&mut y[..4], db, &grid.point(i1), s);
            signed(&mut y[4..], db, &grid.point(i2), s >> 4);
        }
    }
}

/// `dl · (point + delta)` for one `iq1s_grid` point (values −1, 0, 1).
#[inline(always)]
fn shifted(y: &mut [f32], dl: f32, point: &[i8], delta: f32) {
    for (o, &p) in y.iter_mut().zip(point) {
        *o = dl * (p as f32 + delta);
    }
}

/// ggml's `IQ1S_DELTA` (= `IQ1M_DELTA`): the shift of a group's points.
const DELTA: f32 = 0.125;

/// `IQ1_S` (50 bytes): `d`, 32 index bytes (low 8 of 11 bits), then per 32 weights a 16-bit
/// word: the 3 high bits of its four indices, a 3-bit scale `s` and the shift's sign;
/// `dl = d · (2s + 1)`.
pub fn iq1_s(b: &[u8], y: &mut [f32]) {
    let (d, grid) = (half(b, 0), &grids().iq1s);
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let qh = u16_at(b, 34 + 2 * ib);
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = if qh & 0x8000 != 0 { -DELTA } else { DELTA };
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let i = b[2 + 4 * ib + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8);
            shifted(y, dl, &grid.point(i), delta);
        }
    }
}

/// `IQ1_M` (56 bytes, no `d` field): 32 index bytes, 16 bytes of high index bits and shift
/// signs (a nibble per group of 8), 8 scale bytes read as four 16-bit words: 3-bit scales
/// per 16 weights in their low 12 bits, and `d`'s f16 bits in their top nibbles.
pub fn iq1_m(b: &[u8], y: &mut [f32]) {
    let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000);
    let d = crate::formats::f16_to_f32(bits as u16);
    let grid = &grids().iq1s;
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let s = sc[ib / 2] >> (6 * (ib % 2));
        let dl = [
            d * (2 * (s & 7) + 1) as f32,
            d * (2 * ((s >> 3) & 7) + 1) as f32,
        ];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let qh = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) as usize;
            let i = b[4 * ib + l] as usize | ((qh & 7) << 8);
            let delta = if qh & 8 != 0 { -DELTA } else { DELTA };
            shifted(y, dl[l / 2], &grid.point(i), delta);
        }
    }
}

/// Writes `d` (f16 bits) where `IQ1_M` keeps it, the top nibbles of its scale words.
pub fn iq1_m_set_scale(b: &mut [u8], d: u16) {
    for w in 0..4 {
        let at = 48 + 2 * w;
        let word = u16::from_le_bytes([b[at], b[at + 1]]);
        let word = (word & 0x0FFF) | (((d >> (4 * w)) & 0xF) << 12);
        b[at..at + 2].copy_from_slice(&word.to_le_bytes());
    }
}
