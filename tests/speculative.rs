//! Speculative decoding end to end on the golden models: under greedy decoding the output
//! is token for token the plain output (HF's greedy tokens), whatever the drafter proposes,
//! for every draft length, batched and chunked, under preemption; the drafts it does accept
//! are counted; and a checkpoint without an MTP block refuses to draft.

mod common;

use common::*;
use deepinfer_engine::engine::{self, EngineConfig, EngineCore, EngineError, EngineHandle};
use deepinfer_engine::request::{FinishReason, OutputSink, RequestOutput};
use deepinfer_engine::sampling_params::SamplingParams;
use deepinfer_engine::scheduler::SchedulerConfig;
use deepinfer_engine::spec::{SpecMethod, SpeculativeConfig};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;

type Join = JoinHandle<Result<EngineCore, EngineError>>;

/// The policy test decides from step times: it runs alone, while the other tests of this
/// file share the machine with each other.
static MACHINE: RwLock<()> = RwLock::new(());

fn shared_machine() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(PoisonError::into_inner)
}

fn whole_machine() -> RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(PoisonError::into_inner)
}

fn sched(
    max_num_seqs: usize,
    budget: usize,
    chunk: Option<usize>,
    max_len: usize,
) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens: budget,
        prefill_chunk: chunk,
        max_model_len: max_len,
    }
}

fn start(
    config: &str,
    s: SchedulerConfig,
    cache_bytes: usize,
    spec: SpeculativeConfig,
) -> (EngineHandle, Join) {
    let max_seqs = s.max_num_seqs;
    engine::start(
        load(config, "official"),
        EngineConfig {
            scheduler: s,
            cache: cache_config(cache_bytes, max_seqs, 0),
            model_name: "test".into(),
            forced_output: None,
            speculative: Some(spec),
            prefix_disk: None,
        },
    )
    .unwrap()
}

fn mtp(k: usize) -> SpeculativeConfig {
    let json = format!(r#"{{"method": "mtp", "num_speculative_tokens": {k}, "adaptive": false}}"#);
    SpeculativeConfig::from_json(&json, None).unwrap()
}

/// The replay drafter on the golden greedy continuations: drafts right with probability
/// `rate`, so verification accepts some and rejects some.
fn replay(k: usize, rate: f64, g: &Golden) -> SpeculativeConfig {
    let json = format!(
        r#"{{"method": "replay", "num_speculative_tokens": {k}, "acceptance_rate": {rate}, "adaptive": false, "seed": 7}}"#
    );
    let mut c = SpeculativeConfig::from_json(&json, None).unwrap();
    if let SpecMethod::Replay { script, .. } = &mut c.method {
        *script = g
            .prompts()
            .iter()
            .map(|p| (ids(&p["ids"]), ids(&p["greedy"])))
            .collect();
    }
    c
}

/// Every tie-safe prompt at once; each must get HF's greedy tokens. Returns the accepted
/// draft tokens counted by the engine.
fn run_all(config: &str, s: SchedulerConfig, spec: SpeculativeConfig, label: &str) -> u64 {
    let g = Golden::load(config);
    let (h, join) = start(config, s, 64 << 20, spec);
    expect_golden_greedy(&h, &g, &format!("{config} {label}"));
    h.drain().unwrap();
    let m = &h.metrics;
    let accepted = m.spec_decode_num_accepted_tokens.get();
    assert!(
        m.spec_decode_num_drafts.get() > 0,
        "{config} {label}: nothing was drafted"
    );
    h.shutdown();
    let core = join.join().unwrap().unwrap();
    for u in core.cache().usage() {
        assert_eq!(
            u.used_blocks, 0,
            "{config} {label}: pool {} not empty",
            u.name
        );
    }
    accepted
}

#[test]
fn mtp_drafts_never_change_greedy_output() {
    let _machine = shared_machine();
    for config in ["tiny-a", "tiny-b", "tiny-c"] {
        for k in 1..=5 {
            run_all(
                config,
                sched(8, 256, None, 4096),
                mtp(k),
                &format!("mtp k={k}"),
            );
        }
        // Batched under a small budget and chunked prompts: drafts are trimmed to fit.
        run_all(
            config,
            sched(8, 24, Some(7), 4096),
            mtp(3),
            "mtp k=3 chunked",
        );
    }
}

#[test]
fn accepted_drafts_roll_back_exactly_at_every_rate() {
    let _machine = shared_machine();
    for config in ["tiny-a", "tiny-b", "tiny-c"] {
        let g = Golden::load(config);
        for (k, rate) in [(1, 0.5), (3, 0.5), (5, 0.9), (4, 1.0), (2, 0.0)] {
            let label = format!("replay k={k} rate={rate}");
            let accepted = run_all(
                config,
                sched(8, 256, None, 4096),
                replay(k, rate, &g),
                &label,
            );
            if rate > 0.0 {
                assert!(accepted > 0, "{config} {label}: no draft accepted");
            } else {
                assert_eq!(accepted, 0, "{config} {label}");
            }
        }
        run_all(
            config,
            sched(8, 24, Some(7), 4096),
            replay(4, 0.7, &g),
            "replay chunked",
        );
    }
}

#[test]
fn speculation_survives_preemption() {
    let _machine = shared_machine();
    // Room for about one long sequence: the scheduler preempts, recomputes, and drafts
    // again; every request still gets the plain tokens.
    let g = Golden::load("tiny-a");
    let cfg = load("tiny-a", "official").config;
    let mut budget = 1 << 16;
    loop {
        let c = deepinfer_engine::cache::CacheConfig {
            rollback_slack: 4,
            draft_layers: 1,
            ..cache_config(budget, 4, 0)
        };
        let fits = deepinfer_engine::cache::CacheManager::new(&cfg, c)
            .map(|m| m.max_tokens_per_seq())
            .unwrap_or(0);
        if fits >= 732 {
            break;
        }
        budget += budget / 8;
    }
    let (h, join) = start(
        "tiny-a",
        sched(4, 48, Some(16), 732),
        budget,
        replay(4, 0.8, &g),
    );
    expect_golden_greedy_picks(&h, &g, &PREEMPTION_PICKS, "speculating, preempted");
    h.drain().unwrap();
    assert!(
        h.metrics.num_preemptions.get() > 0,
        "the budget was meant to force preemption"
    );
    assert!(h.metrics.spec_decode_num_accepted_tokens.get() > 0);
    h.shutdown();
    join.join().unwrap().unwrap();
}

/// A sink whose reader stops reading after the first delta until released (a slow HTTP
/// client): its sequence pauses, keeping its drafts and cache, or is preempted for a
/// waiting request.
struct HeldSink {
    tx: std::sync::mpsc::Sender<RequestOutput>,
    sent: Arc<AtomicUsize>,
    released: Arc<AtomicBool>,
}

impl OutputSink for HeldSink {
    fn send(&mut self, out: RequestOutput) -> bool {
        self.sent.fetch_add(1, Ordering::AcqRel);
        self.tx.send(out).is_ok()
    }

    fn has_room(&self) -> bool {
        self.released.load(Ordering::Acquire) || self.sent.load(Ordering::Acquire) == 0
    }
}

#[test]
fn drafting_sequences_paused_or_preempted_for_their_readers_keep_the_plain_output() {
    let _machine = shared_machine();
    // Two drafting sequences pause after their first token (their readers hold back) and
    // fill both slots; two more requests arrive, so the scheduler preempts a paused one to
    // admit them. Once released, the paused and the preempted sequence resume (the latter
    // recomputes) and every request still gets the plain greedy tokens.
    let g = Golden::load("tiny-a");
    let prompts = tie_safe(&g);
    let (h, join) = start("tiny-a", sched(2, 256, None, 4096), 64 << 20, mtp(3));
    let released = Arc::new(AtomicBool::new(false));
    let held: Vec<_> = prompts[..2]
        .iter()
        .map(|p| {
            let (tx, rx) = std::sync::mpsc::channel();
            let sent = Arc::new(AtomicUsize::new(0));
            let sink = HeldSink {
                tx,
                sent: sent.clone(),
                released: released.clone(),
            };
            h.add_request_to(ids(&p["ids"]), greedy(32), Box::new(sink))
                .unwrap();
            let first = rx.recv().unwrap();
            assert_eq!(first.new_token_ids[..], ids(&p["greedy"])[..1]);
            (first, rx, sent)
        })
        .collect();
    let rxs: Vec<_> = prompts[2..4]
        .iter()
        .map(|p| h.add_request(ids(&p["ids"]), greedy(32)).unwrap().1)
        .collect();
    for (p, rx) in prompts[2..4].iter().zip(rxs) {
        assert_eq!(collect(rx).0, ids(&p["greedy"]), "p{}", p["index"]);
    }
    assert!(
        held.iter()
            .all(|(_, _, sent)| sent.load(Ordering::Acquire) == 1),
        "a paused sequence ran on"
    );
    assert!(
        h.metrics.num_preemptions.get() > 0,
        "no slot was free: a paused sequence must have been preempted"
    );
    released.store(true, Ordering::Release);
    for (p, (first, rx, _)) in prompts[..2].iter().zip(held) {
        let mut toks = first.new_token_ids.to_vec();
        toks.extend(collect(rx).0);
        assert_eq!(toks, ids(&p["greedy"]), "held p{}", p["index"]);
    }
    h.drain().unwrap();
    assert!(
        h.metrics.spec_decode_num_drafts.get() > 0,
        "nothing was drafted"
    );
    h.shutdown();
    let core = join.join().unwrap().unwrap();
    assert!(core.cache().usage().iter().all(|u| u.used_blocks == 0));
}

#[test]
fn max_tokens_and_the_context_cap_the_drafts() {
    let _machine = shared_machine();
    let g = Golden::load("tiny-c");
    let p = &tie_safe(&g)[0];
    let prompt = ids(&p["ids"]);
    let want = ids(&p["greedy"]);
    // Every draft right: without the cap a step would overshoot max_tokens.
    let (h, join) = start(
        "tiny-c",
        sched(4, 256, None, 4096),
        16 << 20,
        replay(5, 1.0, &g),
    );
    for n in [1, 2, 6, 7] {
        let (toks, reason) = collect(h.add_request(prompt.clone(), greedy(n)).unwrap().1);
        assert_eq!(toks, want[..n], "max_tokens {n}");
        assert_eq!(reason, Some(FinishReason::Length));
    }
    h.shutdown();
    join.join().unwrap().unwrap();
    // The context: prompt + 3 tokens.
    let len = prompt.len() + 3;
    let (h, join) = start(
        "tiny-c",
        sched(4, 256, None, len),
        16 << 20,
        replay(5, 1.0, &g),
    );
    let (toks, reason) = collect(h.add_request(prompt.clone(), greedy(32)).unwrap().1);
    assert_eq!(
        (toks.as_slice(), reason),
        (&want[..3], Some(FinishReason::Length))
    );
    h.shutdown();
    join.join().unwrap().unwrap();
}

#[test]
fn an_eos_among_accepted_drafts_ends_the_request_there() {
    let _machine = shared_machine();
    // The plain run stops at the first EOS: so must the speculative one, even when the
    // drafts run past it.
    let g = Golden::load("tiny-a");
    let p = &tie_safe(&g)[1];
    let prompt = ids(&p["ids"]);
    let greedy_toks = ids(&p["greedy"]);
    // Make the 5th greedy token the stop token.
    let stop = greedy_toks[4];
    let params = SamplingParams {
        stop_token_ids: vec![stop],
        ..greedy(32)
    };
    let first = greedy_toks.iter().position(|&t| t == stop).unwrap();
    let (h, join) = start(
        "tiny-a",
        sched(4, 256, None, 4096),
        64 << 20,
        replay(5, 1.0, &g),
    );
    let (toks, reason) = collect(h.add_request(prompt, params).unwrap().1);
    assert_eq!(toks, greedy_toks[..=first]);
    assert_eq!(reason, Some(FinishReason::Stop));
    h.shutdown();
    join.join().unwrap().unwrap();
}

#[test]
fn mtp_without_an_mtp_block_is_a_startup_error() {
    let _machine = shared_machine();
    let dir = tiny_c_without_mtp();
    let model = deepinfer_model::v4::Model::load(dir.path()).unwrap();
    let err = engine::start(
        model,
        EngineConfig {
            scheduler: sched(4, 64, None, 4096),
            cache: cache_config(16 << 20, 4, 0),
            model_name: "test".into(),
            forced_output: None,
            speculative: Some(mtp(2)),
            prefix_disk: None,
        },
    )
    .err()
    .expect("must fail");
    assert!(err.to_string().contains("MTP block"), "{err}");
}

/// With acceptance near zero (random weights), the adaptive policy stops drafting: after a
/// while almost no step drafts, and the output is still the plain output.
#[test]
fn the_policy_stops_drafting_that_does_not_pay() {
    let _machine = whole_machine();
    let g = Golden::load("tiny-a");
    let spec =
        SpeculativeConfig::from_json(r#"{"method": "mtp", "num_speculative_tokens": 3}"#, None)
            .unwrap();
    let (h, join) = start("tiny-a", sched(4, 256, None, 4096), 64 << 20, spec);
    let p = &tie_safe(&g)[1];
    let (toks, _) = collect(h.add_request(ids(&p["ids"]), greedy(200)).unwrap().1);
    assert_eq!(toks[..32], ids(&p["greedy"])[..]);
    let m = &h.metrics;
    let drafts = m.spec_decode_num_drafts.get();
    eprintln!(
        "200 tokens: {drafts} verify rounds, {} draft tokens, {} accepted",
        m.spec_decode_num_draft_tokens.get(),
        m.spec_decode_num_accepted_tokens.get()
    );
    // Forced drafting would verify in every one of the 200 steps; the backoff alone probes
    // about five times. The bound leaves room for step times disturbed by a neighbour
    // (the costs are measured, so noise can make drafting look cheap for a while).
    assert!(
        drafts <= 40,
        "{drafts} verify rounds in 200 steps: the policy kept drafting"
    );
    h.shutdown();
    join.join().unwrap().unwrap();
}

/// Sampling with speculation draws from the target's distribution: the first three tokens
/// of 2000 seeded requests, with and without drafts (the greedy continuation, often right),
/// have the same joint frequencies to within sampling error.
#[test]
fn sampled_output_keeps_the_target_distribution() {
    let _machine = shared_machine();
    const N: u64 = 2000;
    let g = Golden::load("tiny-c");
    let prompt = ids(&tie_safe(&g)[0]["ids"]);
    let params = |seed| SamplingParams {
        temperature: 1.0,
        top_k: 3,
        max_tokens: 3,
        ignore_eos: true,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let run = |spec: Option<SpeculativeConfig>| {
        let (h, join) = engine::start(
            load("tiny-c", "official"),
            EngineConfig {
                scheduler: sched(64, 512, None, 4096),
                cache: cache_config(64 << 20, 64, 0),
                model_name: "test".into(),
                forced_output: None,
                speculative: spec,
                prefix_disk: None,
            },
        )
        .unwrap();
        let rxs: Vec<_> = (0..N)
            .map(|s| h.add_request(prompt.clone(), params(s)).unwrap().1)
            .collect();
        let mut counts = std::collections::BTreeMap::new();
        for rx in rxs {
            *counts.entry(collect(rx).0).or_insert(0u64) += 1;
        }
        let accepted = h.metrics.spec_decode_num_accepted_tokens.get();
        h.shutdown();
        join.join().unwrap().unwrap();
        (counts, accepted)
    };
    let (plain, _) = run(None);
    let (spec, accepted) = run(Some(replay(2, 1.0, &g)));
    assert!(accepted > N / 10, "only {accepted} drafts accepted");
    let keys: std::collections::BTreeSet<_> = plain.keys().chain(spec.keys()).collect();
    assert!(
        keys.len() >= 5,
        "the distribution is too peaked to tell anything"
    );
    // Two-sample chi-square over the joint outcomes, against its 1e-4 critical value
    // (Wilson–Hilferty): a broken acceptance rule moves it far past that.
    let chi2: f64 = keys
        .iter()
        .map(|k| {
            let (a, b) = (
                *plain.get(*k).unwrap_or(&0) as f64,
                *spec.get(*k).unwrap_or(&0) as f64,
            );
            (a - b).powi(2) / (a + b)
        })
        .sum();
    let df = (keys.len() - 1) as f64;
    let h = 2.0 / (9.0 * df);
    let critical = df * (1.0 - h + 3.72 * h.sqrt()).powi(3);
    assert!(
        chi2 <= critical,
        "chi-square {chi2:.1} > {critical:.1}: plain {plain:?}, speculative {spec:?}"
    );
}
