//! Token-level compression (spec §3.6): every `m` tokens become one entry, a per-channel
//! softmax-gated pool of the tokens' projections. CSA windows overlap (each entry pools
//! the previous window's A-half and its own window's B-half); HCA windows do not.

use crate::weights::CompressorWeights;
use deepinfer_kernels::norm::rms_norm;
use deepinfer_kernels::rope::Rope;

/// Compressed entries of a sequence whose first `t` tokens (positions `0..t`) are `a`
/// (the attention input, `[t, D]`). Returns `[t div m, c]`, normed and rotated at the
/// window's first position.
pub fn compress(w: &CompressorWeights, a: &[f32], t: usize, rope: &Rope, eps: f32) -> Vec<f32> {
    let m = w.ratio;
    let c = w.dim;
    let n_win = t / m;
    if n_win == 0 {
        return Vec::new();
    }
    let used = n_win * m;
    let k = w.wkv.forward(&a[..used * w.wkv.in_dim], used);
    let mut z = w.wgate.forward(&a[..used * w.wgate.in_dim], used);
    let width = w.wkv.out_dim;
    for (p, row) in z.chunks_exact_mut(width).enumerate() {
        let ape = &w.ape[(p % m) * width..(p % m + 1) * width];
        row.iter_mut().zip(ape).for_each(|(v, b)| *v += b);
    }
    let mut out = vec![0.0f32; n_win * c];
    // Slots of one entry, per channel: (kv, logit). Overlapping windows have 2m slots.
    let mut slots: Vec<(f32, f32)> = Vec::with_capacity(2 * m);
    for win in 0..n_win {
        let entry = &mut out[win * c..(win + 1) * c];
        for (ch, e) in entry.iter_mut().enumerate() {
            slots.clear();
            if w.overlap {
                if win > 0 {
                    for i in 0..m {
                        let p = (win - 1) * m + i;
                        slots.push((k[p * width + ch], z[p * width + ch]));
                    }
                }
                for i in 0..m {
                    let p = win * m + i;
                    slots.push((k[p * width + c + ch], z[p * width + c + ch]));
                }
            } else {
                for i in 0..m {
                    let p = win * m + i;
                    slots.push((k[p * width + ch], z[p * width + ch]));
                }
            }
            let mx = slots.iter().map(|s| s.1).fold(f32::NEG_INFINITY, f32::max);
            let denom: f32 = slots.iter().map(|s| (s.1 - mx).exp()).sum();
            *e = slots.iter().map(|s| s.0 * ((s.1 - mx).exp() / denom)).sum();
        }
        rms_norm(entry, &w.norm, eps);
        rope.apply(entry, win * m, false);
    }
    out
}
