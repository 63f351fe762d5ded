//! HF `deepseek_v4` configs: current keys, legacy keys, and HF's defaults.

use super::*;
use AttnKind::{Csa, Hca, Sliding};
use MlpKind::{Hash, Scored};

fn flash_yarn() -> Yarn {
    Yarn {
        factor: 16.0,
        original_max_position_embeddings: 65536.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    }
}

#[test]
fn tiny_hf_config() {
    let c = parse(TINY_HF);
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.num_hidden_layers),
        (512, 256, 4)
    );
    assert_eq!(
        (c.num_attention_heads, c.head_dim, c.qk_rope_head_dim),
        (4, 128, 64)
    );
    assert_eq!(
        (c.q_lora_rank, c.o_groups, c.o_lora_rank, c.sliding_window),
        (128, 2, 128, 8)
    );
    assert_eq!(c.layer_types, [Sliding, Csa, Hca, Csa]);
    assert_eq!((c.compress_rate_csa, c.compress_rate_hca), (4, 8));
    assert_eq!(
        (0..4).map(|l| c.compress_ratio(l)).collect::<Vec<_>>(),
        [0, 4, 8, 4]
    );
    assert_eq!(c.mlp_layer_types, [Hash, Hash, Scored, Scored]);
    assert_eq!(
        (c.index_n_heads, c.index_head_dim, c.index_topk),
        (16, 128, 3)
    );
    assert_eq!(
        (
            c.n_routed_experts,
            c.num_experts_per_tok,
            c.n_shared_experts
        ),
        (8, 2, 1)
    );
    assert_eq!(c.moe_intermediate_size, 128);
    assert_eq!(c.scoring_func, ScoringFunc::SqrtSoftplus);
    assert!(c.norm_topk_prob);
    assert_eq!((c.routed_scaling_factor, c.swiglu_limit), (1.5, 1.0));
    assert_eq!(
        (c.hc_mult, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps),
        (4, 20, 1e-6, 1e-6)
    );
    assert_eq!(
        c.rope_main,
        RopeParams {
            theta: 10000.0,
            yarn: None
        }
    );
    assert_eq!(
        c.rope_compress,
        RopeParams {
            theta: 160000.0,
            yarn: Some(flash_yarn())
        }
    );
    assert_eq!(
        (c.max_position_embeddings, c.num_nextn_predict_layers),
        (4096, 1)
    );
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(0), vec![1])
    );
}

#[test]
fn hf_legacy_keys_fold_like_hf() {
    let c = parse(TINY_LEGACY);
    let t = parse(TINY_HF);
    assert_eq!(c.layer_types, t.layer_types, "trailing MTP ratio dropped");
    assert_eq!((c.compress_rate_csa, c.compress_rate_hca), (4, 8));
    assert_eq!(c.mlp_layer_types, t.mlp_layer_types);
    assert_eq!(c.qk_rope_head_dim, 64);
    assert_eq!(c.rope_main, t.rope_main);
    assert_eq!(
        c.rope_compress, t.rope_compress,
        "YaRN only on the compress table"
    );
    assert_eq!((c.bos_token_id, c.eos_token_ids), (None, vec![1, 2]));
}

#[test]
fn v4_flash_hf_config() {
    let c = parse(&flash_hf());
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.num_attention_heads),
        (4096, 43, 64)
    );
    assert_eq!(c.layer_types.len(), 43);
    assert_eq!(&c.layer_types[..2], [Sliding, Sliding]);
    for l in 2..43 {
        let want = if l % 2 == 0 { Csa } else { Hca };
        assert_eq!(c.layer_types[l], want, "layer {l}");
    }
    assert_eq!(c.layer_types.iter().filter(|k| **k == Csa).count(), 21);
    assert_eq!(c.layer_types.iter().filter(|k| **k == Hca).count(), 20);
    assert_eq!(
        (
            c.compress_ratio(2),
            c.compress_ratio(3),
            c.compress_ratio(0)
        ),
        (4, 128, 0)
    );
    assert_eq!(c.mlp_layer_types.iter().filter(|k| **k == Hash).count(), 3);
    assert_eq!(&c.mlp_layer_types[..4], [Hash, Hash, Hash, Scored]);
    assert_eq!((c.qk_rope_head_dim, c.head_dim), (64, 512));
    assert_eq!(
        c.rope_main,
        RopeParams {
            theta: 10000.0,
            yarn: None
        }
    );
    assert_eq!(
        c.rope_compress,
        RopeParams {
            theta: 160000.0,
            yarn: Some(flash_yarn())
        }
    );
    assert_eq!(
        (
            c.n_routed_experts,
            c.num_experts_per_tok,
            c.moe_intermediate_size
        ),
        (256, 6, 2048)
    );
    assert_eq!(
        (c.index_topk, c.routed_scaling_factor, c.swiglu_limit),
        (512, 1.5, 10.0)
    );
    assert_eq!(c.max_position_embeddings, 1 << 20);
}

#[test]
fn hf_defaults_follow_hf_config_class() {
    let c = parse(r#"{"hidden_size": 4096}"#);
    assert_eq!(c.num_hidden_layers, 43);
    assert_eq!(
        &c.layer_types[..5],
        [Hca, Hca, Csa, Hca, Csa],
        "V4-Pro default schedule"
    );
    assert_eq!(c.layer_types[42], Csa);
    assert_eq!(&c.mlp_layer_types[..4], [Hash, Hash, Hash, Scored]);
    assert_eq!(
        (c.head_dim, c.qk_rope_head_dim, c.sliding_window),
        (512, 64, 128)
    );
    assert_eq!((c.compress_rate_csa, c.compress_rate_hca), (4, 128));
    assert_eq!(
        c.rope_compress,
        RopeParams {
            theta: 160000.0,
            yarn: None
        }
    );
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(0), vec![1])
    );
    assert_eq!((c.swiglu_limit, c.routed_scaling_factor), (10.0, 1.5));
}

#[test]
fn hf_rope_variants() {
    // Flat `rope_parameters` (no main/compress) is the compress YaRN spec; missing
    // original length and factor fall back as in HF, zero betas mean the defaults.
    let s = edit(
        TINY_HF,
        &[(
            "rope_parameters",
            Some(serde_json::json!({"rope_type": "yarn", "beta_fast": 0, "attention_factor": 1.3})),
        )],
    );
    let c = parse(&s);
    assert_eq!(
        c.rope_main,
        RopeParams {
            theta: 10000.0,
            yarn: None
        }
    );
    let y = Yarn {
        factor: 1.0,
        original_max_position_embeddings: 4096.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    assert_eq!(
        c.rope_compress,
        RopeParams {
            theta: 160000.0,
            yarn: Some(y)
        }
    );
    // `rope_scaling` wins over `rope_parameters`.
    let s = edit(
        &s,
        &[(
            "rope_scaling",
            Some(serde_json::json!({"type": "yarn", "factor": 4})),
        )],
    );
    assert_eq!(parse(&s).rope_compress.yarn.unwrap().factor, 4.0);
    // Nested entries without a theta take the top-level `rope_theta`, as HF fills them.
    let s = edit(
        TINY_HF,
        &[(
            "rope_parameters",
            Some(
                serde_json::json!({"main": {"rope_type": "default"}, "compress": {"rope_type": "default"}}),
            ),
        )],
    );
    let c = parse(&s);
    assert_eq!(
        (c.rope_main.theta, c.rope_compress.theta),
        (10000.0, 10000.0)
    );
    assert_eq!(c.rope_compress.yarn, None);
    // Nothing at all: default rope for both tables.
    let s = edit(TINY_HF, &[("rope_parameters", None)]);
    assert_eq!(
        parse(&s).rope_compress,
        RopeParams {
            theta: 160000.0,
            yarn: None
        }
    );
}

#[test]
fn rope_width_sources() {
    // Legacy qk_rope_head_dim alone, nested factor alone, and agreement of both.
    let no_prf = edit(TINY_HF, &[("partial_rotary_factor", None)]);
    assert_eq!(
        parse(&no_prf).qk_rope_head_dim,
        64,
        "from rope_parameters.main"
    );
    let s = edit(TINY_LEGACY, &[("qk_rope_head_dim", Some(32.into()))]);
    assert_eq!(parse(&s).qk_rope_head_dim, 32);
    let s = edit(
        TINY_LEGACY,
        &[
            ("partial_rotary_factor", Some(0.25.into())),
            ("qk_rope_head_dim", None),
        ],
    );
    assert_eq!(
        parse(&s).qk_rope_head_dim,
        32,
        "factor alone: int(128 × 0.25)"
    );
}

/// A V4-Flash-0731-style config: the DSpark fields beside `num_nextn_predict_layers: 1`
/// (docs/MODEL.md §1.1), ids naming the streams that leave a layer.
#[test]
fn reads_a_v4_dspark_drafter() {
    let with = |extra: &str| TINY_HF.replacen('{', &format!("{{ {extra},"), 1);
    let c = parse(&with(
        r#""dspark_target_layer_ids": [1, 2, 3], "dspark_markov_rank": 16,
           "dspark_noise_token_id": 511"#,
    ));
    let d = c.dspark.expect("a drafter");
    assert_eq!(d.target_layer_ids, [1, 2, 3]);
    assert_eq!(
        d.aux_layers,
        [2, 3, 4],
        "after layer i = entering layer i + 1"
    );
    // Three stages whatever num_nextn_predict_layers says, the main model's experts.
    assert_eq!(
        (d.stages, d.n_routed_experts, d.num_experts_per_tok),
        (3, 8, 2)
    );
    assert_eq!((d.block_size, d.noise_token_id), (5, 511));
    assert_eq!(c.num_nextn_predict_layers, 1);
    let staged = parse(&with(
        r#""dspark_target_layer_ids": [3], "dspark_markov_rank": 16,
           "dspark_noise_token_id": 0, "n_mtp_layers": 2"#,
    ));
    assert_eq!(staged.dspark.unwrap().stages, 2);
    assert!(parse(TINY_HF).dspark.is_none());
    for (extra, field) in [
        (
            r#""dspark_target_layer_ids": [4], "dspark_markov_rank": 16, "dspark_noise_token_id": 0"#,
            "dspark_target_layer_ids[0]",
        ),
        (
            r#""dspark_target_layer_ids": [3], "dspark_markov_rank": 16"#,
            "dspark_noise_token_id",
        ),
        (
            r#""dspark_target_layer_ids": [3], "dspark_markov_rank": 0, "dspark_noise_token_id": 0"#,
            "dspark_markov_rank",
        ),
    ] {
        let e = ModelConfig::from_json_str(&with(extra))
            .expect_err(extra)
            .to_string();
        assert!(e.contains(field), "{e}");
    }
}
