//! Activation layouts the fused kernels expect.
//!
//! Decoding a 256-bit load of weights yields vectors whose lanes hold elements in a strided
//! order (that is what makes the decode cheap: shifts on whole registers, no shuffles). The
//! activation row is permuted once per call to the same order, so the products line up; a
//! row is `k` floats, read once per weight row, so its permutation costs nothing measurable.
//! Elements past the last whole chunk stay in place and are handled by the scalar tail.

use crate::matrix::Format;

/// Elements per decoded chunk for vectors of `lanes` f32: four vectors (one weight load for
/// FP8, two for BF16, four f32 loads), eight for FP4.
pub(crate) fn chunk(format: Format, lanes: usize) -> usize {
    match format {
        Format::Fp4 => 8 * lanes,
        _ => 4 * lanes,
    }
}

/// Where element `e` of a chunk goes in the permuted chunk (`l` lanes): the layouts
/// element by element, as the kernels' docs state them (what [`permute_row`] is tested
/// against).
#[cfg(test)]
fn slot(format: Format, l: usize, e: usize) -> usize {
    match format {
        Format::F32 => e,
        // per 2l elements: lane j of the even vector is element 2j, of the odd one 2j + 1
        Format::Bf16 => (e / (2 * l)) * 2 * l + (e % 2) * l + (e % (2 * l)) / 2,
        // vector q lane j is byte 4j + q
        Format::Fp8 => (e % 4) * l + e / 4,
        // AVX-512 (table lookups): per 32 elements, lane j of the even vector is element
        // 2j, of the odd one 2j + 1
        Format::Fp4 if l == 16 => (2 * (e / 32) + e % 2) * l + (e % 32) / 2,
        // AVX2 (through E4M3): lane j of the vector at position p is element 8j + s,
        // s = 2(p mod 4) + p / 4 (the even elements' vectors first): a transpose, rows
        // reordered
        Format::Fp4 => (4 * (e % 2) + (e % 8) / 2) * l + e / 8,
        Format::Ggml(_) => e,
    }
}

/// How a format's lanes interleave, for vectors of `l` lanes: each block of `q · l` elements
/// is an `[l][q]` matrix stored transposed, `[q][l]`, its rows in the order `pos` gives
/// (`slot` per element, as a transpose the compiler can keep in registers).
fn interleave(format: Format, l: usize) -> (usize, fn(usize) -> usize) {
    match format {
        Format::F32 => (1, |q| q),
        Format::Bf16 => (2, |q| q),
        Format::Fp8 => (4, |q| q),
        Format::Fp4 if l == 16 => (2, |q| q),
        Format::Fp4 => (8, |s| 4 * (s % 2) + s / 2),
        // No family has fused kernels for these yet: they run on the scalar path.
        Format::Ggml(_) => (1, |q| q),
    }
}

/// Writes `x` (one activation row) in `format`'s kernel order for `lanes`-wide vectors
/// into `out`, times `mult`.
pub(crate) fn permute_row(format: Format, lanes: usize, x: &[f32], out: &mut [f32], mult: f32) {
    debug_assert_eq!(x.len(), out.len());
    let c = chunk(format, lanes);
    let main = x.len() / c * c;
    let (q, pos) = interleave(format, lanes);
    let block = q * lanes;
    for (src, dst) in x[..main]
        .chunks_exact(block)
        .zip(out[..main].chunks_exact_mut(block))
    {
        for r in 0..q {
            let d = &mut dst[pos(r) * lanes..(pos(r) + 1) * lanes];
            for (j, o) in d.iter_mut().enumerate() {
                *o = src[j * q + r] * mult;
            }
        }
    }
    for (o, &v) in out[main..].iter_mut().zip(&x[main..]) {
        *o = v * mult;
    }
}

/// Elements of a chunk of the kernels on bf16 dot products (AVX-512) for `format`: 128 for
/// FP4 (64 bytes of codes), 64 for BF16 (128 bytes).
pub(crate) fn pairs_chunk(format: Format) -> usize {
    if format == Format::Fp4 {
        128
    } else {
        64
    }
}

/// Packs one activation row `x` for the kernels on bf16 dot products (AVX-512,
/// `x86::avx512::{Fp4Dots, Bf16Dots}`) into `out` (as long as `x`), in chunks of `chunk`
/// elements ([`pairs_chunk`]): slot `chunk/2 · c + 16p + l` holds the bf16 bits of element
/// `e = chunk · c + 64⌊p/2⌋ + 2l + p mod 2` in its high half and of `e + 32` in its low half;
/// past the last whole chunk `x` stays in place (the scalar tail reads it there). Returns
/// false, `out` then unusable, unless every element is exact in bf16 and zero or of
/// magnitude in `[2^-64, 2^64]`, which with the matrices' weights keeps every product and
/// partial sum normal (see `QMatrix::dots_ok`).
pub(crate) fn pack_pairs(x: &[f32], out: &mut [f32], chunk: usize) -> bool {
    debug_assert_eq!(x.len(), out.len());
    debug_assert!(chunk == 64 || chunk == 128);
    let main = x.len() / chunk * chunk;
    let (low, high) = (2f32.powi(-64), 2f32.powi(64));
    let fits = |v: f32| v.to_bits() & 0xFFFF == 0 && (v == 0.0 || (low..=high).contains(&v.abs()));
    if !x[..main].iter().all(|&v| fits(v)) {
        return false;
    }
    for (src, dst) in x[..main]
        .chunks_exact(chunk)
        .zip(out.chunks_exact_mut(chunk / 2))
    {
        for (slot, o) in dst.iter_mut().enumerate() {
            let (p, l) = (slot / 16, slot % 16);
            let e = 64 * (p / 2) + 2 * l + p % 2;
            let (first, second) = (src[e].to_bits(), src[e + 32].to_bits());
            *o = f32::from_bits((first & 0xFFFF_0000) | (second >> 16));
        }
    }
    out[main..].copy_from_slice(&x[main..]);
    true
}

/// Packs one activation row already in a kernel family's f32 layout (`xp`, chunks of four
/// vectors of `lanes`, as [`permute_row`] lays FP8 out, scaled) for that format's kernel on
/// bf16 dot products (`x86::avx512::Fp8Dots`), times `factor` (a power of two): per chunk
/// `c`, slot `2 · lanes · c + lanes · v + l` holds vector `v`'s lane `l` in its high half and
/// vector `v + 2`'s in its low half (the f32 kernel adds vector `v` to stream `v` first);
/// past the last whole chunk `xp` stays as it is. Returns false, `out` then unusable, unless
/// every packed value is exact in bf16 and zero or of magnitude in `[2^-64, 2^64]`.
pub(crate) fn pack_laid_out_pairs(xp: &[f32], out: &mut [f32], lanes: usize, factor: f32) -> bool {
    let chunk = 4 * lanes;
    let main = xp.len() / chunk * chunk;
    let (low, high) = (2f32.powi(-64), 2f32.powi(64));
    let mut fits = true;
    for (src, dst) in xp[..main]
        .chunks_exact(chunk)
        .zip(out.chunks_exact_mut(chunk / 2))
    {
        for (slot, o) in dst.iter_mut().enumerate() {
            let (v, l) = (slot / lanes, slot % lanes);
            let (a, b) = (
                src[v * lanes + l] * factor,
                src[(v + 2) * lanes + l] * factor,
            );
            for x in [a, b] {
                fits &= x.to_bits() & 0xFFFF == 0 && (x == 0.0 || (low..=high).contains(&x.abs()));
            }
            *o = f32::from_bits((a.to_bits() & 0xFFFF_0000) | (b.to_bits() >> 16));
        }
    }
    out[main..].copy_from_slice(&xp[main..]);
    fits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_is_a_permutation_of_its_chunk() {
        for lanes in [8, 16] {
            for f in [Format::F32, Format::Bf16, Format::Fp8, Format::Fp4] {
                let c = chunk(f, lanes);
                let mut seen = vec![false; c];
                for e in 0..c {
                    let s = slot(f, lanes, e);
                    assert!(s < c && !seen[s], "{f:?}/{lanes}: slot {s} twice");
                    seen[s] = true;
                }
            }
        }
        for lanes in [8, 16] {
            for f in [Format::F32, Format::Bf16, Format::Fp8, Format::Fp4] {
                let c = chunk(f, lanes);
                let x: Vec<f32> = (0..3 * c + 5).map(|i| i as f32).collect();
                let mut out = vec![0.0; x.len()];
                permute_row(f, lanes, &x, &mut out, 1.0);
                for (e, &v) in x[..3 * c].iter().enumerate() {
                    let at = (e / c) * c + slot(f, lanes, e % c);
                    assert_eq!(out[at], v, "{f:?}/{lanes}: element {e}");
                }
                assert_eq!(out[3 * c..], x[3 * c..], "{f:?}/{lanes}: the tail stays");
            }
        }
        let x: Vec<f32> = (0..35).map(|i| i as f32).collect();
        let mut out = vec![0.0; 35];
        permute_row(Format::Fp8, 8, &x, &mut out, 2.0);
        assert_eq!(
            &out[..3],
            &[0.0, 8.0, 16.0],
            "vector 0 holds bytes 0, 4, 8, …"
        );
        assert_eq!(out[8], 2.0, "vector 1 starts with byte 1");
        assert_eq!(&out[32..], &[64.0, 66.0, 68.0], "the tail stays in order");
    }

    #[test]
    fn fp4_pairs_hold_each_element_once_and_refuse_what_is_not_exact() {
        let x: Vec<f32> = (0..300).map(|i| (i as f32 - 150.0) * 0.25).collect();
        let mut out = vec![0.0; 300];
        assert!(pack_pairs(&x, &mut out, 128));
        let mut seen = vec![false; 256];
        for (slot, v) in out[..128].iter().enumerate() {
            let (c, s) = (slot / 64, slot % 64);
            let (p, l) = (s / 16, s % 16);
            let e = 128 * c + 64 * (p / 2) + 2 * l + p % 2;
            let bits = v.to_bits();
            assert_eq!(f32::from_bits(bits & 0xFFFF_0000), x[e]);
            assert_eq!(f32::from_bits(bits << 16), x[e + 32]);
            seen[e] = true;
            seen[e + 32] = true;
        }
        assert!(seen.iter().all(|&s| s), "every element of the two chunks");
        assert_eq!(out[256..], x[256..], "the tail stays");
        for bad in [1.0 + f32::EPSILON, 1e-30, 1e30, f32::NAN] {
            let mut y = x.clone();
            y[7] = bad;
            assert!(!pack_pairs(&y, &mut out, 128), "{bad}");
        }
        // Not exact past the last chunk is fine: the tail is multiplied in f32.
        let mut y = x.clone();
        y[299] = 1.0 + f32::EPSILON;
        assert!(pack_pairs(&y, &mut out, 128));
    }

    #[test]
    fn laid_out_pairs_take_vectors_v_and_v_plus_2() {
        let xp: Vec<f32> = (0..70).map(|i| i as f32 * 4.0).collect();
        let mut out = vec![0.0; 70];
        assert!(pack_laid_out_pairs(&xp, &mut out, 16, 0.25));
        for (slot, v) in out[..32].iter().enumerate() {
            let (vec, l) = (slot / 16, slot % 16);
            assert_eq!(
                f32::from_bits(v.to_bits() & 0xFFFF_0000),
                (16 * vec + l) as f32
            );
            assert_eq!(
                f32::from_bits(v.to_bits() << 16),
                (16 * (vec + 2) + l) as f32
            );
        }
        assert_eq!(out[64..], xp[64..], "the tail stays, unscaled");
        let mut bad = xp.clone();
        bad[5] = 1.0 + f32::EPSILON;
        assert!(!pack_laid_out_pairs(&bad, &mut out, 16, 1.0));
    }

    #[test]
    fn bf16_pairs_are_the_fp4_layout_in_chunks_of_64() {
        let x: Vec<f32> = (0..200).map(|i| (i as f32 - 90.0) * 0.5).collect();
        let mut out = vec![0.0; 200];
        assert!(pack_pairs(&x, &mut out, 64));
        for (slot, v) in out[..96].iter().enumerate() {
            let (c, p, l) = (slot / 32, slot % 32 / 16, slot % 16);
            let e = 64 * c + 2 * l + p;
            assert_eq!(
                f32::from_bits(v.to_bits() & 0xFFFF_0000),
                x[e],
                "slot {slot}"
            );
            assert_eq!(f32::from_bits(v.to_bits() << 16), x[e + 32], "slot {slot}");
        }
        assert_eq!(out[192..], x[192..], "the tail stays");
    }
}
