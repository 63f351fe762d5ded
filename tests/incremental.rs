//! Incremental decoding against the goldens: cached greedy decode, chunked prefill, mixed
//! batches and truncation all give what one whole forward (and so HF) gives.

mod common;

use common::*;
use deepinfer_engine::cache::CacheError;
use deepinfer_model::kernels::topk::argmax;

/// Prefill the prompt, then decode one token per step feeding back our own argmax.
fn cached_greedy(config: &str, layout: &str, chunk: usize) {
    let g = Golden::load(config);
    let mut r = runner(load(config, layout), 1, 0);
    for p in g
        .prompts()
        .iter()
        .filter(|p| p["tie_safe"].as_bool().unwrap())
    {
        let pi = p["index"].as_u64().unwrap();
        let prompt = ids(&p["ids"]);
        let greedy = ids(&p["greedy"]);
        let (top_ids, top_logits) = (
            g.i64s(&format!("p{pi}.top_ids")),
            g.f32s(&format!("p{pi}.top_logits")),
        );
        let k = top_ids.len() / greedy.len();
        let seq = r.add_sequence().unwrap();
        let mut last = Vec::new();
        for part in prompt.chunks(chunk) {
            last = feed(&mut r, seq, part, false).row(0).to_vec();
        }
        let mut got = Vec::new();
        for s in 0..greedy.len() {
            let tok = argmax(&last) as u32;
            got.push(tok);
            for j in 0..k {
                let diff = (last[top_ids[s * k + j] as usize] - top_logits[s * k + j]).abs();
                assert!(
                    diff <= LOGIT_TOL,
                    "{config}/{layout} p{pi} step {s}: logit differs by {diff}"
                );
            }
            if s + 1 < greedy.len() {
                last = feed(&mut r, seq, &[tok], false).row(0).to_vec();
            }
        }
        assert_eq!(
            got, greedy,
            "{config}/{layout} p{pi}: cached greedy tokens differ from HF"
        );
        r.free(seq).unwrap();
    }
}

#[test]
fn cached_greedy_decode_reproduces_hf() {
    for config in ["tiny-a", "tiny-b", "tiny-c"] {
        cached_greedy(config, "official", usize::MAX);
    }
    cached_greedy("tiny-a", "hf", 7);
}

#[test]
fn chunked_prefill_equals_full_forward_at_every_position() {
    for (config, pi) in [("tiny-a", 2), ("tiny-b", 1), ("tiny-c", 3)] {
        let r = check_chunked_prefill(config, pi, &[1, 7, 13, 64]);
        assert_eq!(
            r.cache()
                .usage()
                .iter()
                .map(|u| u.used_blocks)
                .sum::<usize>(),
            0,
            "everything freed"
        );
    }
}

/// Sequences in different phases share steps: long chunks, short chunks, single decode
/// tokens, sequences joining late. Each must get what it gets alone.
#[test]
fn mixed_batches_equal_running_alone() {
    let g = Golden::load("tiny-a");
    let plan = |pi, first, later, joins| BatchPlan {
        tokens: long_sequence(&g, pi),
        first,
        later,
        joins,
    };
    check_mixed_batches(
        "tiny-a",
        &[
            plan(3, 64, 64, 0), // 731 tokens, 64 per step
            plan(2, 7, 7, 1),   // joins at step 1, 7 per step
            plan(1, 1, 1, 2),   // token by token from step 2
            plan(0, 5, 1, 4),   // whole prompt, then decode one by one
        ],
    );
}

#[test]
fn truncation_is_exact() {
    // (config, prefix length, k): k crosses CSA (m=4) and HCA (m=8 / m=16) window ends.
    for (config, prefix, k) in [
        ("tiny-a", 100, 9),
        ("tiny-a", 101, 20),
        ("tiny-b", 100, 20),
        ("tiny-c", 50, 13),
    ] {
        let g = Golden::load(config);
        let tokens = long_sequence(&g, 2);
        let mut r = runner(load(config, "official"), 1, 20);
        let full = chunked_logits(&mut r, &tokens, tokens.len());

        let seq = r.add_sequence().unwrap();
        feed(&mut r, seq, &tokens[..prefix], false);
        // A detour of k tokens that differ from the real continuation, in two steps.
        let detour: Vec<u32> = tokens[prefix..prefix + k]
            .iter()
            .map(|t| (t + 1) % r.model().config.vocab_size as u32)
            .collect();
        feed(&mut r, seq, &detour[..k / 2], false);
        for t in &detour[k / 2..] {
            feed(&mut r, seq, std::slice::from_ref(t), false);
        }
        r.truncate(seq, prefix).unwrap();
        for (c, part) in tokens[prefix..].chunks(5).enumerate() {
            let l = feed(&mut r, seq, part, true);
            for j in 0..part.len() {
                let pos = prefix + c * 5 + j;
                let d = max_abs_diff(l.row(j), &full[pos]);
                assert!(d <= 1e-5, "{config} prefix {prefix} k {k}: position {pos} differs by {d} after truncation");
            }
        }
        r.free(seq).unwrap();
    }
}

#[test]
fn truncation_beyond_the_rollback_slack_is_refused() {
    let mut r = runner(load("tiny-a", "official"), 1, 4);
    let seq = r.add_sequence().unwrap();
    let tokens: Vec<u32> = (0..30).collect();
    feed(&mut r, seq, &tokens, false);
    r.truncate(seq, 26).unwrap();
    let err = r.truncate(seq, 25).unwrap_err();
    assert!(matches!(err, CacheError::TruncateTooFar { .. }), "{err}");
    assert!(err.to_string().contains("4 tokens of rollback"), "{err}");
    assert!(matches!(
        r.truncate(seq, 27).unwrap_err(),
        CacheError::TruncateBeyondCapacity { .. }
    ));
}
