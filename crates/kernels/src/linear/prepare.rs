//! Activation layouts the fused kernels expect.
//!
//! Decoding a 256-bit load of weights yields vectors whose lanes hold elements in a strided
//! order (that is what makes the decode cheap: shifts on whole registers, no shuffles). The
//! activation row is permuted once per call to the same order, so the products line up; a
//! row is `k` floats, read once per weight row, so its permutation costs nothing measurable.
//! Elements past the last whole chunk stay in place and are handled by the scalar tail.

use crate::matrix::Format;

/// Elements per decoded chunk (one 32-byte weight load for BF16/FP8/FP4; four f32 loads).
pub(crate) fn chunk(format: Format) -> usize {
    match format {
        Format::F32 => 32,
        Format::Bf16 => 32,
        Format::Fp8 => 32,
        Format::Fp4 => 64,
    }
}

/// Where element `e` of a chunk goes in the permuted chunk.
#[inline]
fn slot(format: Format, e: usize) -> usize {
    match format {
        Format::F32 => e,
        // per 16 elements: lane j of the even vector is element 2j, of the odd one 2j + 1
        Format::Bf16 => (e / 16) * 16 + (e % 2) * 8 + (e % 16) / 2,
        // vector q lane j is byte 4j + q
        Format::Fp8 => (e % 4) * 8 + e / 4,
        // vector s lane j is element 8j + s (an 8×8 transpose)
        Format::Fp4 => (e % 8) * 8 + e / 8,
    }
}

/// Writes `x` (one activation row) in `format`'s kernel order into `out`, times `mult`.
pub(crate) fn permute_row(format: Format, x: &[f32], out: &mut [f32], mult: f32) {
    debug_assert_eq!(x.len(), out.len());
    let c = chunk(format);
    let main = x.len() / c * c;
    for (src, dst) in x[..main]
        .chunks_exact(c)
        .zip(out[..main].chunks_exact_mut(c))
    {
        for (e, &v) in src.iter().enumerate() {
            dst[slot(format, e)] = v * mult;
        }
    }
    for (o, &v) in out[main..].iter_mut().zip(&x[main..]) {
        *o = v * mult;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_is_a_permutation_of_its_chunk() {
        for f in [Format::F32, Format::Bf16, Format::Fp8, Format::Fp4] {
            let c = chunk(f);
            let mut seen = vec![false; c];
            for e in 0..c {
                assert!(!seen[slot(f, e)], "{f:?}: slot {} twice", slot(f, e));
                seen[slot(f, e)] = true;
            }
        }
        let x: Vec<f32> = (0..35).map(|i| i as f32).collect();
        let mut out = vec![0.0; 35];
        permute_row(Format::Fp8, &x, &mut out, 2.0);
        assert_eq!(
            &out[..3],
            &[0.0, 8.0, 16.0],
            "vector 0 holds bytes 0, 4, 8, …"
        );
        assert_eq!(out[8], 2.0, "vector 1 starts with byte 1");
        assert_eq!(&out[32..], &[64.0, 66.0, 68.0], "the tail stays in order");
    }
}
