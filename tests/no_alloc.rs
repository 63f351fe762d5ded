//! A steady engine step allocates nothing: scheduling, the batch, the forward pass (the
//! model's workspace, the kernels' scratch, the rayon pool), sampling, speculative
//! verification and drafting, the deltas — all reuse their buffers from step to step.
//! Counted with a global allocator, on every thread, over whole engine steps (this file
//! holds one test, so nothing else runs in the process meanwhile).

mod common;

use common::{cache_config, load};
use deepinfer_engine::engine::{EngineConfig, EngineCore};
use deepinfer_engine::metrics::EngineMetrics;
use deepinfer_engine::request::{OutputSink, Request, RequestOutput};
use deepinfer_engine::sampling_params::SamplingParams;
use deepinfer_engine::scheduler::SchedulerConfig;
use deepinfer_engine::spec::SpeculativeConfig;
use deepinfer_model::numerics::Numerics;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A sink that only counts: the server's channels allocate per message on their own side.
struct CountingSink(Arc<AtomicUsize>);

impl OutputSink for CountingSink {
    fn send(&mut self, out: RequestOutput) -> bool {
        self.0.fetch_add(out.new_token_ids.len(), Ordering::Relaxed);
        true
    }
}

/// Three requests decoding side by side, run to past their prefill, then `counted` steps
/// with the allocator watched. Output lists grow by amortised doubling, so the counted
/// window sits between two doublings (every output 33..=63 tokens long; accepted drafts
/// let one request run ahead of another).
fn steady_steps_allocate_nothing(
    fixture: &str,
    speculative: Option<SpeculativeConfig>,
    numerics: Numerics,
    counted: usize,
) {
    // tiny-a has every layer kind (SWA, CSA with the indexer, HCA), both router kinds, and
    // an MTP block; tiny-v41-a V4.1's (shared entries and picks, candidates, Engram) and a
    // DSpark drafter, tiny-a-dspark a V4 one.
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: 256,
            prefill_chunk: None,
            max_model_len: 4096,
        },
        cache: cache_config(64 << 20, 4, 0),
        model_name: "no_alloc".into(),
        forced_output: None,
        speculative,
        prefix_disk: None,
    };
    let metrics = Arc::new(EngineMetrics::new("no_alloc"));
    let mut model = load(fixture, "official");
    model.set_numerics(numerics).unwrap();
    let mut core = EngineCore::new(model, config, metrics).unwrap();
    let tokens: Vec<_> = (0..3).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let emitted = |tokens: &[Arc<AtomicUsize>]| -> Vec<usize> {
        tokens.iter().map(|t| t.load(Ordering::SeqCst)).collect()
    };
    for s in 0..3u32 {
        let prompt = (0..40 + 9 * s).map(|i| (i * 37 + s * 11) % 300).collect();
        let params = SamplingParams {
            temperature: 0.0,
            max_tokens: 1000,
            ignore_eos: true,
            ..SamplingParams::default()
        };
        let req = Request {
            id: s as u64,
            prompt_ids: prompt,
            params,
            arrival: Instant::now(),
            images: Vec::new(),
        };
        core.add_request(req, Box::new(CountingSink(tokens[s as usize].clone())));
    }
    while emitted(&tokens).into_iter().min().unwrap() < 33 {
        core.step().unwrap();
    }
    let before: usize = emitted(&tokens).iter().sum();
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..counted {
        core.step().unwrap();
    }
    COUNTING.store(false, Ordering::SeqCst);
    let made = emitted(&tokens).iter().sum::<usize>() - before;
    assert!(made >= 3 * counted, "{made} tokens in {counted} steps");
    let longest = emitted(&tokens).into_iter().max().unwrap();
    assert!(
        longest <= 63,
        "the window crossed a doubling ({longest} tokens)"
    );
    assert_eq!(
        ALLOCS.load(Ordering::SeqCst),
        0,
        "allocations during {counted} steady engine steps"
    );
}

#[test]
fn steady_engine_steps_allocate_nothing() {
    // As the engine runs: inside its compute pool, the calling thread one of the workers.
    let pool = deepinfer_engine::engine::compute_pool().unwrap();
    pool.install(|| {
        steady_steps_allocate_nothing("tiny-a", None, Numerics::Reference, 10);
        // Official numerics: quantised projection inputs, packed cache records.
        steady_steps_allocate_nothing("tiny-a", None, Numerics::Official, 10);
        steady_steps_allocate_nothing("tiny-v41-a", None, Numerics::Reference, 10);
        // Speculation every step: verification, rollback, and the MTP drafter's passes.
        let spec = SpeculativeConfig::from_json(
            r#"{"method": "mtp", "num_speculative_tokens": 2, "adaptive": false}"#,
            None,
        )
        .unwrap();
        steady_steps_allocate_nothing("tiny-a", Some(spec), Numerics::Reference, 8);
        // DSpark's draft blocks, on both kinds of stage.
        for fixture in ["tiny-a-dspark", "tiny-v41-a"] {
            let spec =
                SpeculativeConfig::from_json(r#"{"method": "dspark", "adaptive": false}"#, None)
                    .unwrap();
            steady_steps_allocate_nothing(fixture, Some(spec), Numerics::Reference, 8);
        }
    });
}
