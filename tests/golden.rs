//! Golden tests: our forward pass against HF transformers 5.23 run in float32 on the same
//! tiny checkpoints (tools/make_golden.py), loaded from DeepSeek's layout, from HF's, and
//! from what transformers' `save_pretrained` writes back (tools/make_saved_fixtures.py).

mod common;

use common::*;
use deepinfer_model::batch::ForwardBatch;

fn check_config(config: &str) {
    let g = Golden::load(config);
    let mut official = runner(load(config, "official"), 1, 0);
    let mut hf = runner(load(config, "hf"), 1, 0);
    assert!(
        g.prompts()
            .iter()
            .filter(|p| p["tie_safe"].as_bool().unwrap())
            .count()
            >= 3
    );
    for p in g.prompts() {
        // Teacher-forced over prompt + HF's greedy tokens: one forward gives the logits of
        // every prompt position and of every greedy step, which must reproduce HF's choices.
        let check = |r: &mut TestRunner, layout: &str| {
            let label = format!("{config}/{layout}");
            check_teacher_forced(r, &g, p, usize::MAX, LogitTol::Absolute(LOGIT_TOL), &label)
        };
        let a = check(&mut official, "official");
        let b = check(&mut hf, "hf");
        // Both layouts hold the same numbers in different formats (E8M0 vs F32 scales, FP4
        // vs BF16 experts), so only the kernels' summation order may differ.
        let diff = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(diff <= 1e-5, "{config}: the two layouts differ by {diff}");
    }
}

#[test]
fn tiny_a_matches_hf() {
    check_config("tiny-a");
}

#[test]
fn tiny_b_matches_hf() {
    check_config("tiny-b");
}

#[test]
fn tiny_c_matches_hf() {
    check_config("tiny-c");
}

/// Checkpoints as a user who loads one with transformers 5.23 and saves it again gets them
/// (tools/make_saved_fixtures.py: DeepSeek's inner names under `model.` with FP8/FP4 kept,
/// in float32 and bfloat16; HF's names dequantised with `kv_norm` saved as `norm`), against
/// what transformers computes on each saved file in float32.
#[test]
fn checkpoints_saved_by_transformers_match_hf() {
    for saved in ["saved-f32", "saved-bf16", "saved-hf-bf16"] {
        let g = Golden::load_named("tiny-c", &format!("{saved}_golden"));
        let mut r = runner(load("tiny-c", saved), 1, 0);
        check_whole_prompts(&mut r, &g, &format!("tiny-c/{saved}"));
    }
}

/// Per-layer residual streams for one prompt: where a mismatch would first show.
#[test]
fn tiny_a_layer_outputs_match_hf() {
    check_layer_streams("tiny-a", 1e-4);
}

#[test]
fn tiny_b_layer_outputs_match_hf() {
    check_layer_streams("tiny-b", 1e-4);
}

#[test]
fn tiny_c_layer_outputs_match_hf() {
    check_layer_streams("tiny-c", 1e-4);
}

/// Several prompts of different lengths in one flat batch give each exactly what it gives
/// alone (and so what HF gives).
#[test]
fn flat_batch_of_prompts_equals_one_at_a_time() {
    let g = Golden::load("tiny-a");
    let mut model = load("tiny-a", "official");
    let prompts: Vec<Vec<u32>> = g.prompts().iter().map(|p| ids(&p["ids"])).collect();
    let mut cache = cache_for(&model, prompts.len());
    let seqs: Vec<_> = prompts
        .iter()
        .map(|p| {
            let s = cache.add_seq().unwrap();
            cache.ensure_capacity(s, p.len()).unwrap();
            s
        })
        .collect();
    let batched = model
        .forward(
            &ForwardBatch::from_prompts(&prompts, false),
            &mut cache.view(&seqs).unwrap(),
        )
        .unwrap();
    assert_eq!(batched.rows(), prompts.len());
    let mut r = runner(load("tiny-a", "official"), 1, 0);
    for (i, p) in prompts.iter().enumerate() {
        let alone = chunked_logits(&mut r, p, p.len());
        // Alone and batched, a prompt may take different kernel paths (the GEMM from 32
        // rows, which sums in another order): equal to rounding, not bit for bit.
        let d = max_abs_diff(batched.row(i), &alone[p.len() - 1]);
        assert!(d <= 1e-5, "prompt {i}: batched and alone differ by {d}");
        let want = g.f32s(&format!("p{i}.last_logits"));
        assert!(max_abs_diff(batched.row(i), &want) <= LOGIT_TOL);
    }
}

#[test]
fn bad_batches_are_errors_not_panics() {
    let mut model = load("tiny-c", "official");
    let mut cache = cache_for(&model, 1);
    let seq = cache.add_seq().unwrap();
    cache.ensure_capacity(seq, 3).unwrap();
    let vocab = model.config.vocab_size as u32;
    let mut run = |b: &ForwardBatch| {
        model
            .forward(b, &mut cache.view(&[seq]).unwrap())
            .unwrap_err()
            .to_string()
    };
    let err = run(&ForwardBatch::from_prompts(&[vec![1, vocab]], false));
    assert!(err.contains(&vocab.to_string()), "{err}");
    let mut b = ForwardBatch::from_prompts(&[vec![1, 2, 3]], false);
    b.positions = vec![0, 2, 3];
    assert!(run(&b).contains("consecutively"));
    let mut b = ForwardBatch::from_prompts(&[vec![1, 2, 3]], false);
    b.positions = vec![5, 6, 7];
    assert!(run(&b).contains("beyond the 3 tokens"));
    let mut b = ForwardBatch::from_prompts(&[vec![1, 2, 3]], false);
    b.positions.pop();
    assert!(run(&b).contains("2 positions"));
    let mut b = ForwardBatch::from_prompts(&[vec![1, 2, 3]], false);
    b.logits_rows = vec![3];
    assert!(run(&b).contains("row 3"));
    let mut b = ForwardBatch::from_prompts(&[vec![1, 2, 3]], false);
    b.spans[0].len = 4;
    assert!(run(&b).contains("does not fit"));
}
