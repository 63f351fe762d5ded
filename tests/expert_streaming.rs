//! Routed experts streamed from disk through a small cache compute what resident experts
//! compute, bit for bit: whole prompts, chunked prefill, decode, batches, the engine under
//! preemption; a shard that changes under a loaded model is an error, never other numbers.

mod common;

use common::*;
use deepinfer_engine::engine::{self, EngineConfig};
use deepinfer_engine::scheduler::SchedulerConfig;
use deepinfer_model::experts::MemoryPlan;
use deepinfer_model::v4::{Model, ModelError};
use std::path::Path;

/// `--expert-cache-mib 1` as the issue names it, and a cache of one byte: the least the
/// store allows (two tokens' worth of experts), so nearly every step evicts.
const CACHES: [usize; 2] = [1 << 20, 1];

fn load_streamed(dir: &Path, cache: usize) -> Model {
    let plan = MemoryPlan {
        budget: None,
        expert_cache: Some(cache),
    };
    Model::load_with(dir, &plan, |_, _| {}).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Every position's logits of every golden prompt, fed whole then in chunks of 5, and two
/// prompts batched into one step.
fn logits_of(model: Model, g: &Golden) -> Vec<Vec<f32>> {
    let mut r = runner(model, 4, 0);
    let mut out = Vec::new();
    for p in g.prompts() {
        let toks = ids(&p["ids"]);
        out.extend(chunked_logits(&mut r, &toks, toks.len()));
        out.extend(chunked_logits(&mut r, &toks, 5));
    }
    let (a, b) = (ids(&g.prompts()[0]["ids"]), ids(&g.prompts()[1]["ids"]));
    let (sa, sb) = (r.add_sequence().unwrap(), r.add_sequence().unwrap());
    let feeds = [
        Feed {
            seq: sa,
            tokens: &a,
            all_logits: true,
        },
        Feed {
            seq: sb,
            tokens: &b,
            all_logits: true,
        },
    ];
    let l = r.step(&feeds).unwrap();
    out.extend((0..l.rows()).map(|i| l.row(i).to_vec()));
    out
}

#[test]
fn streamed_experts_give_the_resident_logits_bit_for_bit() {
    for config in ["tiny-a", "tiny-b", "tiny-c"] {
        let g = Golden::load(config);
        // HF's layout stores the experts dequantised (BF16): its own resident run is the
        // reference.
        for layout in ["official", "hf"] {
            let want = logits_of(load(config, layout), &g);
            for cache in CACHES {
                let model = load_streamed(&fixture(config).join(layout), cache);
                assert!(model.memory_plan().contains("streamed"));
                let store = model.weights.expert_store.clone().unwrap();
                let got = logits_of(model, &g);
                assert_eq!(got.len(), want.len());
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        same_bits(a, b),
                        "{config}/{layout} cache {cache}: row {i} differs (max {})",
                        max_abs_diff(a, b)
                    );
                }
                let s = store.stats();
                assert!(s.bytes_read > 0 && s.reads > 0, "{s:?}");
                if cache == 1 {
                    // A few slots for many experts: the cache had to evict and read again.
                    let experts = store_experts(config);
                    assert!(store.capacity() < experts, "{}", store.capacity());
                    assert!(s.reads as usize > experts, "{config}: {s:?}");
                }
            }
        }
    }
}

fn store_experts(config: &str) -> usize {
    let c = &load(config, "official").config;
    c.num_hidden_layers * c.n_routed_experts
}

#[test]
fn the_engine_streaming_experts_gets_the_golden_tokens_under_preemption() {
    let g = Golden::load("tiny-a");
    let model = load_streamed(&fixture("tiny-a").join("official"), 1);
    // As tests/engine.rs's preemption test: pools for one long sequence, four in flight.
    let budget = budget_for_one("tiny-a", 4, 732);
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: 48,
            prefill_chunk: Some(16),
            max_model_len: 732,
        },
        cache: cache_config(budget, 4, 0),
        model_name: "test".into(),
        forced_output: None,
        speculative: None,
        prefix_disk: None,
    };
    let (h, join) = engine::start(model, config).unwrap();
    expect_golden_greedy_picks(&h, &g, &PREEMPTION_PICKS, "streamed, preempted");
    assert!(h.metrics.num_preemptions.get() > 0);
    h.drain().unwrap();
    h.shutdown();
    join.join().unwrap().unwrap();
}

/// tiny-a's official checkpoint in a directory of its own.
fn copy_of_tiny_a() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture("tiny-a").join("official")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    dir
}

fn first_step(model: Model) -> Result<(), ModelError> {
    let mut r = runner(model, 1, 0);
    let seq = r.add_sequence().unwrap();
    r.step(&[Feed {
        seq,
        tokens: &[1, 2, 3, 4, 5, 6, 7, 8],
        all_logits: false,
    }])
    .map(|_| ())
    .map_err(|e| match e {
        deepinfer_engine::runner::RunnerError::Model(m) => m,
        other => panic!("not a model error: {other}"),
    })
}

#[test]
fn a_shard_that_changes_after_load_is_an_error_not_other_numbers() {
    let shard = "model-00002-of-00002.safetensors";
    // Truncated: its experts' bytes are gone.
    let dir = copy_of_tiny_a();
    let model = load_streamed(dir.path(), 1);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join(shard))
        .unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len / 2).unwrap();
    let err = first_step(model).unwrap_err().to_string();
    assert!(err.contains(shard) && err.contains("changed"), "{err}");

    // Rewritten in place, same length, other bytes.
    let dir = copy_of_tiny_a();
    let model = load_streamed(dir.path(), 1);
    let path = dir.path().join(shard);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    for b in &mut bytes[n / 2..] {
        *b ^= 0x11;
    }
    std::fs::write(&path, &bytes).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH).unwrap();
    let err = first_step(model).unwrap_err().to_string();
    assert!(err.contains(shard) && err.contains("changed"), "{err}");
}
