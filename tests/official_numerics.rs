//! `--numerics official` against our CPU port of DeepSeek's own inference code
//! (tools/make_official_golden.py) on the tiny checkpoints in DeepSeek's layout: FP8
//! activations into every FP8/FP4 projection, FP8 KV, Hadamard-rotated FP4 indexer queries
//! and keys. Reference numerics stays as tests/golden.rs checks it against HF.

mod common;

use common::*;
use deepinfer_engine::cache::{default_block_tokens, CacheLayout};
use deepinfer_model::kernels::topk::argmax;
use deepinfer_model::numerics::Numerics;
use deepinfer_model::record;
use deepinfer_model::v4::Model;
use serde_json::Value;

/// Logits relative to the largest reference logit (at least 1): a quantisation step that
/// rounds the other way after a different summation order moves one activation by an FP8 or
/// FP4 step, far more than f32 rounding, so the bound is looser than the HF goldens' 1e-4.
const REL_TOL: f32 = 1e-3;

fn official(config: &str) -> Model {
    let mut m = load(config, "official");
    m.set_numerics(Numerics::Official).unwrap();
    m
}

fn rel_diff(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    max_abs_diff(got, want) / scale
}

/// Teacher-forced prompt + greedy tokens, fed in chunks of `chunk`: the prompt positions'
/// argmax, the last prompt position's logits and every greedy step's top logits and choice.
fn check_prompt(r: &mut TestRunner, g: &Golden, p: &Value, chunk: usize, label: &str) {
    let pi = p["index"].as_u64().unwrap();
    let (prompt, greedy, seq) = teacher_forced(p);
    let tie_safe = p["tie_safe"].as_bool().unwrap();
    let logits = chunked_logits(r, &seq, chunk);
    let n = prompt.len();
    let diff = rel_diff(&logits[n - 1], &g.f32s(&format!("p{pi}.last_logits")));
    let argmax_want = g.i64s(&format!("p{pi}.argmax"));
    let agree = (0..n)
        .filter(|&i| argmax(&logits[i]) as i64 == argmax_want[i])
        .count();
    let (top_ids, top_logits) = (
        g.i64s(&format!("p{pi}.top_ids")),
        g.f32s(&format!("p{pi}.top_logits")),
    );
    let k = top_ids.len() / greedy.len();
    let (mut step_diff, mut greedy_agree) = (0.0f32, 0);
    for (s, &tok) in greedy.iter().enumerate() {
        let row = &logits[n - 1 + s];
        greedy_agree += usize::from(argmax(row) as u32 == tok);
        let want: Vec<f32> = top_logits[s * k..(s + 1) * k].to_vec();
        let got: Vec<f32> = (0..k).map(|j| row[top_ids[s * k + j] as usize]).collect();
        let scale = row.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        step_diff = step_diff.max(max_abs_diff(&got, &want) / scale);
    }
    eprintln!(
        "{label} p{pi} len {n}: last-logit rel diff {diff:.2e}, step rel diff {step_diff:.2e}, \
         argmax {agree}/{n}, greedy {greedy_agree}/{}, tie_safe {tie_safe}",
        greedy.len()
    );
    if tie_safe {
        assert!(
            diff <= REL_TOL,
            "{label} p{pi}: last logits differ by {diff}"
        );
        assert!(
            step_diff <= REL_TOL,
            "{label} p{pi}: step logits differ by {step_diff}"
        );
        assert_eq!(agree, n, "{label} p{pi}: per-position argmax differs");
        assert_eq!(
            greedy_agree,
            greedy.len(),
            "{label} p{pi}: greedy tokens differ"
        );
    } else {
        // A near-tied router or indexer choice may go the other way; still demand agreement
        // almost everywhere so that a real bug cannot hide behind the flag.
        assert!(
            agree * 10 >= n * 9,
            "{label} p{pi}: only {agree}/{n} argmax agree"
        );
    }
}

fn check_config(config: &str) {
    let g = Golden::load_named(config, "official_golden");
    assert_eq!(g.meta["numerics"], "official");
    let mut r = runner(official(config), 1, 0);
    assert!(g.prompts().iter().any(|p| p["tie_safe"].as_bool().unwrap()));
    for p in g.prompts() {
        check_prompt(
            &mut r,
            &g,
            p,
            usize::MAX,
            &format!("{config}/official whole"),
        );
        check_prompt(&mut r, &g, p, 5, &format!("{config}/official chunks of 5"));
    }
}

#[test]
fn tiny_a_matches_deepseeks_numerics() {
    check_config("tiny-a");
}

#[test]
fn tiny_b_matches_deepseeks_numerics() {
    check_config("tiny-b");
}

#[test]
fn tiny_c_matches_deepseeks_numerics() {
    check_config("tiny-c");
}

/// The two modes differ (the quantisation is really applied), and official numerics stays
/// batch invariant: a prompt fed whole, in chunks, or one token at a time gives every position
/// the same bits, as a cached prefix must.
#[test]
fn official_numerics_is_applied_and_chunking_changes_no_bit() {
    let g = Golden::load_named("tiny-a", "official_golden");
    let seq = ids(&g.prompts()[2]["ids"]);
    let mut reference = runner(load("tiny-a", "official"), 1, 0);
    let plain = chunked_logits(&mut reference, &seq, usize::MAX);
    let mut r = runner(official("tiny-a"), 1, 0);
    let whole = chunked_logits(&mut r, &seq, usize::MAX);
    let d = rel_diff(&whole[seq.len() - 1], &plain[seq.len() - 1]);
    assert!(d > 1e-3, "official and reference logits differ by only {d}");
    for chunk in [1, 7] {
        let parts = chunked_logits(&mut r, &seq, chunk);
        for (i, (a, b)) in whole.iter().zip(&parts).enumerate() {
            assert!(same_bits(a, b), "chunks of {chunk}: position {i} differs");
        }
    }
}

#[test]
fn official_numerics_refuses_an_indexer_it_cannot_rotate() {
    let mut m = load("tiny-a", "official");
    m.config.index_head_dim = 48;
    let e = m.set_numerics(Numerics::Official).unwrap_err().to_string();
    assert!(e.contains("power-of-two"), "{e}");
    m.set_numerics(Numerics::Reference).unwrap();
}

/// Official numerics keeps packed records in every pool (the goldens above ran on them: the
/// records are lossless), reference f32; pending rows stay f32 in both.
#[test]
fn official_pools_hold_packed_records() {
    let reference = load("tiny-a", "official");
    let official = official("tiny-a");
    let layout =
        |m: &Model| CacheLayout::new(&m.config, 0, default_block_tokens(&m.config), 0).unwrap();
    let (r, o) = (layout(&reference), layout(&official));
    let c = &official.config;
    // head_dim 96 = 48 FP8 + 1 scale byte + 48 bf16 RoPE dims (96 bytes): 145 → 148 bytes.
    assert_eq!(record::kv_words(c), 37);
    // index_head_dim 64 = 32 bytes of FP4 pairs + 2 scale bytes: 34 → 36 bytes.
    assert_eq!(record::key_words(c), 9);
    for (pr, po) in r.pools.iter().zip(&o.pools) {
        let want = if po.name == "indexer_keys" { 9 } else { 37 };
        assert_eq!(
            (pr.width, po.width),
            (if want == 9 { 64 } else { 96 }, want),
            "{}",
            po.name
        );
    }
    for (lr, lo) in r.layers.iter().zip(&o.layers) {
        assert_eq!((lr.window.width, lo.window.width), (96, 37));
        let rows = |p: Option<deepinfer_engine::cache::layout::Ring>| p.map(|p| (p.slots, p.width));
        assert_eq!(rows(lr.attn_pending), rows(lo.attn_pending));
        assert_eq!(rows(lr.index_pending), rows(lo.index_pending));
    }
}
