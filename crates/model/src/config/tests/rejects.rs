//! One test per rule a config can break, in either flavour.

use super::*;
use MlpKind::Scored;

fn err(s: &str) -> String {
    ModelConfig::from_json_str(s)
        .expect_err("config should be rejected")
        .to_string()
}

fn assert_err(s: &str, parts: &[&str]) {
    let msg = err(s);
    for p in parts {
        assert!(msg.contains(p), "error {msg:?} should contain {p:?}");
    }
}

fn with(key: &str, v: Value) -> String {
    edit(TINY_HF, &[(key, Some(v))])
}

#[test]
fn rejects_bad_json_and_unknown_flavour() {
    assert_err("{", &["not valid JSON"]);
    assert_err("[1]", &["must be a JSON object"]);
    assert_err(r#"{"vocab_size": 5}"#, &["hidden_size", "dim"]);
    assert_err(
        &with("model_type", "deepseek_v42".into()),
        &["model_type", "deepseek_v42"],
    );
    // A V4.1 config must say where its compressed layers' state comes from.
    assert_err(
        &with("model_type", "deepseek_v41".into()),
        &["compress_ratios"],
    );
}

#[test]
fn rejects_zero_sizes() {
    for key in [
        "hidden_size",
        "num_attention_heads",
        "vocab_size",
        "num_hidden_layers",
    ] {
        assert_err(&with(key, 0.into()), &[&format!("`{key}` = 0"), "> 0"]);
    }
    assert_err(
        &with("hidden_size", (-3).into()),
        &["hidden_size", "-3", "non-negative integer"],
    );
    assert_err(&with("hidden_size", 2.5.into()), &["hidden_size", "2.5"]);
    assert_err(
        &with("hidden_size", "256".into()),
        &["hidden_size", "\"256\""],
    );
}

#[test]
fn rejects_bad_head_dims() {
    let legacy = |changes: &[(&str, Value)]| {
        let changes: Vec<(&str, Option<Value>)> =
            changes.iter().map(|(k, v)| (*k, Some(v.clone()))).collect();
        edit(TINY_LEGACY, &changes)
    };
    assert_err(
        &legacy(&[("head_dim", 129.into())]),
        &["`head_dim` = 129", "even"],
    );
    assert_err(
        &legacy(&[("head_dim", 48.into())]),
        &["`head_dim` = 48", "qk_rope_head_dim = 64"],
    );
    assert_err(
        &legacy(&[("qk_rope_head_dim", 63.into())]),
        &["`qk_rope_head_dim` = 63", "even"],
    );
    assert_err(
        &legacy(&[("qk_rope_head_dim", 0.into())]),
        &["`qk_rope_head_dim` = 0"],
    );
    assert_err(
        &with("head_dim", 127.into()),
        &["`qk_rope_head_dim` = 63", "even"],
    );
    assert_err(
        &with("index_head_dim", 32.into()),
        &["`index_head_dim` = 32", "qk_rope_head_dim = 64"],
    );
    assert_err(
        &with("partial_rotary_factor", 1.5.into()),
        &["partial_rotary_factor", "1.5", "(0, 1]"],
    );
    assert_err(
        &legacy(&[("partial_rotary_factor", 0.25.into())]),
        &[
            "`qk_rope_head_dim` = 64",
            "partial_rotary_factor 0.25",
            "= 32",
        ],
    );
    assert_err(
        &with("partial_rotary_factor", 0.25.into()),
        &["rope_parameters.main.partial_rotary_factor", "0.5", "32"],
    );
}

#[test]
fn rejects_groups_not_dividing_heads() {
    assert_err(
        &with("o_groups", 3.into()),
        &["`o_groups` = 3", "num_attention_heads = 4"],
    );
    assert_err(&with("o_groups", 0.into()), &["`o_groups` = 0"]);
}

#[test]
fn rejects_schedule_length_mismatch() {
    let s = with(
        "layer_types",
        serde_json::json!(["sliding_attention", "compressed_sparse_attention"]),
    );
    assert_err(&s, &["`layer_types` = 2 entries", "num_hidden_layers = 4"]);
    let s = with("mlp_layer_types", serde_json::json!(["moe"]));
    assert_err(&s, &["`mlp_layer_types` = 1 entries"]);
    let s = edit(
        TINY_LEGACY,
        &[("compress_ratios", Some(serde_json::json!([0, 4])))],
    );
    assert_err(&s, &["`layer_types` = 2 entries"]);
    let s = edit(
        FLASH_OFFICIAL,
        &[("compress_ratios", Some(serde_json::json!([0, 4])))],
    );
    assert_err(&s, &["`compress_ratios` = 2 entries", "n_layers = 43"]);
    // Longer lists are cut, as HF does.
    let s = with(
        "mlp_layer_types",
        serde_json::json!(["moe", "moe", "moe", "moe", "hash_moe"]),
    );
    assert_eq!(parse(&s).mlp_layer_types, [Scored; 4]);
}

#[test]
fn rejects_unknown_layer_type_strings() {
    let s = with(
        "layer_types",
        serde_json::json!(["sliding_attention", "full_attention", "x", "y"]),
    );
    assert_err(
        &s,
        &["`layer_types[1]` = \"full_attention\"", "sliding_attention"],
    );
    let s = with(
        "mlp_layer_types",
        serde_json::json!(["moe", "dense", "moe", "moe"]),
    );
    assert_err(&s, &["`mlp_layer_types[1]` = \"dense\"", "hash_moe"]);
    let s = with(
        "compress_rates",
        serde_json::json!({"sliding_attention": 0}),
    );
    assert_err(&s, &["`compress_rates` = \"sliding_attention\""]);
    let s = with("scoring_func", "relu".into());
    assert_err(&s, &["`scoring_func` = \"relu\"", "sqrtsoftplus"]);
    let s = edit(FLASH_OFFICIAL, &[("score_func", Some("tanh".into()))]);
    assert_err(&s, &["`score_func` = \"tanh\""]);
    let mut v: Value = serde_json::from_str(TINY_HF).unwrap();
    v["rope_parameters"]["compress"]["rope_type"] = "longrope".into();
    assert_err(
        &v.to_string(),
        &["rope_parameters.compress.rope_type", "longrope"],
    );
}

#[test]
fn rejects_bad_compress_rates() {
    let s = with(
        "compress_rates",
        serde_json::json!({"compressed_sparse_attention": 1,
        "heavily_compressed_attention": 8}),
    );
    assert_err(
        &s,
        &["`compress_rates.compressed_sparse_attention` = 1", ">= 2"],
    );
    let s = with(
        "compress_rates",
        serde_json::json!({"compressed_sparse_attention": 4,
        "heavily_compressed_attention": 0}),
    );
    assert_err(&s, &["`compress_rates.heavily_compressed_attention` = 0"]);
    let s = with(
        "compress_rates",
        serde_json::json!({"compressed_sparse_attention": 4}),
    );
    assert_err(
        &s,
        &["lacks required field `compress_rates.heavily_compressed_attention`"],
    );
    // Legacy HF ratios: one HCA rate, consistent with any explicit rate.
    let s = edit(
        TINY_LEGACY,
        &[("compress_ratios", Some(serde_json::json!([0, 4, 8, 16])))],
    );
    assert_err(&s, &["`compress_ratios[3]` = 16", "already 8"]);
    let s = edit(TINY_LEGACY, &[("compress_rate_hca", Some(128.into()))]);
    assert_err(&s, &["`compress_ratios[2]` = 8", "already 128"]);
    let s = edit(TINY_LEGACY, &[("compress_rate_csa", Some(8.into()))]);
    assert_err(&s, &["`compress_ratios[1]` = 4", "CSA rate is set to 8"]);
    let s = edit(
        FLASH_OFFICIAL,
        &[(
            "compress_ratios",
            Some(serde_json::json!([
                0, 0, 4, 128, 4, 64, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                128, 4
            ])),
        )],
    );
    assert_err(
        &s,
        &["`compress_ratios[5]` = 64", "HCA ratio 128 of layer 3"],
    );
    let s = edit(
        FLASH_OFFICIAL,
        &[(
            "compress_ratios",
            Some(serde_json::json!([
                0, 0, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1,
                4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4, 1, 4
            ])),
        )],
    );
    assert_err(&s, &["`compress_ratios` = 1", ">= 2"]);
}

#[test]
fn rejects_too_many_active_experts() {
    assert_err(
        &with("num_experts_per_tok", 9.into()),
        &["`num_experts_per_tok` = 9", "n_routed_experts = 8"],
    );
    let s = edit(FLASH_OFFICIAL, &[("n_activated_experts", Some(300.into()))]);
    assert_err(
        &s,
        &["`n_activated_experts` = 300", "n_routed_experts = 256"],
    );
}

#[test]
fn rejects_small_counts() {
    assert_err(&with("index_topk", 0.into()), &["`index_topk` = 0", ">= 1"]);
    assert_err(&with("hc_mult", 0.into()), &["`hc_mult` = 0", ">= 1"]);
    assert_err(
        &with("hc_sinkhorn_iters", 0.into()),
        &["`hc_sinkhorn_iters` = 0", ">= 1"],
    );
    assert_err(
        &with("sliding_window", 0.into()),
        &["`sliding_window` = 0", ">= 1"],
    );
    let s = edit(FLASH_OFFICIAL, &[("window_size", Some(0.into()))]);
    assert_err(&s, &["`window_size` = 0"]);
}

#[test]
fn rejects_bad_floats() {
    assert_err(
        &with("rms_norm_eps", 0.into()),
        &["`rms_norm_eps` = 0", "> 0"],
    );
    assert_err(
        &with("rms_norm_eps", 1e-50.into()),
        &["`rms_norm_eps` = 0", "as f32"],
    );
    assert_err(&with("hc_eps", (-1.0).into()), &["`hc_eps` = -1"]);
    assert_err(
        &with("routed_scaling_factor", 0.into()),
        &["`routed_scaling_factor` = 0"],
    );
    assert_err(
        &with("swiglu_limit", 0.into()),
        &["`swiglu_limit` = 0", "> 0"],
    );
    assert_err(
        &with("norm_topk_prob", 1.into()),
        &["`norm_topk_prob` = 1", "true or false"],
    );
    let mut v: Value = serde_json::from_str(TINY_HF).unwrap();
    v["rope_parameters"]["compress"]["factor"] = 0.into();
    assert_err(&v.to_string(), &["`rope_parameters.compress.factor` = 0"]);
    v["rope_parameters"]["compress"]["factor"] = 16.into();
    v["rope_parameters"]["main"]["rope_theta"] = 1.into();
    assert_err(&v.to_string(), &["`rope_theta` = 1", "> 1"]);
    let s = edit(FLASH_OFFICIAL, &[("norm_eps", Some((-1e-6).into()))]);
    assert_err(&s, &["`norm_eps` = -0.000001"]);
}

#[test]
fn rejects_missing_official_keys() {
    for key in [
        "dim",
        "n_layers",
        "n_heads",
        "moe_inter_dim",
        "n_routed_experts",
        "n_activated_experts",
        "compress_ratios",
    ] {
        let s = edit(FLASH_OFFICIAL, &[(key, None)]);
        if key == "dim" {
            // Still detected as official through n_layers.
            assert_err(&s, &["lacks required field `dim`"]);
        } else {
            assert_err(&s, &[&format!("lacks required field `{key}`")]);
        }
    }
}

#[test]
fn rejects_bad_token_ids() {
    assert_err(
        &with("eos_token_id", serde_json::json!([1, "x"])),
        &["`eos_token_id[1]` = \"x\""],
    );
    assert_err(
        &with("bos_token_id", (1u64 << 40).into()),
        &["`bos_token_id` = 1099511627776", "u32"],
    );
}

/// Sizes that size memory or loops have upper bounds far above any DeepSeek-V4; a corrupted
/// value is refused by name before anything is allocated or looped over.
#[test]
fn rejects_absurd_sizes_by_name() {
    let huge = |v: u64| Value::from(v);
    for (key, v) in [
        ("num_hidden_layers", 1_000_000_000_000_000_000),
        ("hc_sinkhorn_iters", 1_000_000_000_000),
        ("index_topk", 1_000_000_000_000),
        ("hc_mult", 17),
        ("sliding_window", 1 << 40),
        ("vocab_size", 1 << 40),
        ("n_routed_experts", 1 << 20),
    ] {
        assert_err(&with(key, huge(v)), &[&format!("`{key}` = {v}"), "at most"]);
    }
    let official = edit(FLASH_OFFICIAL, &[("n_layers", Some(huge(1 << 60)))]);
    assert_err(&official, &["`n_layers`", "at most"]);
    // The context is not bounded here: the engine sizes everything from its own limit.
    ModelConfig::from_json_str(&with("max_position_embeddings", huge(100_000_000_000))).unwrap();
}

#[test]
fn rejects_configs_that_describe_another_model() {
    for (key, v, part) in [
        ("hidden_act", Value::from("gelu"), "silu"),
        (
            "architectures",
            serde_json::json!(["LlamaForCausalLM"]),
            "DeepseekV4ForCausalLM",
        ),
        ("tie_word_embeddings", Value::from(true), "output head"),
        ("expert_dtype", Value::from("int4"), "fp4"),
        ("eos_token_id", Value::from(512), "outside the vocabulary"),
        ("bos_token_id", Value::from(9999), "outside the vocabulary"),
    ] {
        assert_err(&with(key, v), &[&format!("`{key}`"), part]);
    }
    let q = |block: Value| serde_json::json!({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": block});
    assert_err(
        &with("quantization_config", q(serde_json::json!([0, 0]))),
        &["`quantization_config.weight_block_size` = [0, 0]", ">= 1"],
    );
    assert_err(
        &with("quantization_config", q(serde_json::json!([128]))),
        &["weight_block_size"],
    );
    let official = edit(FLASH_OFFICIAL, &[("expert_dtype", Some("nf4".into()))]);
    assert_err(&official, &["`expert_dtype` = \"nf4\""]);
    // What real checkpoints declare is accepted.
    ModelConfig::from_json_str(&with("hidden_act", "silu".into())).unwrap();
    ModelConfig::from_json_str(&with(
        "quantization_config",
        q(serde_json::json!([128, 128])),
    ))
    .unwrap();
    ModelConfig::from_json_str(FLASH_OFFICIAL).unwrap();
}
