//! DSpark's draft block (spec §7.2) against our CPU reference (tools/make_dspark_golden.py)
//! on tiny-v41-a: from the reference's context streams, the head's logits of the five block
//! positions, the Markov drafts and the confidences. The drafter is not yet wired into the
//! engine's speculation.

mod common;

use common::*;
use deepinfer_model::checkpoint::Checkpoint;
use deepinfer_model::v4::dspark::{DsparkConfig, DsparkWeights};
use deepinfer_model::v4::workspace::Workspace;
use serde_json::Value;

#[test]
fn draft_blocks_match_the_reference() {
    let g = Golden::load_named("tiny-v41-a", "dspark_golden");
    let dir = fixture("tiny-v41-a").join("official");
    let model = load("tiny-v41-a", "official");
    let dc = &g.meta["dspark_config"];
    let n = |k: &str| dc[k].as_u64().unwrap() as usize;
    let config = DsparkConfig {
        target_layer_ids: dc["dspark_target_layer_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect(),
        block_size: n("dspark_block_size"),
        noise_token_id: n("dspark_noise_token_id") as u32,
        markov_rank: n("dspark_markov_rank"),
        stages: n("num_nextn_predict_layers"),
        n_routed_experts: n("dspark_n_routed_experts"),
        num_experts_per_tok: n("dspark_num_experts_per_tok"),
    };
    let ck = Checkpoint::open(&dir).unwrap();
    let ds = DsparkWeights::load(&ck, &model.config, config).unwrap();
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
        eprintln!("block {name}: base logits differ by {diff:.2e}");
        assert!(
            diff <= LOGIT_TOL,
            "block {name}: base logits differ by {diff}"
        );
        let drafts: Vec<u32> = ids(&block["drafts"]);
        assert_eq!(got.tokens, drafts, "block {name}: drafts");
        let conf: Vec<f32> = block["confidence"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v: &Value| v.as_f64().unwrap() as f32)
            .collect();
        let cdiff = max_abs_diff(&got.confidence, &conf);
        assert!(cdiff <= 1e-5, "block {name}: confidences differ by {cdiff}");
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

    let g = Golden::load_named("tiny-v41-a", "dspark_golden");
    let spec =
        SpeculativeConfig::from_json(r#"{"method": "dspark", "adaptive": false}"#, None).unwrap();
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
    let (h, join) = engine::start(load("tiny-v41-a", "official"), config).unwrap();
    let (prompt, want) = (ids(&g.meta["prompt"]), ids(&g.meta["greedy"]));
    let (toks, _) = collect(h.add_request(prompt, greedy(want.len())).unwrap().1);
    assert_eq!(toks, want, "greedy output with DSpark drafting");
    h.drain().unwrap();
    let accepted = h.metrics.spec_decode_num_accepted_tokens.get();
    let drafts = h.metrics.spec_decode_num_drafts.get();
    eprintln!("DSpark: {accepted} drafts accepted over {drafts} steps that drafted");
    assert_eq!(
        accepted,
        g.meta["speculative"]["accepted_total"].as_u64().unwrap(),
        "accepted drafts"
    );
    h.shutdown();
    join.join().unwrap().unwrap();
}
