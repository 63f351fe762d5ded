//! DeepSeek `ModelArgs` configs, checked field by field against the HF flavour of the same
//! model.

use super::*;
use AttnKind::{Csa, Hca, Sliding};
use MlpKind::Scored;

/// Every architectural field, for comparing the two flavours of one model.
fn arch(c: &ModelConfig) -> String {
    let mut c = c.clone();
    c.bos_token_id = None;
    c.eos_token_ids.clear();
    format!("{c:?}")
}

#[test]
fn v4_flash_official_names_match_hf() {
    let off = parse(FLASH_OFFICIAL);
    let hf = parse(&flash_hf());
    assert_eq!(arch(&off), arch(&hf));
    assert_eq!((off.bos_token_id, off.eos_token_ids.len()), (None, 0));
    assert_eq!(
        off.max_position_embeddings,
        1 << 20,
        "65536 × 16 when max_seq_len is absent"
    );
}

#[test]
fn official_flavour_details() {
    // Pro-style schedule with another HCA ratio, softmax routing, no YaRN, no clamp.
    let s = r#"{"dim": 256, "n_layers": 4, "n_heads": 4, "moe_inter_dim": 128,
        "n_routed_experts": 8, "n_activated_experts": 2, "compress_ratios": [16, 16, 4, 0, 0],
        "score_func": "softmax", "head_dim": 128, "rope_head_dim": 32, "index_head_dim": 64,
        "o_groups": 2, "max_seq_len": 2048, "eos_token_id": 7}"#;
    let c = parse(s);
    assert_eq!(c.layer_types, [Hca, Hca, Csa, Sliding]);
    assert_eq!((c.compress_rate_csa, c.compress_rate_hca), (4, 16));
    assert_eq!(
        c.mlp_layer_types, [Scored; 4],
        "ModelArgs default: no hash layers"
    );
    assert_eq!(c.scoring_func, ScoringFunc::Softmax);
    assert!(
        !c.norm_topk_prob,
        "the reference renormalises only non-softmax scores"
    );
    assert_eq!(
        c.swiglu_limit,
        f32::INFINITY,
        "swiglu_limit 0 disables the clamp"
    );
    assert_eq!(c.routed_scaling_factor, 1.0);
    assert_eq!(
        c.rope_compress,
        RopeParams {
            theta: 40000.0,
            yarn: None
        }
    );
    assert_eq!(c.max_position_embeddings, 2048);
    assert_eq!(c.num_nextn_predict_layers, 1);
    assert_eq!((c.bos_token_id, c.eos_token_ids), (None, vec![7]));
}

#[test]
fn golden_fixture_configs_agree_across_flavours() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden");
    for name in ["tiny-a", "tiny-b"] {
        let (hf, off) = (
            root.join(name).join("hf/config.json"),
            root.join(name).join("official/config.json"),
        );
        if !hf.is_file() || !off.is_file() {
            continue;
        }
        let hf = ModelConfig::from_file(&hf).unwrap();
        let off = ModelConfig::from_file(&off).unwrap();
        let mut off_tokens = off.clone();
        off_tokens.bos_token_id = hf.bos_token_id;
        off_tokens.eos_token_ids = hf.eos_token_ids.clone();
        assert_eq!(format!("{off_tokens:?}"), format!("{hf:?}"), "{name}");
    }
}
