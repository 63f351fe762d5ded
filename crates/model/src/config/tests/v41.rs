//! V4.1 configs (docs/MODEL.md §1.1, §8): the text model nested in `text_config`, the topology of
//! sources and readers, and the rules that keep every reader supplied.

use super::*;
use crate::synth::preset;

/// A key of `text_config` set (or removed).
type Change<'a> = (&'a str, Option<Value>);

/// The `tiny-v41` preset's config.json, with `changes` applied to its `text_config`.
fn tiny_v41(changes: &[Change]) -> String {
    let mut v = preset("tiny-v41").unwrap().config_json();
    let text = v["text_config"].as_object_mut().unwrap();
    for (k, val) in changes {
        match val {
            Some(val) => text.insert(k.to_string(), val.clone()),
            None => text.remove(*k),
        };
    }
    v.to_string()
}

fn err(s: &str) -> String {
    ModelConfig::from_json_str(s)
        .expect_err("config should be rejected")
        .to_string()
}

#[test]
fn reads_the_text_config_and_the_topology() {
    let c = parse(&tiny_v41(&[]));
    let v = c.v41.as_ref().expect("a V4.1 config");
    use AttnKind::{Shared, Sliding};
    assert_eq!(c.layer_types, [Sliding, Shared, Shared, Shared, Shared]);
    assert_eq!(c.mlp_layer_types, [MlpKind::Scored; 5]);
    assert_eq!(
        (0..5).map(|l| c.compress_ratio(l)).collect::<Vec<_>>(),
        [0, 2, 2, 1, 1]
    );
    assert_eq!(
        (0..5).map(|l| v.kv_source(l)).collect::<Vec<_>>(),
        [None, Some(1), Some(1), Some(3), Some(3)]
    );
    assert_eq!(
        (0..5).map(|l| v.index_source(l)).collect::<Vec<_>>(),
        [None, Some(1), Some(1), Some(3), Some(4)]
    );
    assert_eq!(
        (0..5).map(|l| v.uses_candidates(l)).collect::<Vec<_>>(),
        [false, false, false, false, true]
    );
    assert_eq!(v.engram_index(3), Some(1));
    assert_eq!(v.engram_index(2), None);
    let e = v.engram.as_ref().unwrap();
    assert_eq!(
        (e.max_ngram_size, e.compressed_vocab_size, e.pad_token_id),
        (4, 99_092, 2)
    );
    // The same keys at the top level (a text-only export) mean the same model.
    let flat = {
        let full: Value = serde_json::from_str(&tiny_v41(&[])).unwrap();
        let mut text = full["text_config"].clone();
        text["model_type"] = "deepseek_v41".into();
        text.to_string()
    };
    assert_eq!(parse(&flat).v41, c.v41);
    // A V4 config has none of it.
    assert!(parse(TINY_HF).v41.is_none());
}

#[test]
fn rejects_a_broken_topology() {
    let cases: [(&[Change], &[&str]); 9] = [
        (
            &[("compress_ratios", Some(json_list(&[0, 4, 2, 1, 1])))],
            &["compress_ratios[1]", "1 or 2"],
        ),
        (
            &[("kv_source_layer_ids", Some(json_list(&[3])))],
            &["compress_ratios[1]", "kv_source_layer_ids"],
        ),
        (
            &[("compress_ratios", Some(json_list(&[0, 2, 1, 1, 1])))],
            &["compress_ratios[2]", "compresses by"],
        ),
        (
            &[("kv_source_layer_ids", Some(json_list(&[1, 2, 3])))],
            &["compress_ratios[2]", "another kv source"],
        ),
        (
            &[("index_source_layer_ids", Some(json_list(&[1, 4])))],
            &["compress_ratios[3]", "another kv source"],
        ),
        (
            &[("kv_source_layer_ids", Some(json_list(&[1, 9])))],
            &["kv_source_layer_ids[1]", "not a layer"],
        ),
        (
            &[("candidate_topk_blocks", Some(1.into()))],
            &["candidate_topk_blocks", "cover index_topk"],
        ),
        (
            &[("engram_layer_ids", Some(json_list(&[0, 3])))],
            &["engram_layer_ids[0]", "1..5"],
        ),
        (
            &[("num_hash_layers", Some(2.into()))],
            &["num_hash_layers", "no hash-routed"],
        ),
    ];
    for (changes, parts) in cases {
        let msg = err(&tiny_v41(changes));
        for p in parts {
            assert!(msg.contains(p), "error {msg:?} should contain {p:?}");
        }
    }
    let msg = err(&tiny_v41(&[("engram_n_heads", None)]));
    assert!(msg.contains("engram_n_heads"), "{msg}");
    let msg = err(&tiny_v41(&[("model_type", Some("deepseek_v4".into()))]));
    assert!(msg.contains("text_config.model_type"), "{msg}");
}

fn json_list(v: &[usize]) -> Value {
    serde_json::json!(v)
}

#[test]
fn reads_the_dspark_fields() {
    let dspark = [
        ("dspark_target_layer_ids", Some(json_list(&[3, 4, 5]))),
        ("dspark_markov_rank", Some(16.into())),
        ("num_nextn_predict_layers", Some(3.into())),
        ("dspark_n_routed_experts", Some(6.into())),
    ];
    let c = parse(&tiny_v41(&dspark));
    let d = c.dspark.expect("a drafter");
    assert_eq!(d.target_layer_ids, [3, 4, 5]);
    // V4.1's ids name the streams entering a layer (5: the final ones).
    assert_eq!(d.aux_layers, [3, 4, 5]);
    // Unset fields take V4.1's values (block 5, noise 128799) or the main MoE's.
    assert_eq!(
        (d.block_size, d.noise_token_id, d.markov_rank),
        (5, 128_799, 16)
    );
    assert_eq!(
        (d.stages, d.n_routed_experts, d.num_experts_per_tok),
        (3, 6, 2)
    );
    assert!(parse(&tiny_v41(&[])).dspark.is_none());
    let mut bad = dspark.to_vec();
    bad[0] = ("dspark_target_layer_ids", Some(json_list(&[0, 4])));
    let msg = err(&tiny_v41(&bad));
    assert!(msg.contains("dspark_target_layer_ids[0]"), "{msg}");
    let msg = err(&tiny_v41(&dspark[..1]));
    assert!(msg.contains("dspark_markov_rank"), "{msg}");
    let mut bad = dspark.to_vec();
    bad.push(("dspark_noise_token_id", Some(129_280.into())));
    let msg = err(&tiny_v41(&bad));
    assert!(msg.contains("text_config.dspark_noise_token_id"), "{msg}");
}

#[test]
fn token_ids_must_fit_32_bits() {
    let msg = err(&tiny_v41(&[("image_token_id", Some((1u64 << 32).into()))]));
    assert!(msg.contains("text_config.image_token_id"), "{msg}");
    let msg = err(&tiny_v41(&[(
        "engram_pad_token_id",
        Some((1u64 << 33).into()),
    )]));
    assert!(msg.contains("engram_pad_token_id"), "{msg}");
}
