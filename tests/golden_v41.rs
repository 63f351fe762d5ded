//! DeepSeek-V4.1 against our CPU reference (tools/make_v41_golden.py, a port of vLLM's
//! deepseek_v41 torch paths) on tiny checkpoints: logits, greedy tokens and per-layer streams
//! of one whole forward; then cached decode, chunked prefill and mixed batches against that
//! whole forward, bit for bit.

mod common;

use common::*;
use deepinfer_model::kernels::topk::argmax;

const CONFIGS: [&str; 2] = ["tiny-v41-a", "tiny-v41-b"];

#[test]
fn forward_matches_the_reference() {
    for config in CONFIGS {
        let g = Golden::load(config);
        let mut r = runner(load(config, "official"), 1, 0);
        check_whole_prompts(&mut r, &g, &format!("{config}/whole"));
    }
}

/// Per-layer residual streams for one prompt: where a mismatch would first show.
#[test]
fn layer_streams_match_the_reference() {
    for config in CONFIGS {
        check_layer_streams(config, 1e-5);
    }
}

/// Prefill in chunks of every size (one token = decode) gives the whole forward's logits at
/// every position, bit for bit: compressed entries, shared indexer picks, candidate blocks
/// and Engram n-grams all cross chunk boundaries.
#[test]
fn chunked_prefill_and_decode_equal_the_whole_forward() {
    for (config, pi) in [("tiny-v41-a", 2), ("tiny-v41-b", 2)] {
        check_chunked_prefill(config, pi, &[1, 2, 3, 7, 16]);
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
    // Different chunk sizes per sequence: 64, 9, 1 and 5 tokens a step.
    let plans: Vec<BatchPlan> = [64, 9, 1, 5]
        .into_iter()
        .enumerate()
        .map(|(pi, chunk)| BatchPlan {
            tokens: long_sequence(&g, pi),
            first: chunk,
            later: chunk,
            joins: 0,
        })
        .collect();
    check_mixed_batches(config, &plans);
}
