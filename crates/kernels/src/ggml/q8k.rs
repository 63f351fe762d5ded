//! Activations as llama.cpp's CPU backend hands them to a K-quant product (`vec_dot_type`
//! Q8_K): per 256 values, the one of largest magnitude `max` (the first such, with its
//! sign), `iscale = -127 / max`, codes `min(127, round(iscale · x))` ties to even, and the
//! f32 scale `d = 1 / iscale` — `quantize_row_q8_K_ref` of llama.cpp 0c1e570, which its x86
//! `quantize_row_q8_K` calls.

/// Values per block.
pub const QK_K: usize = 256;

/// One block's codes and scale.
pub fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (o, &v) in q.iter_mut().zip(x) {
        *o = (iscale * v).round_ties_even().min(127.0) as i8;
    }
    1.0 / iscale
}

/// One row's Q8_K blocks: codes, each block's scale, and the sums of each 16 codes (what
/// the K-quant products subtract their offsets with; `|sum| ≤ 16 · 127`, so an `i16`, which
/// the GEMM multiplies on `vpmaddwd`).
#[derive(Clone, Debug, Default)]
pub struct Q8KRow {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub bsums: Vec<i16>,
}

impl Q8KRow {
    /// Quantises `x` (whole blocks) into this row, reusing its buffers.
    pub fn quantize(&mut self, x: &[f32]) {
        assert!(x.len().is_multiple_of(QK_K), "Q8_K rows are whole blocks");
        self.q.resize(x.len(), 0);
        self.d.clear();
        for (xb, qb) in x.chunks_exact(QK_K).zip(self.q.chunks_exact_mut(QK_K)) {
            self.d.push(quantize_block(xb, qb));
        }
        self.bsums.clear();
        let sums = self
            .q
            .chunks_exact(16)
            .map(|c| c.iter().map(|&v| v as i16).sum::<i16>());
        self.bsums.extend(sums);
    }
}

/// Rounds `x` (whole blocks) in place to the values its Q8_K codes stand for (`q · d`).
pub fn round_trip(x: &mut [f32]) {
    assert!(x.len().is_multiple_of(QK_K), "Q8_K rows are whole blocks");
    let mut q = [0i8; QK_K];
    for b in x.chunks_exact_mut(QK_K) {
        let d = quantize_block(b, &mut q);
        for (v, &c) in b.iter_mut().zip(&q) {
            *v = c as f32 * d;
        }
    }
}
