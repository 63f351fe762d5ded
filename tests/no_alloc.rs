//! A steady decode step allocates nothing: the model's workspace, the kernels' scratch and
//! the rayon pool are all reused from step to step. Counted with a global allocator, on
//! every thread, over whole forward passes (this file holds one test, so nothing else runs
//! in the process meanwhile).

mod common;

use common::{load, runner};
use deepinfer_engine::runner::SeqWork;
use deepinfer_model::batch::{ForwardBatch, Logits, SeqSpan};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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

#[test]
fn steady_decode_steps_allocate_nothing() {
    // tiny-a has every layer kind (SWA, CSA with the indexer, HCA) and both router kinds.
    let mut r = runner(load("tiny-a", "official"), 3, 1);
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|s| (0..40 + 9 * s).map(|i| (i * 37 + s * 11) % 300).collect())
        .collect();
    let seqs: Vec<_> = prompts.iter().map(|_| r.add_sequence().unwrap()).collect();
    for (&seq, p) in seqs.iter().zip(&prompts) {
        r.reserve(seq, p.len() + 1).unwrap();
        r.step(&[SeqWork {
            seq,
            tokens: p,
            all_logits: false,
        }])
        .unwrap();
    }
    // One decode token for each of the three sequences, rolled back after every step.
    let mut batch = ForwardBatch::default();
    for (i, p) in prompts.iter().enumerate() {
        batch.token_ids.push(7 + i as u32);
        batch.positions.push(p.len());
        batch.spans.push(SeqSpan { start: i, len: 1 });
        batch.logits_rows.push(i);
    }
    let mut logits = Logits {
        vocab: 0,
        data: Vec::new(),
    };
    let (model, cache) = r.parts_mut();
    let mut view = cache.view(&seqs).unwrap();
    let mut step = |logits: &mut Logits, count: bool| {
        COUNTING.store(count, Ordering::SeqCst);
        model.forward_into(&batch, &mut view, logits, None).unwrap();
        COUNTING.store(false, Ordering::SeqCst);
    };
    // As the engine runs it: inside its compute pool, the calling thread one of the workers.
    let pool = deepinfer_engine::engine::compute_pool().unwrap();
    let first = pool.install(|| {
        for _ in 0..3 {
            step(&mut logits, false);
        }
        let first = logits.data.clone();
        ALLOCS.store(0, Ordering::SeqCst);
        for _ in 0..5 {
            step(&mut logits, true);
        }
        first
    });
    assert_eq!(
        ALLOCS.load(Ordering::SeqCst),
        0,
        "allocations during five steady decode steps"
    );
    // The same step on the same cache gives the same logits (rows are rewritten, not added).
    assert_eq!(logits.data, first);
    assert!(logits.data.iter().all(|v| v.is_finite()));
}
