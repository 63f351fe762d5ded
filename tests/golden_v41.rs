//! DeepSeek-V4.1 against our CPU reference (tools/make_v41_golden.py, a port of vLLM's
//! deepseek_v41 torch paths) on tiny checkpoints: logits, greedy tokens and per-layer streams
//! of one whole forward; then cached decode, chunked prefill and mixed batches against that
//! whole forward, bit for bit.

mod common;

use common::*;
use deepinfer_model::batch::ForwardBatch;
use deepinfer_model::kernels::topk::argmax;

const CONFIGS: [&str; 2] = ["tiny-v41-a", "tiny-v41-b"];

#[test]
fn forward_matches_the_reference() {
    for config in CONFIGS {
        let g = Golden::load(config);
        let mut r = runner(load(config, "official"), 1, 0);
        let safe = g
            .prompts()
            .iter()
            .filter(|p| p["tie_safe"].as_bool().unwrap())
            .count();
        assert!(safe >= 3, "{config}: only {safe} tie-safe prompts");
        for p in g.prompts() {
            let label = format!("{config}/whole");
            check_teacher_forced(
                &mut r,
                &g,
                p,
                usize::MAX,
                LogitTol::Absolute(LOGIT_TOL),
                &label,
            );
        }
    }
}

/// Per-layer residual streams for one prompt: where a mismatch would first show.
#[test]
fn layer_streams_match_the_reference() {
    for config in CONFIGS {
        let g = Golden::load(config);
        let mut model = load(config, "official");
        let pi = g.meta["intermediates_prompt"].as_u64().unwrap() as usize;
        let prompt = ids(&g.prompts()[pi]["ids"]);
        let mut cache = cache_for(&model, 1);
        let seq = cache.add_seq().unwrap();
        cache.ensure_capacity(seq, prompt.len()).unwrap();
        let batch = ForwardBatch::from_prompts(std::slice::from_ref(&prompt), false);
        let mut trace = Vec::new();
        model
            .forward_traced(&batch, &mut cache.view(&[seq]).unwrap(), &mut trace)
            .unwrap();
        assert_eq!(trace.len(), model.config.num_hidden_layers);
        let keep = g.meta["intermediates_positions"].as_u64().unwrap() as usize;
        let row = model.config.hc_mult * model.config.hidden_size;
        let from = prompt.len().saturating_sub(keep) * row;
        for (l, got) in trace.iter().enumerate() {
            let want = g.f32s(&format!("p{pi}.layer{l}"));
            let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            let diff = max_abs_diff(&got[from..], &want);
            eprintln!("{config} layer {l}: streams differ by {diff:.2e} (scale {scale:.1})");
            assert!(
                diff <= 1e-5 * scale,
                "{config} layer {l}: streams differ by {diff}"
            );
        }
    }
}

/// Prefill in chunks of every size (one token = decode) gives the whole forward's logits at
/// every position, bit for bit: compressed entries, shared indexer picks, candidate blocks
/// and Engram n-grams all cross chunk boundaries.
#[test]
fn chunked_prefill_and_decode_equal_the_whole_forward() {
    for (config, pi) in [("tiny-v41-a", 2), ("tiny-v41-b", 2)] {
        let g = Golden::load(config);
        let tokens = long_sequence(&g, pi);
        let mut r = runner(load(config, "official"), 1, 0);
        let full = chunked_logits(&mut r, &tokens, tokens.len());
        for chunk in [1, 2, 3, 7, 16] {
            let got = chunked_logits(&mut r, &tokens, chunk);
            for (i, (a, b)) in got.iter().zip(&full).enumerate() {
                assert!(
                    same_bits(a, b),
                    "{config} chunk {chunk}: position {i} differs by {}",
                    max_abs_diff(a, b)
                );
            }
        }
    }
}

/// Prefill, then decode one token per step on our own argmax: the reference's greedy tokens.
#[test]
fn cached_greedy_decode_reproduces_the_reference() {
    for config in CONFIGS {
        let g = Golden::load(config);
        let mut r = runner(load(config, "official"), 1, 0);
        for p in g
            .prompts()
            .iter()
            .filter(|p| p["tie_safe"].as_bool().unwrap())
        {
            let prompt = ids(&p["ids"]);
            let greedy = ids(&p["greedy"]);
            let seq = r.add_sequence().unwrap();
            let mut last = feed(&mut r, seq, &prompt, false).row(0).to_vec();
            let mut got = Vec::new();
            for s in 0..greedy.len() {
                got.push(argmax(&last) as u32);
                if s + 1 < greedy.len() {
                    last = feed(&mut r, seq, &[got[s]], false).row(0).to_vec();
                }
            }
            assert_eq!(
                got, greedy,
                "{config} p{}: cached greedy differs",
                p["index"]
            );
            r.free(seq).unwrap();
        }
    }
}

/// Sequences in different phases share steps; each gets what it gets alone.
#[test]
fn batched_equals_solo() {
    let config = "tiny-v41-a";
    let g = Golden::load(config);
    let seqs: Vec<Vec<u32>> = (0..4).map(|pi| long_sequence(&g, pi)).collect();
    let mut solo_runner = runner(load(config, "official"), 1, 0);
    let solo: Vec<Vec<Vec<f32>>> = seqs
        .iter()
        .map(|s| chunked_logits(&mut solo_runner, s, s.len()))
        .collect();
    let mut r = runner(load(config, "official"), seqs.len(), 0);
    let ids: Vec<_> = seqs.iter().map(|_| r.add_sequence().unwrap()).collect();
    // Different chunk sizes per sequence: 64, 9, 1 and 5 tokens a step.
    let per_step = [64, 9, 1, 5];
    let mut fed = vec![0usize; seqs.len()];
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); seqs.len()];
    while fed.iter().zip(&seqs).any(|(f, s)| *f < s.len()) {
        let mut work = Vec::new();
        let mut who = Vec::new();
        for (i, s) in seqs.iter().enumerate() {
            let n = per_step[i].min(s.len() - fed[i]);
            if n > 0 {
                work.push(Feed {
                    seq: ids[i],
                    tokens: &s[fed[i]..fed[i] + n],
                    all_logits: true,
                });
                who.push((i, n));
            }
        }
        let logits = r.step(&work).unwrap();
        let mut row = 0;
        for (i, n) in who {
            got[i].extend((row..row + n).map(|j| logits.row(j).to_vec()));
            row += n;
            fed[i] += n;
        }
    }
    for (i, (a_i, b_i)) in got.iter().zip(&solo).enumerate() {
        for (pos, (a, b)) in a_i.iter().zip(b_i).enumerate() {
            assert!(
                same_bits(a, b),
                "sequence {i} position {pos} differs by {} in a batch",
                max_abs_diff(a, b)
            );
        }
    }
}
