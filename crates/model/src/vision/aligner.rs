//! The aligner (vLLM 0.33 `models/deepseek_v4/common/vision.py` lines 327-363): each
//! `r × r` square of patch rows (zero past the image's edge) becomes one decoder token
//! through a GELU MLP. Weights `aligner.w1`, `aligner.w2`, both biased.

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::VisionConfig;

use super::affine::Affine;

pub struct Aligner {
    w1: Affine,
    w2: Affine,
    r: usize,
    dim: usize,
}

impl Aligner {
    pub fn load(ck: &Checkpoint, c: &VisionConfig, hidden: usize) -> Result<Self, CheckpointError> {
        let r = c.downsample_ratio;
        Ok(Self {
            w1: Affine::load(ck, "aligner.w1", hidden, c.dim * r * r, true)?,
            w2: Affine::load(ck, "aligner.w2", hidden, hidden, true)?,
            r,
            dim: c.dim,
        })
    }

    /// The ViT's `x` (`[n_h · n_w, dim]`) as decoder rows `[⌈n_h/r⌉ · ⌈n_w/r⌉, hidden]`,
    /// in reading order over the token grid.
    pub fn forward(&self, x: &[f32], (n_h, n_w): (usize, usize)) -> Vec<f32> {
        let folded = self.fold(x, (n_h, n_w));
        let rows = n_h.div_ceil(self.r) * n_w.div_ceil(self.r);
        let mut hidden = self.w1.forward(&folded, rows);
        hidden.iter_mut().for_each(|v| *v = gelu(*v));
        self.w2.forward(&hidden, rows)
    }

    /// `F.unfold` of the zero-padded `(dim, n_h, n_w)` map: feature `c · r² + di · r + dj` of
    /// the token at `(bi, bj)` is channel `c` of patch `(bi · r + di, bj · r + dj)`.
    fn fold(&self, x: &[f32], (n_h, n_w): (usize, usize)) -> Vec<f32> {
        let (r, d) = (self.r, self.dim);
        let (gh, gw) = (n_h.div_ceil(r), n_w.div_ceil(r));
        let mut out = vec![0.0f32; gh * gw * d * r * r];
        for (t, feat) in out.chunks_exact_mut(d * r * r).enumerate() {
            let (bi, bj) = (t / gw, t % gw);
            for (di, dj) in (0..r).flat_map(|di| (0..r).map(move |dj| (di, dj))) {
                let (pi, pj) = (bi * r + di, bj * r + dj);
                if pi < n_h && pj < n_w {
                    let src = &x[(pi * n_w + pj) * d..][..d];
                    for (c, &v) in src.iter().enumerate() {
                        feat[c * r * r + di * r + dj] = v;
                    }
                }
            }
        }
        out
    }
}

/// Exact GELU, `x · Φ(x)` (torch's default `F.gelu`).
fn gelu(x: f32) -> f32 {
    let x = f64::from(x);
    (0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2))) as f32
}

/// The error function in f64: its Maclaurin series below 3 (the largest term stays under
/// 200, so the sum keeps 13 digits), a continued fraction for `erfc` beyond.
fn erf(x: f64) -> f64 {
    let a = x.abs();
    let v = if a < 3.0 {
        let (mut term, mut sum, x2) = (a, a, a * a);
        for n in 1..100 {
            term *= -x2 / n as f64;
            sum += term / (2 * n + 1) as f64;
            if term.abs() < 1e-17 * sum {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc(a) = exp(-a²)/√π · 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + …)))).
        let mut frac = a;
        for k in (1..100).rev() {
            frac = a + (k as f64 / 2.0) / frac;
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * frac)
    };
    v.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::erf;

    #[test]
    fn erf_matches_published_values() {
        // Abramowitz & Stegun table 7.1 and mpmath, to 15 digits.
        for (x, want) in [
            (0.0, 0.0),
            (0.1, 0.112_462_916_018_284_9),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.9, 0.999_958_902_121_900_4),
            (3.0, 0.999_977_909_503_001_4),
            (3.5, 0.999_999_256_901_627_7),
            (5.0, 0.999_999_999_998_462_5),
        ] {
            assert!((erf(x) - want).abs() < 1e-13, "erf({x}) = {}", erf(x));
            assert!((erf(-x) + want).abs() < 1e-13);
        }
    }
}
