//! Mixture of experts (spec §3.9): hash-routed (frozen token → experts table) or scored
//! top-k with a selection-only bias, renormalised weights × routed_scaling_factor, clamped
//! SwiGLU experts, plus the always-on shared expert.

use crate::config::{ModelConfig, ScoringFunc};
use crate::weights::{ExpertWeights, MoeWeights, Routing};
use deepinfer_kernels::topk::topk_indices;

fn softplus(x: f32) -> f32 {
    // torch's softplus switches to the identity above 20 (beta = 1).
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Router scores for one token's logits.
fn scores(func: ScoringFunc, logits: &[f32]) -> Vec<f32> {
    match func {
        ScoringFunc::SqrtSoftplus => logits.iter().map(|&x| softplus(x).sqrt()).collect(),
        ScoringFunc::Sigmoid => logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
        ScoringFunc::Softmax => {
            let mx = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = logits.iter().map(|&x| (x - mx).exp()).collect();
            let s: f32 = e.iter().sum();
            e.iter().map(|v| v / s).collect()
        }
    }
}

/// `w2 · (silu(min(w1·x, L)) ⊙ clamp(w3·x, −L, L))` for `x: [n, D]`.
fn expert_forward(e: &ExpertWeights, x: &[f32], n: usize, limit: f32) -> Vec<f32> {
    let g = e.w1.forward(x, n);
    let u = e.w3.forward(x, n);
    let hidden: Vec<f32> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| silu(g.min(limit)) * u.clamp(-limit, limit))
        .collect();
    e.w2.forward(&hidden, n)
}

/// Routed experts and weights for every token: `(expert ids, weights)`, `k` per token.
pub fn route(
    w: &MoeWeights,
    c: &ModelConfig,
    x: &[f32],
    token_ids: &[u32],
) -> (Vec<usize>, Vec<f32>) {
    let t = token_ids.len();
    let k = c.num_experts_per_tok;
    let e = c.n_routed_experts;
    let logits = w.gate.forward(x, t);
    let mut ids = Vec::with_capacity(t * k);
    let mut wts = Vec::with_capacity(t * k);
    for i in 0..t {
        let s = scores(c.scoring_func, &logits[i * e..(i + 1) * e]);
        let chosen: Vec<usize> = match &w.routing {
            Routing::Hash(table) => {
                let tok = token_ids[i] as usize;
                table[tok * k..(tok + 1) * k]
                    .iter()
                    .map(|&v| v as usize)
                    .collect()
            }
            Routing::Scored { bias } => {
                let biased: Vec<f32> = s.iter().zip(bias).map(|(a, b)| a + b).collect();
                topk_indices(&biased, k)
            }
        };
        // HF always renormalises; DeepSeek's reference skips it for softmax scoring, which
        // its configs express as norm_topk_prob = false.
        let sum: f32 = if c.norm_topk_prob {
            chosen.iter().map(|&j| s[j]).sum::<f32>() + 1e-20
        } else {
            1.0
        };
        for j in chosen {
            ids.push(j);
            wts.push(s[j] / sum * c.routed_scaling_factor);
        }
    }
    (ids, wts)
}

/// The MoE output for `x: [T, D]` (normed FFN input) of tokens `token_ids`.
pub fn moe(w: &MoeWeights, c: &ModelConfig, x: &[f32], token_ids: &[u32]) -> Vec<f32> {
    let d = c.hidden_size;
    let t = token_ids.len();
    let k = c.num_experts_per_tok;
    let (ids, wts) = route(w, c, x, token_ids);
    let mut out = match &w.shared {
        Some(s) => expert_forward(s, x, t, c.swiglu_limit),
        None => vec![0.0f32; t * d],
    };
    let mut routed = vec![0.0f32; t * d];
    // Gather the tokens of each expert so every expert runs once per step as a small GEMM.
    for (ei, expert) in w.experts.iter().enumerate() {
        let picks: Vec<(usize, f32)> = (0..t * k)
            .filter(|&r| ids[r] == ei)
            .map(|r| (r / k, wts[r]))
            .collect();
        if picks.is_empty() {
            continue;
        }
        let xs: Vec<f32> = picks
            .iter()
            .flat_map(|&(i, _)| x[i * d..(i + 1) * d].iter().copied())
            .collect();
        let y = expert_forward(expert, &xs, picks.len(), c.swiglu_limit);
        for (r, &(i, wt)) in picks.iter().enumerate() {
            for (o, v) in routed[i * d..(i + 1) * d]
                .iter_mut()
                .zip(&y[r * d..(r + 1) * d])
            {
                *o += v * wt;
            }
        }
    }
    out.iter_mut().zip(&routed).for_each(|(o, r)| *o += r);
    out
}
