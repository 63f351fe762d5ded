//! Deterministic draws: every row of every tensor has its own ChaCha8 stream, keyed by the
//! seed and the tensor's name and selected by the row index. Rows can then be generated in
//! any order and on any number of threads with identical bytes, and a test can regenerate
//! exactly one tensor without replaying the ones before it. Only basic IEEE arithmetic turns
//! random bits into values, so the bytes do not depend on the platform either.

use std::ops::Range;

use deepinfer_kernels::formats::f32_to_bf16;
use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::Dtype;

use super::plan::{Init, PlannedTensor};
use super::quant::{fp4_rows, fp8_rows};

/// Elements drawn per parallel task: big enough to amortise scheduling, small enough that the
/// few tasks in flight per core stay within a few MB each.
const CHUNK_ELEMS: usize = 1 << 18;

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The random source of one tensor.
pub(super) struct TensorRng {
    key: [u8; 32],
}

impl TensorRng {
    pub(super) fn new(seed: u64, name: &str) -> Self {
        // FNV-1a of the name, then SplitMix64 to spread it and the seed over a ChaCha key.
        let mut h = 0xCBF2_9CE4_8422_2325u64;
        for &b in name.as_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3);
        }
        let mut state = seed ^ splitmix64(&mut h);
        let mut key = [0u8; 32];
        for word in key.chunks_exact_mut(8) {
            word.copy_from_slice(&splitmix64(&mut state).to_le_bytes());
        }
        Self { key }
    }

    fn row(&self, row: usize) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::from_seed(self.key);
        rng.set_stream(row as u64);
        rng
    }
}

/// A uniform draw in `[0, 1)` from 24 random bits, so every value is exact in f32.
fn unit(bits: u32) -> f32 {
    (bits >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// A uniform draw in `(-1, 1)`, never exactly 0, from 24 random bits.
fn unit_signed(bits: u32) -> f64 {
    ((bits >> 8) as f64 + 0.5) * (1.0 / (1u32 << 23) as f64) - 1.0
}

/// Natural log of a positive normal `x` from basic IEEE operations only, so draws do not
/// depend on the platform's libm and files are bit-identical everywhere. Atanh series on the
/// mantissa reduced to `[√½, √2)`: |t| ≤ 0.172, so the truncation error is below 1e-12.
fn ln(x: f64) -> f64 {
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7FF) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000F_FFFF_FFFF_FFFF) | 0x3FF0_0000_0000_0000);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    let series = 2.0
        + t2 * (2.0 / 3.0
            + t2 * (2.0 / 5.0
                + t2 * (2.0 / 7.0 + t2 * (2.0 / 9.0 + t2 * (2.0 / 11.0 + t2 * (2.0 / 13.0))))));
    t * series + e as f64 * std::f64::consts::LN_2
}

/// Two independent standard normals (Marsaglia's polar method: no trigonometry, so it is both
/// fast and free of libm).
fn normal_pair(rng: &mut ChaCha8Rng) -> (f64, f64) {
    loop {
        let r = rng.next_u64();
        let (u, v) = (unit_signed(r as u32), unit_signed((r >> 32) as u32));
        let s = u * u + v * v;
        if s < 1.0 {
            let f = (-2.0 * ln(s) / s).sqrt();
            return (u * f, v * f);
        }
    }
}

/// Fills one row.
fn draw_row(init: Init, rng: &mut ChaCha8Rng, out: &mut [f32]) {
    match init {
        Init::Normal { mean, std } => {
            let (mean, std) = (mean as f64, std as f64);
            for pair in out.chunks_mut(2) {
                let (a, b) = normal_pair(rng);
                pair[0] = (mean + std * a) as f32;
                if let Some(second) = pair.get_mut(1) {
                    *second = (mean + std * b) as f32;
                }
            }
        }
        Init::Uniform { lo, hi } => {
            for v in out {
                *v = lo + (hi - lo) * unit(rng.next_u32());
            }
        }
        Init::ExpertIds { .. } | Init::Scale => {
            unreachable!("draw_row called for a non-float init {init:?}")
        }
    }
}

/// `k` distinct ids below `n` (a partial Fisher–Yates shuffle).
fn expert_ids(rng: &mut ChaCha8Rng, n: usize, k: usize, out: &mut Vec<u8>) {
    let mut ids: Vec<u32> = (0..n as u32).collect();
    for i in 0..k.min(n) {
        let j = i + ((rng.next_u32() as u64 * (n - i) as u64) >> 32) as usize;
        ids.swap(i, j);
        out.extend_from_slice(&(ids[i] as i64).to_le_bytes());
    }
}

/// Rows per generation task for `t`; FP8 tasks hold whole scale blocks.
pub(super) fn chunk_rows(t: &PlannedTensor) -> usize {
    let (_, cols) = t.logical_rows_cols();
    let rows = (CHUNK_ELEMS / cols.max(1)).max(1);
    if t.dtype == Dtype::F8_E4M3 {
        rows.div_ceil(t.block[0]) * t.block[0]
    } else {
        rows
    }
}

/// The stored bytes of rows `rows` of `t`, and for FP8/FP4 weights the bytes of the part of
/// their scale tensor those rows determine.
pub(super) fn encode_rows(
    t: &PlannedTensor,
    rng: &TensorRng,
    rows: Range<usize>,
) -> (Vec<u8>, Vec<u8>) {
    let (_, cols) = t.logical_rows_cols();
    let (mut bytes, mut scales) = (Vec::new(), Vec::new());
    if let Init::ExpertIds { n_experts } = t.init {
        bytes.reserve(rows.len() * cols * 8);
        for r in rows {
            expert_ids(&mut rng.row(r), n_experts, cols, &mut bytes);
        }
        return (bytes, scales);
    }
    let values = draw_rows(t, rng, rows);
    match t.dtype {
        Dtype::F32 => {
            bytes.resize(values.len() * 4, 0);
            for (b, v) in bytes.chunks_exact_mut(4).zip(&values) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
        Dtype::BF16 => {
            bytes.resize(values.len() * 2, 0);
            for (b, &v) in bytes.chunks_exact_mut(2).zip(&values) {
                b.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
            }
        }
        Dtype::F8_E4M3 => fp8_rows(&values, cols, t.block, &mut bytes, &mut scales),
        Dtype::I8 => fp4_rows(&values, cols, &mut bytes, &mut scales),
        other => unreachable!("the plan has no {other:?} tensor with a float init"),
    }
    (bytes, scales)
}

fn draw_rows(t: &PlannedTensor, rng: &TensorRng, rows: Range<usize>) -> Vec<f32> {
    let (_, cols) = t.logical_rows_cols();
    let mut values = vec![0.0f32; rows.len() * cols];
    if cols > 0 {
        for (r, out) in rows.zip(values.chunks_exact_mut(cols)) {
            draw_row(t.init, &mut rng.row(r), out);
        }
    }
    values
}

/// The values drawn for float tensor `t` under `seed`, `[rows, logical cols]` row-major,
/// before rounding onto the storage format: what the stored bytes approximate, for checking
/// a written checkpoint against its generator. `None` for `tid2eid` and scale tensors.
pub fn draw_values(t: &PlannedTensor, seed: u64) -> Option<Vec<f32>> {
    match t.init {
        Init::Normal { .. } | Init::Uniform { .. } => {
            let (rows, _) = t.logical_rows_cols();
            Some(draw_rows(t, &TensorRng::new(seed, &t.name), 0..rows))
        }
        Init::ExpertIds { .. } | Init::Scale => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_matches_libm_over_the_range_the_sampler_uses() {
        let mut x = 2f64.powi(-50);
        while x < 1.0 {
            let (got, want) = (ln(x), x.ln());
            assert!((got - want).abs() <= 1e-12 * want.abs().max(1.0), "{x}");
            x *= 1.0137;
        }
    }

    #[test]
    fn normals_have_unit_moments() {
        let mut rng = TensorRng::new(1, "t").row(0);
        let n = 200_000;
        let (mut s1, mut s2, mut s4) = (0.0, 0.0, 0.0);
        for _ in 0..n / 2 {
            let (a, b) = normal_pair(&mut rng);
            for z in [a, b] {
                s1 += z;
                s2 += z * z;
                s4 += z * z * z * z;
            }
        }
        let (m, v, k) = (s1 / n as f64, s2 / n as f64, s4 / n as f64);
        assert!(m.abs() < 0.01 && (v - 1.0).abs() < 0.02 && (k - 3.0).abs() < 0.1);
    }
}
