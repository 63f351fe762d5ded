//! Interleaved rotary embeddings on the trailing slice of a vector, with YaRN.
//!
//! Frequencies are formed in f32 exactly as the HF reference forms them (`θ^(2i/rd)` in
//! f32, reciprocal in f32, the YaRN ramp in f32) because at large positions a one-ulp
//! difference in a frequency becomes a visible angle difference.

/// YaRN parameters (docs/MODEL.md §2): `factor`, original context `L₀`, `β_fast`, `β_slow`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnParams {
    pub factor: f64,
    pub original_max_position_embeddings: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
}

/// Per-pair inverse frequencies of one rope table.
#[derive(Clone, Debug)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    /// `rope_dim` rotated dims (even), base `theta`, optional YaRN.
    pub fn new(rope_dim: usize, theta: f64, yarn: Option<YarnParams>) -> Self {
        let half = rope_dim / 2;
        let pos_freq: Vec<f32> = (0..half)
            .map(|i| (theta as f32).powf((2 * i) as f32 / rope_dim as f32))
            .collect();
        let extrapolation: Vec<f32> = pos_freq.iter().map(|p| 1.0 / p).collect();
        let inv_freq = match yarn {
            None => extrapolation,
            Some(y) => {
                let corr = |rot: f64| {
                    rope_dim as f64
                        * (y.original_max_position_embeddings / (rot * 2.0 * std::f64::consts::PI))
                            .ln()
                        / (2.0 * theta.ln())
                };
                let low = corr(y.beta_fast).floor().max(0.0);
                let mut high = corr(y.beta_slow).ceil().min(rope_dim as f64 - 1.0);
                if low == high {
                    high += 0.001;
                }
                let (low, high) = (low as f32, high as f32);
                (0..half)
                    .map(|i| {
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrap_factor = 1.0 - ramp;
                        let interp = 1.0 / (y.factor as f32 * pos_freq[i]);
                        interp * (1.0 - extrap_factor) + extrapolation[i] * extrap_factor
                    })
                    .collect()
            }
        };
        Self { inv_freq }
    }

    /// Number of rotated dims.
    pub fn dim(&self) -> usize {
        self.inv_freq.len() * 2
    }

    /// `(cos, sin)` for every pair at `pos`: the angle is the f32 product `pos · f_i`, as in
    /// the reference, then evaluated accurately.
    pub fn cos_sin(&self, pos: usize, out_cos: &mut [f32], out_sin: &mut [f32]) {
        for (i, f) in self.inv_freq.iter().enumerate() {
            let angle = (pos as f32 * f) as f64;
            out_cos[i] = angle.cos() as f32;
            out_sin[i] = angle.sin() as f32;
        }
    }

    /// `(cos, sin)` of every pair at each position, `[positions.len(), dim() / 2]` each: a
    /// batch's angles once, shared by every head and layer using this table.
    pub fn table(&self, positions: &[usize], cos: &mut [f32], sin: &mut [f32]) {
        let half = self.inv_freq.len();
        for (i, &p) in positions.iter().enumerate() {
            self.cos_sin(
                p,
                &mut cos[i * half..(i + 1) * half],
                &mut sin[i * half..(i + 1) * half],
            );
        }
    }

    /// Rotates the trailing `2 · cos.len()` values of `x` by the angles of one row of a
    /// [`Rope::table`] (backwards when `inverse`).
    pub fn apply_with(x: &mut [f32], cos: &[f32], sin: &[f32], inverse: bool) {
        let n = x.len();
        let tail = &mut x[n - 2 * cos.len()..];
        let sign = if inverse { -1.0 } else { 1.0 };
        for (pair, (&c, &s)) in tail.chunks_exact_mut(2).zip(cos.iter().zip(sin)) {
            let s = s * sign;
            let (a, b) = (pair[0], pair[1]);
            pair[0] = a * c - b * s;
            pair[1] = b * c + a * s;
        }
    }

    /// Rotates the trailing `dim()` values of `x` by `pos` (or by `-pos` when `inverse`).
    pub fn apply(&self, x: &mut [f32], pos: usize, inverse: bool) {
        let rd = self.dim();
        let n = x.len();
        let tail = &mut x[n - rd..];
        for (i, f) in self.inv_freq.iter().enumerate() {
            let angle = (pos as f32 * f) as f64;
            let (c, s) = (angle.cos() as f32, angle.sin() as f32);
            let s = if inverse { -s } else { s };
            let (a, b) = (tail[2 * i], tail[2 * i + 1]);
            tail[2 * i] = a * c - b * s;
            tail[2 * i + 1] = b * c + a * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_undoes_rotation_and_leaves_nope_dims() {
        let rope = Rope::new(4, 10000.0, None);
        let orig = vec![0.5f32, -1.0, 0.25, 2.0, -3.0, 1.5];
        let mut x = orig.clone();
        rope.apply(&mut x, 17, false);
        assert_eq!(&x[..2], &orig[..2]);
        assert_ne!(&x[2..], &orig[2..]);
        rope.apply(&mut x, 17, true);
        for (a, b) in x.iter().zip(&orig) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn a_table_row_rotates_like_apply() {
        let rope = Rope::new(8, 10000.0, None);
        let (mut c, mut s) = (vec![0.0; 8], vec![0.0; 8]);
        rope.table(&[3, 1000], &mut c, &mut s);
        let orig: Vec<f32> = (0..10).map(|i| i as f32 - 4.5).collect();
        for (row, pos) in [(0usize, 3usize), (1, 1000)] {
            for inverse in [false, true] {
                let (mut a, mut b) = (orig.clone(), orig.clone());
                rope.apply(&mut a, pos, inverse);
                Rope::apply_with(
                    &mut b,
                    &c[row * 4..row * 4 + 4],
                    &s[row * 4..row * 4 + 4],
                    inverse,
                );
                assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn yarn_keeps_high_frequencies_and_divides_low_ones() {
        let y = YarnParams {
            factor: 16.0,
            original_max_position_embeddings: 65536.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        let plain = Rope::new(64, 160000.0, None);
        let yarn = Rope::new(64, 160000.0, Some(y));
        assert_eq!(plain.inv_freq[0], yarn.inv_freq[0]);
        let last = plain.inv_freq.len() - 1;
        assert!((yarn.inv_freq[last] * 16.0 - plain.inv_freq[last]).abs() < 1e-12);
    }
}
