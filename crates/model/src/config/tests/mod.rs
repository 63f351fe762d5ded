//! Config tests, one file per flavour plus one for rejected configs. The fixtures here are
//! shared because the flavours are tested against each other and against the same rules.

mod hf;
mod official;
mod published;
mod rejects;
mod v41;

use super::*;

/// Spec §10.2's tiny config as HF's `save_pretrained` writes it (nested rope parameters,
/// explicit layer schedules, plenty of keys that do not matter here).
const TINY_HF: &str = r#"{
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": 512, "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 128, "q_lora_rank": 128, "o_groups": 2,
    "o_lora_rank": 128, "sliding_window": 8,
    "layer_types": ["sliding_attention", "compressed_sparse_attention",
                    "heavily_compressed_attention", "compressed_sparse_attention"],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe"],
    "index_n_heads": 16, "index_head_dim": 128, "index_topk": 3,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "moe_intermediate_size": 128, "scoring_func": "sqrtsoftplus", "norm_topk_prob": true,
    "routed_scaling_factor": 1.5, "swiglu_limit": 1.0, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-06, "rms_norm_eps": 1e-06, "partial_rotary_factor": 0.5,
    "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "rope_parameters": {
        "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16.0,
                     "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1,
                     "attention_factor": 1.0, "partial_rotary_factor": 0.5}},
    "max_position_embeddings": 4096, "num_nextn_predict_layers": 1,
    "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": null,
    "torch_dtype": "bfloat16", "id2label": {"0": "LABEL_0"}, "transformers_version": "5.23.0"
}"#;

fn parse(s: &str) -> ModelConfig {
    ModelConfig::from_json_str(s).unwrap_or_else(|e| panic!("{e}"))
}

/// Replaces (or, with `None`, removes) top-level keys of a JSON config.
fn edit(base: &str, changes: &[(&str, Option<Value>)]) -> String {
    let mut v: Value = serde_json::from_str(base).unwrap();
    let obj = v.as_object_mut().unwrap();
    for (k, val) in changes {
        match val {
            Some(val) => obj.insert(k.to_string(), val.clone()),
            None => obj.remove(*k),
        };
    }
    v.to_string()
}

/// The same model described only with the legacy keys HF folds in.
const TINY_LEGACY: &str = r#"{
    "model_type": "deepseek_v4", "vocab_size": 512, "hidden_size": 256,
    "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 128, "q_lora_rank": 128,
    "o_groups": 2, "o_lora_rank": 128, "sliding_window": 8,
    "compress_ratios": [0, 4, 8, 4, 0], "num_hash_layers": 2, "qk_rope_head_dim": 64,
    "index_n_heads": 16, "index_head_dim": 128, "index_topk": 3,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
    "swiglu_limit": 1.0, "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "max_position_embeddings": 4096, "eos_token_id": [1, 2], "bos_token_id": null,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    "expert_dtype": "fp4"
}"#;

/// V4-Flash as shipped (docs/MODEL.md §1.1): HF keys, legacy schedule fields.
fn flash_hf() -> String {
    let mut ratios = vec![0, 0];
    for _ in 0..20 {
        ratios.extend([4, 128]);
    }
    ratios.extend([4, 0]);
    assert_eq!(ratios.len(), 44);
    let base = serde_json::json!({
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
        "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
        "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
        "sliding_window": 128, "compress_ratios": ratios, "compress_rope_theta": 160000,
        "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 1048576, "index_n_heads": 64, "index_head_dim": 128,
        "index_topk": 512, "n_routed_experts": 256, "num_experts_per_tok": 6
    });
    let rest = serde_json::json!({
        "n_shared_experts": 1, "moe_intermediate_size": 2048, "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc", "norm_topk_prob": true, "routed_scaling_factor": 1.5,
        "num_hash_layers": 3, "swiglu_limit": 10.0, "hc_mult": 4, "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "num_nextn_predict_layers": 1,
        "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false,
        "expert_dtype": "fp4",
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                "quant_method": "fp8", "scale_fmt": "ue8m0",
                                "weight_block_size": [128, 128]}
    });
    let changes: Vec<(&str, Option<Value>)> = rest
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str(), Some(v.clone())))
        .collect();
    edit(&base.to_string(), &changes)
}

/// V4-Flash's own `inference/config.json` (as transcribed in spec sources).
const FLASH_OFFICIAL: &str = r#"{"vocab_size":129280,"dim":4096,"moe_inter_dim":2048,"n_layers":43,
    "n_hash_layers":3,"n_heads":64,"n_routed_experts":256,"n_shared_experts":1,
    "n_activated_experts":6,"score_func":"sqrtsoftplus","route_scale":1.5,"swiglu_limit":10.0,
    "q_lora_rank":1024,"head_dim":512,"rope_head_dim":64,"o_groups":8,"o_lora_rank":1024,
    "window_size":128,"original_seq_len":65536,"rope_theta":10000,"rope_factor":16,
    "beta_fast":32,"beta_slow":1,"index_n_heads":64,"index_head_dim":128,"index_topk":512,
    "hc_mult":4,"hc_sinkhorn_iters":20,"dtype":"fp8","scale_fmt":"ue8m0","expert_dtype":"fp4",
    "compress_rope_theta":160000,"compress_ratios":[0,0,4,128,4,128,4,128,4,128,4,128,4,128,
    4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,0]}"#;

#[test]
fn from_file_reads_and_reports_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("config.json");
    std::fs::write(&p, TINY_HF).unwrap();
    assert_eq!(ModelConfig::from_file(&p).unwrap().hidden_size, 256);
    let missing = dir.path().join("absent.json");
    let e = ModelConfig::from_file(&missing).unwrap_err().to_string();
    assert!(e.contains("absent.json"), "{e}");
}
