//! `bench` checked against docs/MODEL.md §4.1 from its plan alone: writing it takes 3 GB and a minute.

use std::collections::BTreeMap;

use safetensors::Dtype;

use crate::config::{AttnKind, MlpKind, ModelConfig};
use crate::synth::*;

/// Spec §4.1's rows for one layer of `bench`, with its numbers written out rather than
/// derived, so the plan is checked against the table and not against its own formulas.
fn bench_layer_expected(l: usize) -> Vec<(String, Dtype, Vec<usize>)> {
    let ratio = match l {
        0 | 1 => 0,
        _ if l.is_multiple_of(2) => 4,
        _ => 128,
    };
    block_expected(&format!("layers.{l}"), ratio, l < 3)
}

/// The rows of one block under prefix `p` (a layer or the MTP block).
fn block_expected(p: &str, ratio: usize, hash: bool) -> Vec<(String, Dtype, Vec<usize>)> {
    use Dtype::*;
    let mut v: Vec<(String, Dtype, Vec<usize>)> = Vec::new();
    let mut add = |n: &str, d: Dtype, s: &[usize]| v.push((format!("{p}.{n}"), d, s.to_vec()));
    add("attn_norm.weight", BF16, &[2048]);
    add("ffn_norm.weight", BF16, &[2048]);
    for h in ["hc_attn", "hc_ffn"] {
        add(&format!("{h}_fn"), F32, &[24, 8192]);
        add(&format!("{h}_base"), F32, &[24]);
        add(&format!("{h}_scale"), F32, &[3]);
    }
    for (n, w, s) in [
        ("attn.wq_a", [512, 2048], [4, 16]),
        ("attn.wq_b", [8192, 512], [64, 4]),
        ("attn.wkv", [512, 2048], [4, 16]),
        ("attn.wo_a", [2048, 2048], [16, 16]),
        ("attn.wo_b", [2048, 2048], [16, 16]),
        ("ffn.shared_experts.w1", [768, 2048], [6, 16]),
        ("ffn.shared_experts.w3", [768, 2048], [6, 16]),
        ("ffn.shared_experts.w2", [2048, 768], [16, 6]),
    ] {
        add(&format!("{n}.weight"), F8_E4M3, &w);
        add(&format!("{n}.scale"), F8_E8M0, &s);
    }
    add("attn.q_norm.weight", BF16, &[512]);
    add("attn.kv_norm.weight", BF16, &[512]);
    add("attn.attn_sink", F32, &[16]);
    if ratio == 4 {
        add("attn.compressor.wkv.weight", BF16, &[1024, 2048]);
        add("attn.compressor.wgate.weight", BF16, &[1024, 2048]);
        add("attn.compressor.ape", F32, &[4, 1024]);
        add("attn.compressor.norm.weight", BF16, &[512]);
        add("attn.indexer.wq_b.weight", F8_E4M3, &[2048, 512]);
        add("attn.indexer.wq_b.scale", F8_E8M0, &[16, 4]);
        add("attn.indexer.weights_proj.weight", BF16, &[16, 2048]);
        add("attn.indexer.compressor.wkv.weight", BF16, &[256, 2048]);
        add("attn.indexer.compressor.wgate.weight", BF16, &[256, 2048]);
        add("attn.indexer.compressor.ape", F32, &[4, 256]);
        add("attn.indexer.compressor.norm.weight", BF16, &[128]);
    } else if ratio == 128 {
        add("attn.compressor.wkv.weight", BF16, &[512, 2048]);
        add("attn.compressor.wgate.weight", BF16, &[512, 2048]);
        add("attn.compressor.ape", F32, &[128, 512]);
        add("attn.compressor.norm.weight", BF16, &[512]);
    }
    add("ffn.gate.weight", BF16, &[64, 2048]);
    if hash {
        add("ffn.gate.tid2eid", I64, &[129_280, 6]);
    } else {
        add("ffn.gate.bias", F32, &[64]);
    }
    for e in 0..64 {
        for (w, packed, scale) in [
            ("w1", [768, 1024], [768, 64]),
            ("w3", [768, 1024], [768, 64]),
            ("w2", [2048, 384], [2048, 24]),
        ] {
            add(&format!("ffn.experts.{e}.{w}.weight"), I8, &packed);
            add(&format!("ffn.experts.{e}.{w}.scale"), F8_E8M0, &scale);
        }
    }
    v
}

#[test]
fn bench_inventory_matches_the_official_table() {
    let spec = preset("bench").unwrap();
    let plan = tensor_plan(&spec);
    let got: BTreeMap<String, (Dtype, Vec<usize>)> = plan
        .iter()
        .map(|t| (t.name.clone(), (t.dtype, t.shape.clone())))
        .collect();
    assert_eq!(got.len(), plan.len(), "names are unique");
    let mut want: BTreeMap<String, (Dtype, Vec<usize>)> = BTreeMap::new();
    use Dtype::*;
    for (n, d, s) in [
        ("embed.weight", BF16, vec![129_280, 2048]),
        ("head.weight", BF16, vec![129_280, 2048]),
        ("norm.weight", BF16, vec![2048]),
        ("hc_head_fn", F32, vec![4, 8192]),
        ("hc_head_base", F32, vec![4]),
        ("hc_head_scale", F32, vec![1]),
    ] {
        want.insert(n.to_string(), (d, s));
    }
    for l in 0..12 {
        for (n, d, s) in bench_layer_expected(l) {
            assert!(want.insert(n.clone(), (d, s)).is_none(), "{n} twice");
        }
    }
    // The MTP block (docs/MODEL.md §4.1's last row): a sliding-window, score-routed block plus its
    // input projections, norms and hyper head.
    for (n, d, s) in [
        ("mtp.0.e_proj.weight", F8_E4M3, vec![2048, 2048]),
        ("mtp.0.e_proj.scale", F8_E8M0, vec![16, 16]),
        ("mtp.0.h_proj.weight", F8_E4M3, vec![2048, 2048]),
        ("mtp.0.h_proj.scale", F8_E8M0, vec![16, 16]),
        ("mtp.0.enorm.weight", BF16, vec![2048]),
        ("mtp.0.hnorm.weight", BF16, vec![2048]),
        ("mtp.0.norm.weight", BF16, vec![2048]),
        ("mtp.0.hc_head_fn", F32, vec![4, 8192]),
        ("mtp.0.hc_head_base", F32, vec![4]),
        ("mtp.0.hc_head_scale", F32, vec![1]),
    ]
    .map(|(n, d, s)| (n.to_string(), d, s))
    .into_iter()
    .chain(block_expected("mtp.0", 0, false))
    {
        assert!(want.insert(n.clone(), (d, s)).is_none(), "{n} twice");
    }
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?} extra {extra:?}"
    );
    for (n, w) in &want {
        assert_eq!(&got[n], w, "{n}");
    }
    // Every scale directly follows its weight (the writer relies on it).
    for (i, t) in plan.iter().enumerate() {
        let quantised = matches!(t.dtype, F8_E4M3 | I8);
        assert_eq!(
            quantised,
            plan.get(i + 1).is_some_and(|n| n.init == Init::Scale)
        );
    }

    let total: u64 = plan.iter().map(PlannedTensor::byte_len).sum();
    // 3.3 GB for the model, 0.2 GB more for the MTP block.
    assert!((3.3e9..3.7e9).contains(&(total as f64)), "{total} bytes");

    let c = ModelConfig::from_json_str(&spec.config_json().to_string()).unwrap();
    use AttnKind::*;
    let kinds = [
        Sliding, Sliding, Csa, Hca, Csa, Hca, Csa, Hca, Csa, Hca, Csa, Hca,
    ];
    assert_eq!(c.layer_types, kinds);
    assert_eq!((c.compress_rate_csa, c.compress_rate_hca), (4, 128));
    let mlp: Vec<MlpKind> = (0..12)
        .map(|l| {
            if l < 3 {
                MlpKind::Hash
            } else {
                MlpKind::Scored
            }
        })
        .collect();
    assert_eq!(c.mlp_layer_types, mlp);
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.num_hidden_layers),
        (129_280, 2048, 12)
    );
    assert_eq!(
        (c.num_attention_heads, c.head_dim, c.qk_rope_head_dim),
        (16, 512, 64)
    );
    assert_eq!((c.q_lora_rank, c.o_groups, c.o_lora_rank), (512, 4, 512));
    assert_eq!(c.sliding_window, 128);
    assert_eq!(
        (c.index_n_heads, c.index_head_dim, c.index_topk),
        (16, 128, 512)
    );
    assert_eq!(
        (
            c.n_routed_experts,
            c.num_experts_per_tok,
            c.n_shared_experts
        ),
        (64, 6, 1)
    );
    assert_eq!(c.moe_intermediate_size, 768);
    assert_eq!(c.scoring_func, crate::config::ScoringFunc::SqrtSoftplus);
    assert_eq!((c.routed_scaling_factor, c.swiglu_limit), (1.5, 10.0));
    assert_eq!(c.hc_mult, 4);
    assert_eq!(c.rope_main.theta, 10000.0);
    assert!(c.rope_main.yarn.is_none());
    assert_eq!(c.rope_compress.theta, 160000.0);
    let y = c.rope_compress.yarn.as_ref().unwrap();
    assert_eq!(
        (y.factor, y.original_max_position_embeddings),
        (16.0, 65536.0)
    );
    assert_eq!((y.beta_fast, y.beta_slow), (32.0, 1.0));
    assert_eq!(c.num_nextn_predict_layers, 1);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(0), vec![1])
    );
}

/// `flash-slice` stores every per-layer tensor with V4-Flash's shape and dtype (docs/MODEL.md §4.1):
/// only the layer and expert counts are smaller.
#[test]
fn flash_slice_has_v4_flash_shapes() {
    use Dtype::*;
    let spec = preset("flash-slice").unwrap();
    let plan = tensor_plan(&spec);
    let got: BTreeMap<&str, (Dtype, &[usize])> = plan
        .iter()
        .map(|t| (t.name.as_str(), (t.dtype, t.shape.as_slice())))
        .collect();
    for (n, d, s) in [
        ("embed.weight", BF16, &[129_280, 4096][..]),
        ("head.weight", BF16, &[129_280, 4096]),
        ("layers.2.attn.wq_a.weight", F8_E4M3, &[1024, 4096]),
        ("layers.2.attn.wq_a.scale", F8_E8M0, &[8, 32]),
        ("layers.2.attn.wq_b.weight", F8_E4M3, &[32768, 1024]),
        ("layers.2.attn.wq_b.scale", F8_E8M0, &[256, 8]),
        ("layers.2.attn.wkv.weight", F8_E4M3, &[512, 4096]),
        ("layers.2.attn.wo_a.weight", F8_E4M3, &[8192, 4096]),
        ("layers.2.attn.wo_a.scale", F8_E8M0, &[64, 32]),
        ("layers.2.attn.wo_b.weight", F8_E4M3, &[4096, 8192]),
        ("layers.2.attn.wo_b.scale", F8_E8M0, &[32, 64]),
        ("layers.2.attn.compressor.wkv.weight", BF16, &[1024, 4096]),
        ("layers.3.attn.compressor.wkv.weight", BF16, &[512, 4096]),
        ("layers.2.attn.indexer.wq_b.weight", F8_E4M3, &[8192, 1024]),
        (
            "layers.2.attn.indexer.weights_proj.weight",
            BF16,
            &[64, 4096],
        ),
        (
            "layers.2.attn.indexer.compressor.wkv.weight",
            BF16,
            &[256, 4096],
        ),
        ("layers.2.ffn.gate.weight", BF16, &[16, 4096]),
        ("layers.2.ffn.gate.tid2eid", I64, &[129_280, 6]),
        ("layers.3.ffn.gate.bias", F32, &[16]),
        (
            "layers.3.ffn.shared_experts.w1.weight",
            F8_E4M3,
            &[2048, 4096],
        ),
        (
            "layers.3.ffn.shared_experts.w2.weight",
            F8_E4M3,
            &[4096, 2048],
        ),
        ("layers.3.ffn.experts.15.w1.weight", I8, &[2048, 2048]),
        ("layers.3.ffn.experts.15.w1.scale", F8_E8M0, &[2048, 128]),
        ("layers.3.ffn.experts.15.w2.weight", I8, &[4096, 1024]),
        ("layers.3.ffn.experts.15.w2.scale", F8_E8M0, &[4096, 64]),
        ("layers.5.hc_attn_fn", F32, &[24, 16384]),
        ("mtp.0.e_proj.weight", F8_E4M3, &[4096, 4096]),
    ] {
        assert_eq!(got.get(n), Some(&(d, s)), "{n}");
    }
    assert!(!got.contains_key("layers.6.attn_norm.weight"));
    let gb = plan.iter().map(|t| t.byte_len()).sum::<u64>() as f64 / 1e9;
    assert!((4.0..5.5).contains(&gb), "{gb:.2} GB");
}
