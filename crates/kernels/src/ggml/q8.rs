//! Activations as llama.cpp's CPU backend hands them to a Q8_0 or MXFP4 product
//! (`vec_dot_type` Q8_0): per 32 values, `d = amax / 127` kept as f16 and codes
//! `round(x · 127 / amax)`, ties to even — the x86 `quantize_row_q8_0` of llama.cpp 0c1e570
//! (`ggml-cpu/arch/x86/quants.c`), which multiplies by `127 / amax` rather than by `1 / d`.

use half::f16;

/// Values per block.
pub const QK: usize = 32;

/// One row's blocks: codes and each block's scale (an f16 value, as f32).
#[derive(Clone, Debug, Default)]
pub struct Q8Row {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    /// Whether the row last quantised was held exactly ([`Q8Row::quantize`]).
    pub exact: bool,
}

/// Quantises one block (32 values) into `q`, returning its scale.
#[inline(always)]
pub fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32(amax / 127.0).to_f32();
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (o, &v) in q.iter_mut().zip(x) {
        *o = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    d
}

impl Q8Row {
    /// Quantises `x` (a multiple of [`QK`] values) into this row, reusing its buffers.
    /// Returns whether the row holds `x` exactly (every `x = q · d`): then a product on the
    /// codes gives the f32 products' exact values, whatever its order of summation.
    pub fn quantize(&mut self, x: &[f32]) -> bool {
        assert!(x.len().is_multiple_of(QK), "Q8_0 rows are whole blocks");
        self.q.resize(x.len(), 0);
        self.d.resize(x.len() / QK, 0.0);
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::detected() >= crate::cpu::Isa::Avx2 {
            // SAFETY: the CPU has AVX2 and FMA.
            self.exact = unsafe { fill_avx2(x, &mut self.q, &mut self.d) };
            return self.exact;
        }
        self.exact = fill(x, &mut self.q, &mut self.d);
        self.exact
    }

    /// Rounds `x` in place to the values its Q8_0 codes stand for (`q · d`): what a product
    /// reads under llama.cpp's numerics.
    pub fn round_trip(x: &mut [f32]) {
        let mut q = [0i8; QK];
        for b in x.chunks_exact_mut(QK) {
            let d = quantize_block(b, &mut q);
            for (v, &c) in b.iter_mut().zip(&q) {
                *v = c as f32 * d;
            }
        }
    }
}

/// The blocks of `x` into `q` and `d`; whether every value is `q · d`.
#[inline(always)]
fn fill(x: &[f32], q: &mut [i8], d: &mut [f32]) -> bool {
    let mut exact = true;
    let blocks = x.chunks_exact(QK).zip(q.chunks_exact_mut(QK));
    for ((xb, qb), d) in blocks.zip(d.iter_mut()) {
        *d = quantize_block(xb, qb);
        // Compared as values, so a NaN or infinity is never exact.
        exact &= xb
            .iter()
            .zip(qb.iter())
            .fold(true, |e, (&v, &c)| e & (v == c as f32 * *d));
    }
    exact
}

/// [`fill`] compiled for AVX2, where rounding to even is one instruction and the blocks
/// vectorise: the same results.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fill_avx2(x: &[f32], q: &mut [i8], d: &mut [f32]) -> bool {
    fill(x, q, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantises_as_llama_cpp_and_round_trips_exactly() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 31.5) * 0.013)
            .collect();
        let mut row = Q8Row::default();
        assert!(!row.quantize(&x));
        // The largest magnitude takes code ±127; a tie rounds to even.
        let amax = x[..32].iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let top = x[..32].iter().position(|v| v.abs() == amax).unwrap();
        assert_eq!(row.q[top].abs(), 127);
        let mut q = [0i8; 32];
        let mut tie = [0.0f32; 32];
        tie[0] = 127.0;
        tie[1] = 2.5;
        tie[2] = -3.5;
        assert_eq!(quantize_block(&tie, &mut q), 1.0);
        assert_eq!(&q[..3], &[127, 2, -4]);
        // Rounded once, a row quantises to itself.
        let mut y = x.clone();
        Q8Row::round_trip(&mut y);
        assert!(row.quantize(&y));
        let mut z = y.clone();
        Q8Row::round_trip(&mut z);
        assert_eq!(y, z);
        assert!(!row.quantize(&[f32::NAN; 32]));
        assert!(row.quantize(&[0.0; 32]));
    }
}
