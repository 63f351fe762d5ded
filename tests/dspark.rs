//! DSpark (spec §7.2) against our CPU references on both kinds of target: tiny-v41-a
//! (tools/make_dspark_golden.py, V4.1 stages) and tiny-a-dspark (tools/make_dspark_v4_golden.py,
//! a V4-Flash-0731-style checkpoint: tiny-a with three V4 stages). From the reference's
//! context streams, the head's logits of the five block positions, the Markov drafts and the
//! confidences; then the drafter through the engine's speculation.

mod common;

use common::*;
use deepinfer_model::v4::model::Model;
use deepinfer_model::v4::workspace::Workspace;
use serde_json::Value;

/// The fixtures with a drafter: (config, its dspark_golden.json's place).
const CONFIGS: [&str; 2] = ["tiny-v41-a", "tiny-a-dspark"];

/// The drafter the model loaded from config.json, checked against the fields the reference
/// wrote.
fn drafter<'a>(model: &'a Model, g: &Golden) -> &'a deepinfer_model::v4::dspark::DsparkWeights {
    let ds = model.dspark.as_ref().expect("the checkpoint's drafter");
    let dc = &g.meta["dspark_config"];
    let n = |k: &str| dc[k].as_u64().unwrap() as usize;
    let c = &ds.config;
    let want_ids: Vec<usize> = ids(&dc["dspark_target_layer_ids"])
        .into_iter()
        .map(|v| v as usize)
        .collect();
    assert_eq!(c.target_layer_ids, want_ids);
    assert_eq!(
        (c.block_size, c.noise_token_id as usize, c.markov_rank),
        (
            n("dspark_block_size"),
            n("dspark_noise_token_id"),
            n("dspark_markov_rank")
        )
    );
    let stages = g.meta["stages"]
        .as_u64()
        .map_or_else(|| n("num_nextn_predict_layers"), |s| s as usize);
    assert_eq!(c.stages, stages);
    ds
}

#[test]
fn draft_blocks_match_the_reference() {
    for cfg in CONFIGS {
        let g = Golden::load_named(cfg, "dspark_golden");
        let model = load(cfg, "official");
        let ds = drafter(&model, &g);
        let mut ws = Workspace::default();
        for (name, block) in g.meta["blocks"].as_object().unwrap() {
            let ctx = block["context_positions"].as_array().unwrap();
            let ctx0 = ctx[0].as_u64().unwrap() as usize;
            let p0 = block["committed_len"].as_u64().unwrap() as usize;
            let anchor = block["anchor"].as_u64().unwrap() as u32;
            let aux = g.f32s(&format!("{name}.aux"));
            let got = ds.draft(&model, &aux, ctx0, p0, anchor, &mut ws).unwrap();
            let want = g.f32s(&format!("{name}.base_logits"));
            let diff = max_abs_diff(&got.base_logits, &want);
            eprintln!("{cfg} block {name}: base logits differ by {diff:.2e}");
            assert!(
                diff <= LOGIT_TOL,
                "{cfg} block {name}: base logits differ by {diff}"
            );
            let drafts: Vec<u32> = ids(&block["drafts"]);
            assert_eq!(got.tokens, drafts, "{cfg} block {name}: drafts");
            let conf: Vec<f32> = block["confidence"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v: &Value| v.as_f64().unwrap() as f32)
                .collect();
            let cdiff = max_abs_diff(&got.confidence, &conf);
            assert!(
                cdiff <= 1e-5,
                "{cfg} block {name}: confidences differ by {cdiff}"
            );
        }
    }
}

/// The streams the target hands the drafter (`ForwardExtras::aux`) are the reference's: for
/// V4.1 those entering the target layers, for V4 those leaving them.
#[test]
fn the_target_captures_the_reference_aux_streams() {
    use deepinfer_model::batch::{ForwardBatch, Logits};
    use deepinfer_model::v4::model::ForwardExtras;
    for cfg in CONFIGS {
        let g = Golden::load_named(cfg, "dspark_golden");
        let mut model = load(cfg, "official");
        let block = &g.meta["blocks"]["b"];
        let p0 = block["committed_len"].as_u64().unwrap() as usize;
        let ctx0 = block["context_positions"][0].as_u64().unwrap() as usize;
        let prompt = ids(&g.meta["prompt"]);
        let greedy = ids(&g.meta["greedy"]);
        let committed: Vec<u32> = prompt.iter().chain(&greedy).copied().take(p0).collect();
        let mut cache = cache_for(&model, 1);
        let seq = cache.add_seq().unwrap();
        cache.ensure_capacity(seq, p0).unwrap();
        let batch = ForwardBatch::from_prompts(std::slice::from_ref(&committed), false);
        let mut aux = Vec::new();
        let mut logits = Logits {
            vocab: model.config.vocab_size,
            data: Vec::new(),
        };
        let extras = ForwardExtras {
            aux: Some(&mut aux),
            ..Default::default()
        };
        model
            .forward_into(
                &batch,
                &mut cache.view(&[seq]).unwrap(),
                &mut logits,
                extras,
            )
            .unwrap();
        let width = aux.len() / p0;
        let diff = max_abs_diff(&aux[ctx0 * width..], &g.f32s("b.aux"));
        eprintln!("{cfg}: aux streams differ by {diff:.2e}");
        assert!(diff <= 1e-4, "{cfg}: aux streams differ by {diff}");
    }
}

/// `--speculative-config '{"method": "dspark"}'` through the engine: the greedy output is
/// the plain greedy output, and the target accepts what it accepts in the reference's own
/// speculative loop (the drafts are the reference's, step by step).
#[test]
fn dspark_speculation_keeps_the_greedy_output() {
    use deepinfer_engine::engine::{self, EngineConfig};
    use deepinfer_engine::scheduler::SchedulerConfig;
    use deepinfer_engine::spec::SpeculativeConfig;

    for cfg in CONFIGS {
        let g = Golden::load_named(cfg, "dspark_golden");
        let spec = SpeculativeConfig::from_json(r#"{"method": "dspark", "adaptive": false}"#, None)
            .unwrap();
        assert_eq!(spec.num_speculative_tokens, 5, "a whole block by default");
        let config = EngineConfig {
            scheduler: SchedulerConfig {
                max_num_seqs: 1,
                max_num_batched_tokens: 256,
                prefill_chunk: None,
                max_model_len: 4096,
            },
            cache: cache_config(64 << 20, 1, 0),
            model_name: "test".into(),
            forced_output: None,
            speculative: Some(spec),
        };
        let (h, join) = engine::start(load(cfg, "official"), config).unwrap();
        let (prompt, want) = (ids(&g.meta["prompt"]), ids(&g.meta["greedy"]));
        let (toks, _) = collect(h.add_request(prompt, greedy(want.len())).unwrap().1);
        assert_eq!(toks, want, "{cfg}: greedy output with DSpark drafting");
        h.drain().unwrap();
        let accepted = h.metrics.spec_decode_num_accepted_tokens.get();
        let drafts = h.metrics.spec_decode_num_drafts.get();
        eprintln!("{cfg}: {accepted} drafts accepted over {drafts} steps that drafted");
        assert_eq!(
            accepted,
            g.meta["speculative"]["accepted_total"].as_u64().unwrap(),
            "{cfg}: accepted drafts"
        );
        h.shutdown();
        join.join().unwrap().unwrap();
    }
}
