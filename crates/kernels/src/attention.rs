//! Sparse attention with a sink for one query position: every head scores the same keys
//! (V4's single latent is both key and value), a per-head learned sink logit joins the
//! softmax denominator with a zero value vector, and the result is the weighted sum of the
//! keys themselves.

use crate::vector::{axpy, dot, exp_in_place, max, scale, sum};

/// One query position's heads: `q: [H, d]`, each head's sink logit, the softmax scale.
#[derive(Clone, Copy)]
pub struct SinkHeads<'a> {
    pub q: &'a [f32],
    pub sinks: &'a [f32],
    pub softmax_scale: f32,
}

/// `out[h] = Σ_j softmax_j(q_h·k_j · scale | sink_h) · k_j` for the heads `q: [H, d]`.
///
/// `key(j)` gives key `j` of `n_keys` (window rows and compressed entries, wherever they
/// live); it is asked once per key (the passes below read each key many times, so they
/// keep its address in `key_at`), and each key is read in both passes, so they should fit
/// a core's L2. `scores` and `key_at` are scratch, grown to `H · n_keys` and `n_keys` once
/// and then reused.
pub fn sink_attention<'k>(
    query: &SinkHeads,
    d: usize,
    n_keys: usize,
    key: impl Fn(usize) -> &'k [f32],
    scores: &mut Vec<f32>,
    key_at: &mut Vec<usize>,
    out: &mut [f32],
) {
    let SinkHeads {
        q,
        sinks,
        softmax_scale,
    } = *query;
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
    key_at.clear();
    key_at.extend((0..n_keys).map(|j| {
        let k = key(j);
        assert_eq!(k.len(), d, "sink_attention: key {j} is not {d} wide");
        k.as_ptr() as usize
    }));
    let key_at = &key_at[..];
    // SAFETY: each address is of a `d`-float slice borrowed for 'k, which outlives this call.
    let key = |j: usize| -> &'k [f32] {
        unsafe { std::slice::from_raw_parts(key_at[j] as *const f32, d) }
    };
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::isa().has_avx2() {
        // SAFETY: AVX2 and FMA are present; the shapes were checked above.
        unsafe { avx2::scores(q, d, n_keys, &key, softmax_scale, scores) };
    } else {
        plain_scores(q, d, n_keys, &key, softmax_scale, scores);
    }
    #[cfg(not(target_arch = "x86_64"))]
    plain_scores(q, d, n_keys, &key, softmax_scale, scores);
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
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::isa().has_avx2() {
        // SAFETY: as above.
        unsafe { avx2::weighted_sum(scores, d, n_keys, &key, out) };
    } else {
        plain_weighted_sum(scores, d, n_keys, &key, out);
    }
    #[cfg(not(target_arch = "x86_64"))]
    plain_weighted_sum(scores, d, n_keys, &key, out);
    for (h, o) in out.chunks_exact_mut(d).enumerate() {
        scale(o, inv[h]);
    }
}

/// `scores[h · n + j] = q_h · k_j · scale`.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn plain_scores<'k>(
    q: &[f32],
    d: usize,
    n: usize,
    key: &impl Fn(usize) -> &'k [f32],
    softmax_scale: f32,
    scores: &mut [f32],
) {
    for j in 0..n {
        let k = key(j);
        for (h, qh) in q.chunks_exact(d).enumerate() {
            scores[h * n + j] = dot(qh, k) * softmax_scale;
        }
    }
}

/// `out[h] = Σ_j p[h · n + j] · k_j`.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn plain_weighted_sum<'k>(
    p: &[f32],
    d: usize,
    n: usize,
    key: &impl Fn(usize) -> &'k [f32],
    out: &mut [f32],
) {
    out.iter_mut().for_each(|v| *v = 0.0);
    for j in 0..n {
        let k = key(j);
        for (h, o) in out.chunks_exact_mut(d).enumerate() {
            axpy(o, p[h * n + j], k);
        }
    }
}

/// The two passes with every key loaded once for several heads: four heads' dots share
/// each key vector, and the weighted sum keeps two heads' slices of 64 outputs in registers
/// across all the keys (instead of loading and storing the output for every key and head).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::vector::avx2::hsum;
    use std::arch::x86_64::*;

    /// As [`super::plain_scores`].
    ///
    /// # Safety
    /// AVX2 and FMA are present; `q` holds `heads · d` floats, every key `d`, `scores`
    /// `heads · n`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores<'k>(
        q: &[f32],
        d: usize,
        n: usize,
        key: &impl Fn(usize) -> &'k [f32],
        softmax_scale: f32,
        scores: &mut [f32],
    ) {
        let heads = q.len() / d.max(1);
        let main = d / 16 * 16;
        for j in 0..n {
            let k = key(j);
            for h0 in (0..heads).step_by(4) {
                let hn = (heads - h0).min(4);
                let mut acc = [[_mm256_setzero_ps(); 2]; 4];
                for i in (0..main).step_by(16) {
                    // SAFETY (every load): i + 16 <= d, within the key and each head.
                    let (k0, k1) = unsafe {
                        (
                            _mm256_loadu_ps(k.as_ptr().add(i)),
                            _mm256_loadu_ps(k.as_ptr().add(i + 8)),
                        )
                    };
                    for (t, a) in acc.iter_mut().enumerate().take(hn) {
                        let qh = q[(h0 + t) * d..].as_ptr();
                        unsafe {
                            a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(qh.add(i)), k0, a[0]);
                            a[1] = _mm256_fmadd_ps(_mm256_loadu_ps(qh.add(i + 8)), k1, a[1]);
                        }
                    }
                }
                for (t, a) in acc.iter().enumerate().take(hn) {
                    let qh = &q[(h0 + t) * d..(h0 + t + 1) * d];
                    let tail: f32 = qh[main..].iter().zip(&k[main..]).map(|(x, y)| x * y).sum();
                    scores[(h0 + t) * n + j] =
                        (hsum(_mm256_add_ps(a[0], a[1])) + tail) * softmax_scale;
                }
            }
        }
    }

    /// As [`super::plain_weighted_sum`].
    ///
    /// # Safety
    /// AVX2 and FMA are present; `p` holds `heads · n` floats, every key `d`, `out`
    /// `heads · d`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted_sum<'k>(
        p: &[f32],
        d: usize,
        n: usize,
        key: &impl Fn(usize) -> &'k [f32],
        out: &mut [f32],
    ) {
        let heads = out.len() / d.max(1);
        let main = d / 64 * 64;
        for h0 in (0..heads).step_by(2) {
            let hn = (heads - h0).min(2);
            for i0 in (0..main).step_by(64) {
                let mut acc = [[_mm256_setzero_ps(); 8]; 2];
                for j in 0..n {
                    let k = key(j)[i0..i0 + 64].as_ptr();
                    let w = [
                        _mm256_set1_ps(p[h0 * n + j]),
                        _mm256_set1_ps(p[(h0 + hn - 1) * n + j]),
                    ];
                    for b in 0..8 {
                        // SAFETY: the key's slice holds 64 floats.
                        let kv = unsafe { _mm256_loadu_ps(k.add(8 * b)) };
                        for (a, wt) in acc.iter_mut().zip(&w) {
                            a[b] = _mm256_fmadd_ps(*wt, kv, a[b]);
                        }
                    }
                }
                for (t, a) in acc.iter().enumerate().take(hn) {
                    let o = out[(h0 + t) * d + i0..].as_mut_ptr();
                    for (b, v) in a.iter().enumerate() {
                        // SAFETY: the head's output holds d ≥ i0 + 64 floats.
                        unsafe { _mm256_storeu_ps(o.add(8 * b), *v) };
                    }
                }
            }
            for t in 0..hn {
                let o = &mut out[(h0 + t) * d + main..(h0 + t + 1) * d];
                o.iter_mut().for_each(|v| *v = 0.0);
                for j in 0..n {
                    let wt = p[(h0 + t) * n + j];
                    for (v, &kv) in o.iter_mut().zip(&key(j)[main..]) {
                        *v += wt * kv;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_direct_softmax_with_the_sink() {
        // On every kernel family the CPU has; head counts and widths around the vector paths' blocks (4 heads, 16 and 64
        // floats), with their tails.
        for family in crate::cpu::families() {
            for (heads, d, n) in [(3, 20, 7), (5, 136, 9), (16, 512, 3)] {
                crate::cpu::with_isa(family, || check(heads, d, n));
            }
        }
    }

    fn check(heads: usize, d: usize, n: usize) {
        // Scores of the same size whatever d (as a model's 1/√d scale keeps them).
        let q: Vec<f32> = (0..heads * d)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / (d as f32).sqrt())
            .collect();
        let keys: Vec<Vec<f32>> = (0..n)
            .map(|j| {
                (0..d)
                    .map(|i| (((i + 3 * j) * 5 % 11) as f32 - 5.0) / 3.0)
                    .collect()
            })
            .collect();
        let sinks: Vec<f32> = (0..heads).map(|h| [0.5f32, -2.0, 30.0][h % 3]).collect();
        let mut out = vec![0.0; heads * d];
        let (mut scratch, mut at) = (Vec::new(), Vec::new());
        sink_attention(
            &SinkHeads {
                q: &q,
                sinks: &sinks,
                softmax_scale: 0.3,
            },
            d,
            n,
            |j| &keys[j],
            &mut scratch,
            &mut at,
            &mut out,
        );
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
                assert!(
                    (out[h * d + i] as f64 - want).abs() < 1e-5,
                    "heads {heads} d {d}: h{h} i{i}"
                );
            }
        }
        // No keys at all: the sink takes all the weight and the output is zero.
        sink_attention(
            &SinkHeads {
                q: &q,
                sinks: &sinks,
                softmax_scale: 0.3,
            },
            d,
            0,
            |j| &keys[j],
            &mut scratch,
            &mut at,
            &mut out,
        );
        assert!(out.iter().all(|&v| v == 0.0));
    }
}
