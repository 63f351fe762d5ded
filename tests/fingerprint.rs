//! A fingerprint of the model's outputs over every fixture, for refactorings that must not
//! change a bit: every position's logits of every golden prompt (whole, in chunks of 5, and
//! two prompts batched), for each checkpoint layout and numerics, experts resident and
//! streamed; the MTP block's logits and streams; DSpark's base logits, drafts and
//! confidences; and the greedy tokens of speculative decoding through the engine. The
//! hashes depend on the CPU's kernel paths, so they are compared on one machine between two
//! commits, not committed:
//!
//! ```text
//! cargo test --release --test fingerprint -- --ignored --nocapture 2>/dev/null | grep '^fp '
//! ```

mod common;

use common::*;
use deepinfer_engine::cache::CacheConfig;
use deepinfer_engine::engine::{self, EngineConfig};
use deepinfer_engine::runner::ModelRunner;
use deepinfer_engine::scheduler::SchedulerConfig;
use deepinfer_engine::spec::SpeculativeConfig;
use deepinfer_model::experts::MemoryPlan;
use deepinfer_model::numerics::Numerics;
use deepinfer_model::v4::dspark::{Draft, DraftContext};
use deepinfer_model::v4::workspace::Workspace;
use deepinfer_model::v4::Model;

fn print(label: &str, fp: &Fingerprint) {
    println!("fp {label}: {:016x}", fp.0);
}

/// Every position of every golden prompt + greedy continuation, whole and in chunks of 5,
/// then the first two prompts in one step.
fn logits_fingerprint(model: Model, g: &Golden) -> Fingerprint {
    let mut fp = Fingerprint::new();
    let mut r = runner(model, 4, 0);
    for pi in 0..g.prompts().len() {
        let toks = long_sequence(g, pi);
        for chunk in [toks.len(), 5] {
            for row in chunked_logits(&mut r, &toks, chunk) {
                fp.f32s(&row);
            }
        }
    }
    let (a, b) = (long_sequence(g, 0), long_sequence(g, 1));
    let (sa, sb) = (r.add_sequence().unwrap(), r.add_sequence().unwrap());
    let feeds = [(sa, &a), (sb, &b)].map(|(seq, tokens)| Feed {
        seq,
        tokens,
        all_logits: true,
    });
    let l = r.step(&feeds).unwrap();
    fp.f32s(&l.data);
    fp
}

fn with_numerics(mut m: Model, numerics: Numerics) -> Option<Model> {
    m.set_numerics(numerics).ok().map(|_| m)
}

const LAYOUTS: [(&str, &str); 11] = [
    ("tiny-a", "official"),
    ("tiny-a", "hf"),
    ("tiny-b", "official"),
    ("tiny-b", "hf"),
    ("tiny-c", "official"),
    ("tiny-c", "hf"),
    ("tiny-c", "saved-bf16"),
    ("tiny-c", "saved-f32"),
    ("tiny-c", "saved-hf-bf16"),
    ("tiny-v41-a", "official"),
    ("tiny-v41-b", "official"),
];

fn golden_of(config: &str) -> Golden {
    let config = if config == "tiny-a-dspark" {
        "tiny-a"
    } else {
        config
    };
    Golden::load(config)
}

fn logits_cases() {
    let layouts = LAYOUTS.iter().chain(&[("tiny-a-dspark", "official")]);
    for &(config, layout) in layouts {
        let g = golden_of(config);
        for numerics in [Numerics::Reference, Numerics::Official] {
            let label = format!("{config}/{layout} {numerics:?}");
            match with_numerics(load(config, layout), numerics) {
                Some(m) => print(&label, &logits_fingerprint(m, &g)),
                None => println!("fp {label}: refused"),
            }
        }
    }
    for config in ["tiny-a", "tiny-c", "tiny-v41-a"] {
        let plan = MemoryPlan {
            budget: None,
            expert_cache: Some(1 << 20),
        };
        let m = Model::load_with(&fixture(config).join("official"), &plan, |_, _| {}).unwrap();
        let label = format!("{config}/official streamed");
        print(&label, &logits_fingerprint(m, &golden_of(config)));
    }
}

/// The MTP block over a golden prompt: the target's streams, then the block's logits and
/// output streams, whole.
fn mtp_fingerprint(config: &str, numerics: Numerics) -> Fingerprint {
    let mut fp = Fingerprint::new();
    let g = Golden::load(config);
    let model = with_numerics(load(config, "official"), numerics).unwrap();
    let prompt = long_sequence(&g, 0);
    let mut cache = mtp_cache(&model);
    let mut runner = ModelRunner::new(model);
    let seq = cache.add_seq().unwrap();
    cache.ensure_capacity(seq, prompt.len()).unwrap();
    runner.clear();
    runner.add(seq, 0, prompt.iter().copied(), 1);
    fp.f32s(&runner.run(&mut cache, true).unwrap().data);
    let hidden = runner.hidden().to_vec();
    fp.f32s(&hidden);
    let n = prompt.len() - 1;
    let width = hidden.len() / prompt.len();
    let model = runner.model_mut();
    let (logits, out) = mtp_pass(
        model,
        &mut cache,
        seq,
        0,
        &prompt[1..],
        &hidden[..n * width],
    );
    fp.f32s(&logits.data);
    fp.f32s(&out);
    fp
}

/// DSpark's block drafted after each of the golden's committed prefixes.
fn dspark_fingerprint(config: &str, numerics: Numerics) -> Option<Fingerprint> {
    let mut fp = Fingerprint::new();
    let g = golden_of(config);
    let mut model = with_numerics(load(config, "official"), numerics)?;
    let mut ws = Workspace::default();
    for len in [12, 20, 33] {
        let committed = long_sequence(&g, 1)[..len].to_vec();
        let (mut cache, seq) = dspark_target_pass(&mut model, &committed);
        let view = cache.view(&[seq]).unwrap();
        let context = DraftContext {
            cache: &view,
            seq: 0,
            positions: len.saturating_sub(8)..len,
        };
        let mut got = Draft::default();
        model
            .draft_into(&context, committed[len - 1], &mut got, &mut ws)
            .unwrap();
        fp.f32s(&got.base_logits);
        fp.u32s(&got.tokens);
        fp.f32s(&got.confidence);
    }
    Some(fp)
}

/// Greedy tokens of the first three prompts through the engine, drafting as `spec` says.
fn engine_fingerprint(model: Model, g: &Golden, spec: &str) -> Fingerprint {
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 3,
            max_num_batched_tokens: 64,
            prefill_chunk: None,
            max_model_len: 4096,
        },
        cache: CacheConfig {
            draft_layers: 3,
            ..cache_config(64 << 20, 3, 8)
        },
        model_name: "fp".into(),
        forced_output: None,
        speculative: Some(SpeculativeConfig::from_json(spec, None).unwrap()),
        prefix_disk: None,
    };
    let (h, join) = engine::start(model, config).unwrap();
    let rxs: Vec<_> = (0..3)
        .map(|i| {
            h.add_request(ids(&g.prompts()[i]["ids"]), greedy(24))
                .unwrap()
                .1
        })
        .collect();
    let mut fp = Fingerprint::new();
    for rx in rxs {
        fp.u32s(&collect(rx).0);
    }
    h.shutdown();
    join.join().unwrap().unwrap();
    fp
}

fn drafter_cases() {
    for numerics in [Numerics::Reference, Numerics::Official] {
        for config in ["tiny-a", "tiny-b", "tiny-c"] {
            print(
                &format!("{config} mtp {numerics:?}"),
                &mtp_fingerprint(config, numerics),
            );
        }
        for config in ["tiny-a-dspark", "tiny-v41-a"] {
            let label = format!("{config} dspark {numerics:?}");
            match dspark_fingerprint(config, numerics) {
                Some(fp) => print(&label, &fp),
                None => println!("fp {label}: refused"),
            }
        }
    }
    let spec = [
        (
            "tiny-a",
            r#"{"method": "mtp", "num_speculative_tokens": 2}"#,
        ),
        ("tiny-a-dspark", r#"{"method": "dspark"}"#),
        ("tiny-v41-a", r#"{"method": "dspark", "adaptive": false}"#),
    ];
    for (config, json) in spec {
        let fp = engine_fingerprint(load(config, "official"), &golden_of(config), json);
        print(&format!("{config} engine {json}"), &fp);
    }
}

/// The cache layout of every fixture's config (with a draft layer and rollback room).
fn layout_cases() {
    for &(config, layout) in LAYOUTS.iter().chain(&[("tiny-a-dspark", "official")]) {
        let m = load(config, layout);
        let l = deepinfer_engine::cache::CacheLayout::new(&m.config, 3, 16, 1).unwrap();
        let mut fp = Fingerprint::new();
        fp.bytes(format!("{l:?}").as_bytes());
        print(&format!("{config}/{layout} cache layout"), &fp);
    }
}

#[test]
#[ignore = "prints a fingerprint to compare between commits"]
fn fingerprint() {
    layout_cases();
    logits_cases();
    drafter_cases();
}
