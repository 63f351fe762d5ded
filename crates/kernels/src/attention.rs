//! Sparse attention with a sink for one query position: every head scores the same keys
//! (V4's single latent is both key and value), a per-head learned sink logit joins the
//! softmax denominator with a zero value vector, and the result is the weighted sum of the
//! keys themselves.

use crate::vector::{axpy, dot, exp_in_place, max, scale, sum};

/// `out[h] = Σ_j softmax_j(q_h·k_j · scale | sink_h) · k_j` for the heads `q: [H, d]`.
///
/// `key(j)` gives key `j` of `n_keys` (window rows and compressed entries, wherever they
/// live); each is read twice (scores, then the sum), so they should fit a core's L2.
/// `scores` is scratch, grown to `H · n_keys` once and then reused.
#[allow(clippy::too_many_arguments)]
pub fn sink_attention<'k>(
    q: &[f32],
    d: usize,
    n_keys: usize,
    key: impl Fn(usize) -> &'k [f32],
    sinks: &[f32],
    softmax_scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let heads = sinks.len();
    assert_eq!(q.len(), heads * d, "sink_attention: q is not [heads, d]");
    assert_eq!(
        out.len(),
        heads * d,
        "sink_attention: out is not [heads, d]"
    );
    if scores.len() < heads * n_keys {
        scores.resize(heads * n_keys, 0.0);
    }
    let scores = &mut scores[..heads * n_keys];
    for j in 0..n_keys {
        let k = key(j);
        for (h, qh) in q.chunks_exact(d).enumerate() {
            scores[h * n_keys + j] = dot(qh, k) * softmax_scale;
        }
    }
    // Per head: p_j = exp(s_j − m) with m the max over the scores and the sink.
    let mut inv = [0.0f32; 256];
    assert!(heads <= inv.len(), "sink_attention: more than 256 heads");
    for (h, s) in scores
        .chunks_exact_mut(n_keys.max(1))
        .enumerate()
        .take(heads)
    {
        let m = max(s).max(sinks[h]);
        s.iter_mut().for_each(|v| *v -= m);
        exp_in_place(s);
        inv[h] = 1.0 / (sum(s) + (sinks[h] - m).exp());
    }
    if n_keys == 0 {
        inv[..heads].iter_mut().for_each(|v| *v = 0.0);
    }
    out.iter_mut().for_each(|v| *v = 0.0);
    for j in 0..n_keys {
        let k = key(j);
        for (h, o) in out.chunks_exact_mut(d).enumerate() {
            axpy(o, scores[h * n_keys + j], k);
        }
    }
    for (h, o) in out.chunks_exact_mut(d).enumerate() {
        scale(o, inv[h]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_direct_softmax_with_the_sink() {
        let (heads, d, n) = (3, 20, 7);
        let q: Vec<f32> = (0..heads * d)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0)
            .collect();
        let keys: Vec<Vec<f32>> = (0..n)
            .map(|j| {
                (0..d)
                    .map(|i| (((i + 3 * j) * 5 % 11) as f32 - 5.0) / 3.0)
                    .collect()
            })
            .collect();
        let sinks = [0.5f32, -2.0, 30.0];
        let mut out = vec![0.0; heads * d];
        let mut scratch = Vec::new();
        sink_attention(&q, d, n, |j| &keys[j], &sinks, 0.3, &mut scratch, &mut out);
        for h in 0..heads {
            let s: Vec<f64> = keys
                .iter()
                .map(|k| {
                    0.3 * (0..d)
                        .map(|i| q[h * d + i] as f64 * k[i] as f64)
                        .sum::<f64>()
                })
                .collect();
            let m = s.iter().cloned().fold(sinks[h] as f64, f64::max);
            let denom: f64 =
                s.iter().map(|v| (v - m).exp()).sum::<f64>() + (sinks[h] as f64 - m).exp();
            for i in 0..d {
                let want: f64 = s
                    .iter()
                    .zip(&keys)
                    .map(|(v, k)| (v - m).exp() * k[i] as f64)
                    .sum::<f64>()
                    / denom;
                assert!((out[h * d + i] as f64 - want).abs() < 1e-5, "h{h} i{i}");
            }
        }
        // No keys at all: the sink takes all the weight and the output is zero.
        sink_attention(&q, d, 0, |j| &keys[j], &sinks, 0.3, &mut scratch, &mut out);
        assert!(out.iter().all(|&v| v == 0.0));
    }
}
