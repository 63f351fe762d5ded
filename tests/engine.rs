//! The engine end to end on the golden models: concurrency, chunking, a tight token budget,
//! preemption, aborts and disconnects — every request still gets HF's greedy tokens, and the
//! pools end empty.

mod common;

use common::*;
use deepinfer_engine::engine::{self, EngineConfig, EngineCore, EngineError, EngineHandle};
use deepinfer_engine::request::FinishReason;
use deepinfer_engine::sampling_params::SamplingParams;
use deepinfer_engine::scheduler::SchedulerConfig;
use deepinfer_engine::scripted::{ScriptedOutput, ScriptedTurn};
use std::thread::JoinHandle;

type Join = JoinHandle<Result<EngineCore, EngineError>>;

fn start(
    config: &str,
    sched: SchedulerConfig,
    budget: usize,
    max_seqs: usize,
) -> (EngineHandle, Join) {
    let cache = cache_config(budget, max_seqs, 0);
    engine::start(
        load(config, "official"),
        EngineConfig {
            scheduler: sched,
            cache,
            model_name: "test".into(),
            forced_output: None,
            speculative: None,
            prefix_disk: None,
        },
    )
    .unwrap()
}

fn sched(
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    prefill_chunk: Option<usize>,
) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens,
        prefill_chunk,
        max_model_len: 4096,
    }
}

fn assert_pools_empty(join: Join) {
    let core = join.join().unwrap().unwrap();
    for u in core.cache().usage() {
        assert_eq!(
            (u.used_blocks, u.used_bytes),
            (0, 0),
            "pool {} not empty",
            u.name
        );
    }
}

/// Every prompt of a config at once, through a small token budget and 7-token chunks.
fn all_prompts_concurrently(config: &str) {
    let g = Golden::load(config);
    let (h, join) = start(config, sched(8, 24, Some(7)), 64 << 20, 8);
    expect_golden_greedy(&h, &g, config);
    h.drain().unwrap();
    h.shutdown();
    assert_pools_empty(join);
}

#[test]
fn concurrent_requests_get_their_solo_tokens() {
    for config in ["tiny-a", "tiny-b", "tiny-c"] {
        all_prompts_concurrently(config);
    }
}

#[test]
fn preemption_still_finishes_every_request_with_the_same_tokens() {
    // Room for one 732-token sequence and a little more, and two of them in flight (plus two
    // shorter ones): the pools cannot hold them all, so the scheduler has to preempt.
    let g = Golden::load("tiny-a");
    let budget = budget_for_one("tiny-a", 4, 732);
    let s = SchedulerConfig {
        max_model_len: 732,
        ..sched(4, 48, Some(16))
    };
    let (h, join) = start("tiny-a", s, budget, 4);
    expect_golden_greedy_picks(&h, &g, &PREEMPTION_PICKS, "under preemption");
    h.drain().unwrap();
    let preemptions = h.metrics.num_preemptions.get();
    assert!(preemptions > 0, "the budget was meant to force preemption");
    h.shutdown();
    assert_pools_empty(join);
}

#[test]
fn aborts_and_disconnects_free_their_cache() {
    let (h, join) = start("tiny-a", sched(8, 64, Some(16)), 64 << 20, 8);
    let (id, rx) = h.add_request((0..200).collect(), greedy(1000)).unwrap();
    let (_, dropped) = h.add_request((0..100).collect(), greedy(1000)).unwrap();
    drop(dropped); // a client that went away
    let first = rx.recv().unwrap();
    assert_eq!(first.new_token_ids.len(), 1);
    h.abort(id);
    let (_, reason) = collect(rx);
    assert_eq!(reason, Some(FinishReason::Abort));
    h.drain().unwrap();
    h.shutdown();
    assert_pools_empty(join);
}

#[test]
fn bad_requests_are_refused_up_front() {
    let (h, join) = start("tiny-c", sched(4, 64, None), 16 << 20, 4);
    let vocab = 96;
    assert!(matches!(
        h.add_request(vec![], greedy(4)),
        Err(EngineError::EmptyPrompt)
    ));
    assert!(matches!(
        h.add_request(vec![1, vocab], greedy(4)),
        Err(EngineError::TokenOutOfRange { .. })
    ));
    let err = h.add_request(vec![1; 4096], greedy(4)).unwrap_err();
    assert!(err.to_string().contains("4096"), "{err}");
    let bad = SamplingParams {
        temperature: -1.0,
        ..greedy(4)
    };
    assert!(matches!(
        h.add_request(vec![1, 2], bad),
        Err(EngineError::Param(_))
    ));
    // A good request still works afterwards, and stops at EOS when not ignored.
    let (_, rx) = h
        .add_request(
            vec![3, 1, 4, 1, 5],
            SamplingParams {
                max_tokens: 16,
                ..greedy(16)
            }
            .with_eos(),
        )
        .unwrap();
    let (toks, reason) = collect(rx);
    assert_eq!(reason, Some(FinishReason::Stop));
    assert_eq!(toks.last(), Some(&1));
    h.shutdown();
    assert_pools_empty(join);
}

#[test]
fn a_cache_too_small_for_max_model_len_is_a_startup_error() {
    let cache = cache_config(budget_for_one("tiny-a", 2, 100), 2, 0);
    let err = engine::start(
        load("tiny-a", "official"),
        EngineConfig {
            scheduler: sched(2, 64, None),
            cache,
            model_name: "test".into(),
            forced_output: None,
            speculative: None,
            prefix_disk: None,
        },
    )
    .err()
    .expect("must fail");
    assert!(matches!(err, EngineError::CacheTooSmall { .. }), "{err}");
}

#[test]
fn invalid_engine_settings_are_startup_errors() {
    for (s, field) in [
        (sched(0, 64, None), "max_num_seqs"),
        (sched(4, 0, None), "max_num_batched_tokens"),
        (sched(4, 64, Some(0)), "prefill_chunk"),
        (
            SchedulerConfig {
                max_model_len: 1,
                ..sched(4, 64, None)
            },
            "max_model_len",
        ),
    ] {
        let cache = cache_config(16 << 20, 4, 0);
        let err = engine::start(
            load("tiny-c", "official"),
            EngineConfig {
                scheduler: s,
                cache,
                model_name: "test".into(),
                forced_output: None,
                speculative: None,
                prefix_disk: None,
            },
        )
        .err()
        .expect("must fail");
        assert!(err.to_string().contains(field), "{err}");
    }
}

trait WithEos {
    fn with_eos(self) -> Self;
}

impl WithEos for SamplingParams {
    fn with_eos(mut self) -> Self {
        self.ignore_eos = false;
        self
    }
}

/// The test hook behind `serve --debug-force-output`: every request generates the script,
/// then EOS, through the scheduler and sampler (both requests of a batch, whatever their
/// sampling settings); a prompt ending in a turn's trigger generates that turn's text
/// instead; ids outside the vocabulary are a startup error.
#[test]
fn a_forced_output_script_is_generated_then_eos() {
    let script = ScriptedOutput {
        turns: vec![
            ScriptedTurn {
                after: Some(vec![6, 6]),
                output: vec![11, 12],
            },
            ScriptedTurn {
                after: None,
                output: vec![7, 8, 9, 10],
            },
        ],
    };
    let start_with = |forced_output| {
        engine::start(
            load("tiny-c", "official"),
            EngineConfig {
                scheduler: sched(4, 64, None),
                cache: cache_config(16 << 20, 4, 0),
                model_name: "test".into(),
                forced_output,
                speculative: None,
                prefix_disk: None,
            },
        )
    };
    let (h, join) = start_with(Some(script.clone())).unwrap();
    let sampled = SamplingParams {
        temperature: 1.0,
        seed: Some(3),
        max_tokens: 16,
        ..SamplingParams::default()
    };
    let (_, a) = h.add_request(vec![3, 1, 4], greedy(16).with_eos()).unwrap();
    let (_, b) = h.add_request(vec![2, 7], sampled).unwrap();
    let (_, c) = h.add_request(vec![5], greedy(2)).unwrap();
    let (_, d) = h.add_request(vec![6, 6, 3], greedy(16).with_eos()).unwrap();
    assert_eq!(collect(d), (vec![11, 12, 1], Some(FinishReason::Stop)));
    for rx in [a, b] {
        let (toks, reason) = collect(rx);
        assert_eq!(toks, [7, 8, 9, 10, 1]);
        assert_eq!(reason, Some(FinishReason::Stop));
    }
    assert_eq!(collect(c), (vec![7, 8], Some(FinishReason::Length)));
    h.shutdown();
    assert_pools_empty(join);

    let err = start_with(Some(ScriptedOutput::always(vec![7, 96])))
        .err()
        .expect("must fail");
    assert!(err.to_string().contains("forced_output"), "{err}");
}

/// `stop` ends a request like `abort` (cache freed at once) but counts as a normal stop.
#[test]
fn a_stop_from_the_caller_counts_as_stop_not_abort() {
    let (h, join) = start("tiny-a", sched(8, 64, Some(16)), 64 << 20, 8);
    let (id, rx) = h.add_request((0..50).collect(), greedy(1000)).unwrap();
    rx.recv().unwrap();
    h.stop(id);
    let (_, reason) = collect(rx);
    assert_eq!(reason, Some(FinishReason::Stop));
    h.drain().unwrap();
    let m = h.metrics.render();
    assert!(
        m.contains(
            "deepinfer:request_success_total{finished_reason=\"stop\",model_name=\"test\"} 1"
        ),
        "{m}"
    );
    assert!(!m.contains("finished_reason=\"abort\""), "{m}");
    h.shutdown();
    assert_pools_empty(join);
}
