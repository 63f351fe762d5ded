//! `tiny` end to end: written, loaded, run; deterministic in its seed.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use super::dense_cache::DenseCache;
use crate::batch::ForwardBatch;
use crate::checkpoint::Checkpoint;
use crate::config::{AttnKind, MlpKind, ModelConfig};
use crate::synth::*;
use crate::v4::model::ModelWeights;
use crate::v4::Model;

/// Small enough that `tiny` (~70 MB) spans several shards, so the index path is exercised.
pub(super) const SMALL_SHARDS: u64 = 16 << 20;

pub(super) fn write_tiny(dir: &Path, seed: u64, shard_bytes: u64) {
    let spec = preset("tiny").unwrap();
    let mut last = (0, 1);
    write_checkpoint_sharded(&spec, dir, seed, shard_bytes, |d, t| last = (d, t)).unwrap();
    assert_eq!(last.0, last.1, "progress ends at the total");
}

pub(super) fn mean_std(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Raw bytes of a stored tensor, found through the index like any loader would.
pub(super) fn stored_bytes(dir: &Path, name: &str) -> (Dtype, Vec<usize>, Vec<u8>) {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let file = index["weight_map"][name].as_str().unwrap();
    let buf = std::fs::read(dir.join(file)).unwrap();
    let st = SafeTensors::deserialize(&buf).unwrap();
    let t = st.tensor(name).unwrap();
    (t.dtype(), t.shape().to_vec(), t.data().to_vec())
}

pub(super) fn planned(name: &str) -> PlannedTensor {
    let spec = preset("tiny").unwrap();
    tensor_plan(&spec)
        .into_iter()
        .find(|t| t.name == name)
        .unwrap()
}

pub(super) fn std_of(t: &PlannedTensor) -> f32 {
    match t.init {
        Init::Normal { std, .. } => std,
        other => panic!("{} is not normal: {other:?}", t.name),
    }
}

#[test]
fn tiny_loads_runs_and_stores_what_was_drawn() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny(dir.path(), 7, SMALL_SHARDS);
    let shards = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            let n = e.as_ref().unwrap().file_name();
            n.to_string_lossy().ends_with(".safetensors")
        })
        .count();
    assert!(shards > 2, "expected several shards, got {shards}");
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        assert!(dir.path().join(f).is_file(), "{f} written");
    }

    let cfg = ModelConfig::from_file(&dir.path().join("config.json")).unwrap();
    let ck = Checkpoint::open(dir.path()).unwrap();
    let spec = preset("tiny").unwrap();
    let plan = tensor_plan(&spec);
    assert_eq!(ck.stored_names().len(), plan.len());

    // Every FP8 tensor dequantises to finite values of the drawn magnitude.
    for t in plan.iter().filter(|t| t.dtype == Dtype::F8_E4M3) {
        let w = ck.tensor_f32(&t.name, &t.shape).unwrap();
        let std = std_of(t) as f64;
        assert!(w.iter().all(|v| v.is_finite()), "{}", t.name);
        let max = w.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
        assert!(
            max <= 7.0 * std * 1.07,
            "{}: max {max} vs std {std}",
            t.name
        );
        let (mean, s) = mean_std(&w);
        assert!(mean.abs() < 0.05 * std, "{}: mean {mean}", t.name);
        assert!((s / std - 1.0).abs() < 0.1, "{}: std {s} vs {std}", t.name);
    }

    // Hash routing tables hold distinct valid experts per token.
    let k = spec.config.num_experts_per_tok;
    let n_hash = spec
        .config
        .mlp_layer_types
        .iter()
        .filter(|t| **t == MlpKind::Hash)
        .count();
    for l in 0..n_hash {
        let ids = ck
            .tensor_i64(
                &format!("layers.{l}.ffn.gate.tid2eid"),
                &[spec.config.vocab_size, k],
            )
            .unwrap();
        for r in ids.chunks_exact(k) {
            assert!(r
                .iter()
                .all(|&e| (0..spec.config.n_routed_experts as i64).contains(&e)));
            assert!((1..k).all(|i| !r[..i].contains(&r[i])), "{r:?} repeats");
        }
    }

    let weights = ModelWeights::load(&ck, &cfg).unwrap();
    assert!(weights.mtp.is_some(), "the preset writes an MTP block");
    let mut model = Model::new(cfg, weights);
    let c = &model.config;
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 11) % 129_280).collect();
    let mut cache = DenseCache::new(c, 64);
    let batch = ForwardBatch::from_prompts(&[prompt], true);
    let logits = model.forward(&batch, &mut cache).unwrap();
    assert_eq!(logits.rows(), 40);
    let mut argmaxes = Vec::new();
    for r in 0..logits.rows() {
        let row = logits.row(r);
        assert!(row.iter().all(|v| v.is_finite()), "row {r} not finite");
        let (_, s) = mean_std(row);
        assert!((0.1..100.0).contains(&s), "row {r}: logit std {s}");
        argmaxes.push(deepinfer_kernels::topk::argmax(row));
    }
    argmaxes.sort_unstable();
    argmaxes.dedup();
    assert!(argmaxes.len() > 1, "every position predicts the same token");
}

fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect()
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    write_tiny(a.path(), 11, SHARD_BYTES);
    write_tiny(b.path(), 11, SHARD_BYTES);
    write_tiny(c.path(), 12, SHARD_BYTES);
    let (fa, fb, fc) = (files(a.path()), files(b.path()), files(c.path()));
    assert!(fa.contains_key("model-00001-of-00001.safetensors"));
    assert!(fa == fb, "same seed, different files");
    let shard = "model-00001-of-00001.safetensors";
    assert_eq!(fa[shard].len(), fc[shard].len(), "same layout");
    assert_ne!(fa[shard], fc[shard], "another seed gives other weights");
    assert_eq!(fa["config.json"], fc["config.json"]);
}

#[test]
fn unknown_preset_lists_the_known_ones() {
    let e = preset("huge").unwrap_err().to_string();
    assert!(
        e.contains("huge") && e.contains("tiny") && e.contains("bench"),
        "{e}"
    );
}

#[test]
fn unwritable_specs_are_refused_before_any_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    let mut spec = preset("tiny").unwrap();
    spec.config.moe_intermediate_size = 48;
    let e = write_checkpoint(&spec, &out, 0, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("moe_intermediate_size"), "{e}");
    let mut spec = preset("tiny").unwrap();
    spec.config.num_experts_per_tok = 9;
    let e = write_checkpoint(&spec, &out, 0, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("num_experts_per_tok"), "{e}");
    assert!(!out.exists());
}

#[test]
fn tiny_config_parses_to_its_shape() {
    let spec = preset("tiny").unwrap();
    let c = ModelConfig::from_json_str(&spec.config_json().to_string()).unwrap();
    use AttnKind::*;
    assert_eq!(c.layer_types, [Sliding, Csa, Hca, Csa]);
    assert_eq!((c.compress_rate_csa, c.compress_rate_hca), (4, 8));
    assert_eq!(c.mlp_layer_types[..2], [MlpKind::Hash, MlpKind::Hash]);
    assert_eq!(c.vocab_size, 129_280);
    assert_eq!(c.num_nextn_predict_layers, 1);
}

#[test]
fn the_llama_cpp_comparison_preset_has_no_mtp_block() {
    let spec = preset("bench-bf16").unwrap();
    assert_eq!(spec.config.num_nextn_predict_layers, 0);
    assert!(!super::super::plan::tensor_plan(&spec)
        .iter()
        .any(|t| t.name.starts_with("mtp.")));
    assert!(super::super::plan::tensor_plan(&preset("bench").unwrap())
        .iter()
        .any(|t| t.name == "mtp.0.e_proj.weight"));
}
