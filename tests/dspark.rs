//! DSpark (docs/MODEL.md §7.2) against our CPU references on both kinds of target: tiny-v41-a
//! (tools/make_dspark_golden.py, V4.1 stages) and tiny-a-dspark (tools/make_dspark_v4_golden.py,
//! a V4-Flash-0731-style checkpoint: tiny-a with three V4 stages). The context keys a target
//! pass leaves in the drafter's rings; the head's logits of the five block positions, the
//! Markov drafts and the confidences; then the drafter through the engine's speculation.

mod common;

use common::*;
use deepinfer_engine::engine::{self, EngineConfig, EngineCore, EngineError, EngineHandle};
use deepinfer_engine::scheduler::SchedulerConfig;
use deepinfer_engine::spec::SpeculativeConfig;
use deepinfer_model::cache::CacheView;
use deepinfer_model::v4::dspark::{Draft, DraftContext};
use deepinfer_model::v4::model::Model;
use deepinfer_model::v4::workspace::Workspace;
use serde_json::Value;

/// The fixtures with a drafter.
const CONFIGS: [&str; 2] = ["tiny-v41-a", "tiny-a-dspark"];

/// Checks the drafter the model loaded from config.json against the fields the reference
/// wrote.
fn check_drafter(model: &Model, g: &Golden) {
    let c = &model
        .dspark
        .as_ref()
        .expect("the checkpoint's drafter")
        .config;
    let dc = &g.meta["dspark_config"];
    let n = |k: &str| dc[k].as_u64().unwrap() as usize;
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
    // tiny-a-dspark says `num_nextn_predict_layers: 1` beside its three stages, as
    // V4-Flash-0731 does; its golden records the stage count apart.
    let stages = g.meta["stages"]
        .as_u64()
        .map_or_else(|| n("num_nextn_predict_layers"), |s| s as usize);
    assert_eq!(c.stages, stages);
}

/// Each recorded block: its name, committed tokens, first context position and anchor.
fn blocks(g: &Golden) -> Vec<(String, Vec<u32>, usize, u32)> {
    let all: Vec<u32> = ids(&g.meta["prompt"])
        .into_iter()
        .chain(ids(&g.meta["greedy"]))
        .collect();
    let n = |v: &Value| v.as_u64().unwrap() as usize;
    g.meta["blocks"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, b)| {
            let committed = all[..n(&b["committed_len"])].to_vec();
            let ctx0 = n(&b["context_positions"][0]);
            (name.clone(), committed, ctx0, n(&b["anchor"]) as u32)
        })
        .collect()
}

/// An engine over `model` for `max_seqs` sequences, drafting as the `spec` JSON says (none:
/// plain decoding); stop it with [`stop`].
fn start(model: Model, max_seqs: usize, spec: Option<&str>) -> (EngineHandle, Engine) {
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: max_seqs,
            max_num_batched_tokens: 256,
            prefill_chunk: None,
            max_model_len: 4096,
        },
        cache: cache_config(64 << 20, max_seqs, 0),
        model_name: "test".into(),
        forced_output: None,
        speculative: spec.map(|s| SpeculativeConfig::from_json(s, None).unwrap()),
        prefix_disk: None,
    };
    engine::start(model, config).unwrap()
}

type Engine = std::thread::JoinHandle<Result<EngineCore, EngineError>>;

fn stop((h, join): (EngineHandle, Engine)) {
    h.shutdown();
    join.join().unwrap().unwrap();
}

/// A target pass leaves the reference's context keys (`main_x` from its aux streams — for
/// V4.1 those entering the target layers, for V4 those leaving them — through each stage's
/// `wkv`, `kv_norm` and RoPE) in the drafter's rings.
#[test]
fn the_target_fills_the_rings_with_the_reference_context_keys() {
    for cfg in CONFIGS {
        let g = Golden::load_named(cfg, "dspark_golden");
        let mut model = load(cfg, "official");
        let (layers, hd) = (model.config.num_hidden_layers, model.config.head_dim);
        for (name, committed, ctx0, _) in blocks(&g) {
            let (mut cache, seq) = dspark_target_pass(&mut model, &committed);
            let view = cache.view(&[seq]).unwrap();
            let ring = view.window_slots();
            let want = g.f32s(&format!("{name}.context_kv"));
            let n_ctx = committed.len() - ctx0;
            let mut diff = 0.0f32;
            for (stage, want) in want.chunks_exact(n_ctx * hd).enumerate() {
                for (k, want) in want.chunks_exact(hd).enumerate() {
                    let got = view.window(0, layers + stage, (ctx0 + k) % ring);
                    diff = diff.max(max_abs_diff(got, want));
                }
            }
            eprintln!("{cfg} block {name}: context keys differ by {diff:.2e}");
            assert!(
                diff <= 1e-5,
                "{cfg} block {name}: context keys differ by {diff}"
            );
        }
    }
}

/// From a target pass over the committed tokens: the head's logits of the five block
/// positions, the Markov drafts and the confidences.
#[test]
fn draft_blocks_match_the_reference() {
    for cfg in CONFIGS {
        let g = Golden::load_named(cfg, "dspark_golden");
        let mut model = load(cfg, "official");
        check_drafter(&model, &g);
        let mut ws = Workspace::default();
        for (name, committed, ctx0, anchor) in blocks(&g) {
            let (mut cache, seq) = dspark_target_pass(&mut model, &committed);
            let view = cache.view(&[seq]).unwrap();
            let p0 = committed.len();
            let context = DraftContext {
                cache: &view,
                seq: 0,
                positions: ctx0..p0,
            };
            let mut got = Draft::default();
            model
                .draft_into(&context, anchor, &mut got, &mut ws)
                .unwrap();
            let want = g.f32s(&format!("{name}.base_logits"));
            let diff = max_abs_diff(&got.base_logits, &want);
            eprintln!("{cfg} block {name}: base logits differ by {diff:.2e}");
            assert!(
                diff <= LOGIT_TOL,
                "{cfg} block {name}: base logits differ by {diff}"
            );
            let block = &g.meta["blocks"][&name];
            assert_eq!(
                got.tokens,
                ids(&block["drafts"]),
                "{cfg} block {name}: drafts"
            );
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

/// Fixed drafting: a whole block every step.
const DSPARK: &str = r#"{"method": "dspark", "adaptive": false}"#;

/// `--speculative-config '{"method": "dspark"}'` through the engine: the greedy output is
/// the plain greedy output, and the target accepts what it accepts in the reference's own
/// speculative loop (the drafts are the reference's, step by step).
#[test]
fn dspark_speculation_keeps_the_greedy_output() {
    let spec = SpeculativeConfig::from_json(r#"{"method": "dspark"}"#, None).unwrap();
    assert_eq!(spec.num_speculative_tokens, 5, "a whole block by default");
    for cfg in CONFIGS {
        let g = Golden::load_named(cfg, "dspark_golden");
        let engine = start(load(cfg, "official"), 1, Some(DSPARK));
        let h = &engine.0;
        let (prompt, want) = (ids(&g.meta["prompt"]), ids(&g.meta["greedy"]));
        let (toks, _) = collect(h.add_request(prompt.clone(), greedy(want.len())).unwrap().1);
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
        // Again: the cached prefix is not recomputed, so the rings hold context from where
        // the target resumed only; the drafts may differ, the output may not.
        let (toks, _) = collect(h.add_request(prompt, greedy(want.len())).unwrap().1);
        assert_eq!(toks, want, "{cfg}: the same prompt from the prefix cache");
        assert!(
            h.metrics.prefix_cache_hits.get() > 0,
            "{cfg}: no prefix hit"
        );
        stop(engine);
    }
}

/// The greedy tokens a fresh engine over `model` gives `prompt`, and how many verify
/// rounds drafted.
fn generate(model: Model, spec: Option<&str>, prompt: Vec<u32>, n: usize) -> (Vec<u32>, u64) {
    let engine = start(model, 1, spec);
    let (toks, _) = collect(engine.0.add_request(prompt, greedy(n)).unwrap().1);
    let drafts = engine.0.metrics.spec_decode_num_drafts.get();
    stop(engine);
    (toks, drafts)
}

/// A synthetic checkpoint with a drafter (`synth` writes one where the config announces it,
/// as `bench-v41` does): the tiny V4 and V4.1 presets given three stages load, draft, and keep
/// the plain greedy output.
#[test]
fn synthetic_drafters_load_and_keep_the_greedy_output() {
    use deepinfer_model::config::DsparkConfig;
    use deepinfer_model::synth::{preset, write_checkpoint};

    for (name, aux_layers, shift) in [("tiny", [2, 3, 4], 1), ("tiny-v41", [3, 4, 5], 0)] {
        let mut spec = preset(name).unwrap();
        spec.config.num_nextn_predict_layers = 3;
        spec.config.dspark = Some(DsparkConfig {
            target_layer_ids: aux_layers.iter().map(|l| l - shift).collect(),
            aux_layers: aux_layers.to_vec(),
            block_size: 5,
            noise_token_id: 128_799,
            markov_rank: 32,
            stages: 3,
            n_routed_experts: spec.config.n_routed_experts / 2,
            num_experts_per_tok: 2,
        });
        spec.validate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        write_checkpoint(&spec, dir.path(), 5, |_, _| {}).unwrap();
        let model = || Model::load(dir.path()).unwrap();
        assert!(model().dspark.is_some(), "{name}: the drafter loads");
        let prompt: Vec<u32> = (0..40).map(|i| (i * 7919 % 120_000) as u32).collect();
        let (plain, _) = generate(model(), None, prompt.clone(), 24);
        let (drafted, drafts) = generate(model(), Some(DSPARK), prompt, 24);
        assert_eq!(drafted, plain, "{name}: greedy output with DSpark drafting");
        assert!(drafts > 0, "{name}: nothing was drafted");
    }
}

/// `enable_adaptive_verification` (vLLM's, with the adaptive policy that times the plain
/// steps it weighs drafts against): drafts are dropped by their confidences, never a token
/// of the output.
#[test]
fn adaptive_verification_keeps_the_greedy_output() {
    let json = r#"{"method": "dspark", "enable_adaptive_verification": true}"#;
    for cfg in CONFIGS {
        let g = Golden::load_named(cfg, "dspark_golden");
        let engine = start(load(cfg, "official"), 2, Some(json));
        let h = &engine.0;
        let (prompt, want) = (ids(&g.meta["prompt"]), ids(&g.meta["greedy"]));
        let rx: Vec<_> = (0..2)
            .map(|_| h.add_request(prompt.clone(), greedy(want.len())).unwrap().1)
            .collect();
        for rx in rx {
            assert_eq!(collect(rx).0, want, "{cfg}: greedy output");
        }
        let (drafts, tokens) = (
            h.metrics.spec_decode_num_drafts.get(),
            h.metrics.spec_decode_num_draft_tokens.get(),
        );
        eprintln!("{cfg}: {tokens} draft tokens verified over {drafts} drafts");
        assert!(tokens <= 5 * drafts);
        stop(engine);
    }
}

/// Under official numerics (V4.1's: vLLM's FP8) the context rings hold packed records (as
/// the target's rings do) and drafting still keeps the plain greedy output.
#[test]
fn official_numerics_drafting_keeps_the_greedy_output() {
    use deepinfer_model::numerics::Numerics;

    for cfg in ["tiny-a-dspark", "tiny-v41-a"] {
        let g = Golden::load_named(cfg, "dspark_golden");
        let model = || {
            let mut m = load(cfg, "official");
            m.set_numerics(Numerics::Official).unwrap();
            m
        };
        let prompt = ids(&g.meta["prompt"]);
        let (plain, _) = generate(model(), None, prompt.clone(), 16);
        let (drafted, drafts) = generate(model(), Some(DSPARK), prompt, 16);
        assert_eq!(drafted, plain, "{cfg}");
        assert!(drafts > 0, "{cfg}");
    }
}
