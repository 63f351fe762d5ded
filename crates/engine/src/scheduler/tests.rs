//! The scheduler against a fake allocator that counts tokens instead of blocks: admission,
//! the token budget, chunking, preemption and speculation slots, step by step.

use super::*;
use crate::cache::SeqId;
use crate::request::{Request, RequestOutput};
use crate::sampling_params::SamplingParams;
use std::collections::BTreeMap;

/// `slots` sequences at most, `tokens` tokens in all.
struct FakeAllocator {
    slots: usize,
    tokens: usize,
    held: BTreeMap<SeqId, usize>,
    next: u64,
}

impl FakeAllocator {
    fn new(slots: usize, tokens: usize) -> Self {
        Self {
            slots,
            tokens,
            held: BTreeMap::new(),
            next: 0,
        }
    }

    fn used(&self) -> usize {
        self.held.values().sum()
    }
}

impl BlockAllocator for FakeAllocator {
    fn add_seq(&mut self) -> Result<SeqId, CacheError> {
        if self.held.len() == self.slots {
            return Err(CacheError::NoFreeSlot {
                max_seqs: self.slots,
            });
        }
        let id = SeqId::fake(self.next);
        self.next += 1;
        self.held.insert(id, 0);
        Ok(id)
    }

    fn ensure_capacity(&mut self, seq: SeqId, tokens: usize) -> Result<(), CacheError> {
        let used = self.used();
        let have = self.held.get_mut(&seq).ok_or(CacheError::UnknownSeq(seq))?;
        let needed = tokens.saturating_sub(*have);
        if used + needed > self.tokens {
            return Err(CacheError::OutOfBlocks {
                pool: "fake",
                needed,
                free: self.tokens - used,
            });
        }
        *have = (*have).max(tokens);
        Ok(())
    }

    fn free_seq(&mut self, seq: SeqId) -> Result<(), CacheError> {
        self.held
            .remove(&seq)
            .map(|_| ())
            .ok_or(CacheError::UnknownSeq(seq))
    }
}

struct Harness {
    cfg: SchedulerConfig,
    sched: Scheduler,
    seqs: HashMap<RequestId, Sequence>,
    alloc: FakeAllocator,
    out: SchedulerOutput,
}

impl Harness {
    fn new(cfg: SchedulerConfig, alloc: FakeAllocator) -> Self {
        Self {
            cfg,
            sched: Scheduler::default(),
            seqs: HashMap::new(),
            alloc,
            out: SchedulerOutput::default(),
        }
    }

    fn add(&mut self, id: RequestId, prompt_len: usize) {
        let (tx, _rx) = std::sync::mpsc::channel::<RequestOutput>();
        let req = Request {
            id,
            prompt_ids: vec![2; prompt_len],
            params: SamplingParams {
                max_tokens: 1000,
                ..SamplingParams::default()
            },
            arrival: std::time::Instant::now(),
            images: Vec::new(),
        };
        self.seqs.insert(id, Sequence::new(req, Box::new(tx)));
        self.sched.add(id);
    }

    /// Schedules a step and applies it as the engine would: scheduled tokens computed, a
    /// token sampled where logits were asked for, every draft accepted.
    fn step(&mut self) -> Vec<ScheduledSeq> {
        self.sched
            .schedule(&self.cfg, &mut self.seqs, &mut self.alloc, &mut self.out)
            .unwrap();
        for s in &self.out.scheduled {
            let seq = self.seqs.get_mut(&s.id).unwrap();
            seq.num_computed += s.num_tokens;
            let drafts: Vec<u32> = seq.spec.draft_ids.drain(..s.num_draft).collect();
            seq.output_ids.extend(drafts);
            if s.num_logits > 0 {
                seq.output_ids.push(7);
            }
            seq.spec.draft_ids.clear();
        }
        self.out.scheduled.clone()
    }

    fn draft(&mut self, id: RequestId, k: usize) {
        self.seqs.get_mut(&id).unwrap().spec.draft_ids = vec![5; k];
    }
}

fn cfg(max_num_seqs: usize, budget: usize, chunk: Option<usize>) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens: budget,
        prefill_chunk: chunk,
        max_model_len: 4096,
    }
}

fn sched(id: RequestId, num_tokens: usize, num_draft: usize, num_logits: usize) -> ScheduledSeq {
    ScheduledSeq {
        id,
        num_tokens,
        num_draft,
        num_logits,
    }
}

#[test]
fn admission_in_arrival_order_up_to_max_num_seqs() {
    let mut h = Harness::new(cfg(2, 100, None), FakeAllocator::new(8, 1000));
    for id in 0..3 {
        h.add(id, 5);
    }
    assert_eq!(h.step(), [sched(0, 5, 0, 1), sched(1, 5, 0, 1)]);
    assert_eq!(h.sched.waiting, [2]);
    // Running sequences decode; the third waits for a free place.
    assert_eq!(h.step(), [sched(0, 1, 0, 1), sched(1, 1, 0, 1)]);
    h.sched.remove(0);
    let cache = h.seqs.remove(&0).unwrap().cache.unwrap();
    h.alloc.free_seq(cache).unwrap();
    assert_eq!(h.step(), [sched(1, 1, 0, 1), sched(2, 5, 0, 1)]);
}

#[test]
fn no_slot_or_no_room_leaves_a_request_waiting() {
    let mut h = Harness::new(cfg(8, 100, None), FakeAllocator::new(1, 1000));
    h.add(0, 4);
    h.add(1, 4);
    assert_eq!(h.step(), [sched(0, 4, 0, 1)]);
    assert_eq!(h.sched.waiting, [1], "no slot: still waiting");
    let mut h = Harness::new(cfg(8, 100, None), FakeAllocator::new(4, 6));
    h.add(0, 4);
    h.add(1, 4);
    assert_eq!(h.step(), [sched(0, 4, 0, 1)]);
    assert_eq!(h.sched.waiting, [1], "no room: still waiting");
    assert_eq!(
        h.alloc.held.len(),
        1,
        "the refused sequence's slot was given back"
    );
}

#[test]
fn chunked_prefill_under_the_budget_never_starves_a_decode() {
    let mut h = Harness::new(cfg(4, 16, Some(8)), FakeAllocator::new(4, 10_000));
    h.add(0, 3);
    h.add(1, 100);
    let first = h.step();
    assert_eq!(first, [sched(0, 3, 0, 1), sched(1, 8, 0, 0)]);
    let mut fed = 8;
    for step in 1..20 {
        let s = h.step();
        let total: usize = s.iter().map(|s| s.num_tokens).sum();
        assert!(total <= 16, "step {step}: {total} tokens");
        assert_eq!(
            s[0],
            sched(0, 1, 0, 1),
            "step {step}: the decode was starved"
        );
        let chunk = s[1];
        assert!(chunk.num_tokens <= 8);
        fed += chunk.num_tokens;
        // Logits only for the chunk that completes the prompt.
        assert_eq!(chunk.num_logits, usize::from(fed == 100), "step {step}");
        if fed >= 100 {
            break;
        }
    }
    assert_eq!(fed, 100);
}

#[test]
fn preemption_frees_the_newest_and_recomputes_it_first() {
    // 20 tokens of room: two 8-token prompts fit, then their decodes run out.
    let mut h = Harness::new(cfg(4, 100, None), FakeAllocator::new(4, 20));
    h.add(0, 8);
    h.add(1, 8);
    assert_eq!(h.step(), [sched(0, 8, 0, 1), sched(1, 8, 0, 1)]);
    for _ in 0..2 {
        assert_eq!(h.step(), [sched(0, 1, 0, 1), sched(1, 1, 0, 1)]);
    }
    // 20 used: sequence 0 needs one more, so 1 (the newest) is preempted.
    let s = h.step();
    assert_eq!(s, [sched(0, 1, 0, 1)]);
    assert_eq!(h.out.preempted, [1]);
    assert_eq!(h.sched.waiting, [1]);
    let seq1 = &h.seqs[&1];
    assert_eq!((seq1.num_computed, seq1.cache), (0, None));
    assert_eq!(h.alloc.held.len(), 1);
    // Nothing is admitted in the step that preempted; recompute runs prompt and output.
    h.sched.remove(0);
    let cache = h.seqs.remove(&0).unwrap().cache.unwrap();
    h.alloc.free_seq(cache).unwrap();
    assert_eq!(h.step(), [sched(1, 11, 0, 1)]);
}

#[test]
fn a_sequence_that_cannot_grow_alone_preempts_itself() {
    let mut h = Harness::new(cfg(4, 100, None), FakeAllocator::new(4, 5));
    h.add(0, 5);
    assert_eq!(h.step(), [sched(0, 5, 0, 1)]);
    assert_eq!(h.step(), []);
    assert_eq!(h.out.preempted, [0]);
    assert_eq!(h.sched.waiting, [0]);
    assert!(h.alloc.held.is_empty());
}

#[test]
fn drafts_get_slots_and_logits_for_verification() {
    let mut h = Harness::new(cfg(4, 100, None), FakeAllocator::new(4, 1000));
    h.add(0, 6);
    h.add(1, 6);
    h.step();
    h.draft(0, 3);
    h.draft(1, 2);
    assert_eq!(h.step(), [sched(0, 4, 3, 4), sched(1, 3, 2, 3)]);
    // The allocator saw the drafts' rows.
    let held: Vec<usize> = h.alloc.held.values().copied().collect();
    assert_eq!(held, [6 + 1 + 3, 6 + 1 + 2]);
    // Drafts are not given to a sequence still feeding its prompt.
    h.add(2, 50);
    h.draft(2, 3);
    let s = h.step();
    assert_eq!(s[2], sched(2, 50, 0, 1));
}

#[test]
fn drafts_are_trimmed_to_the_budget_and_the_request_limits() {
    let mut h = Harness::new(cfg(4, 6, None), FakeAllocator::new(4, 1000));
    h.add(0, 2);
    h.add(1, 2);
    h.step();
    h.draft(0, 4);
    h.draft(1, 4);
    // 6 tokens: 0 gets 1 + 4, 1 gets its own token only.
    assert_eq!(h.step(), [sched(0, 5, 4, 5), sched(1, 1, 0, 1)]);
    // max_tokens: a step emits at most drafts + 1 tokens.
    let mut h = Harness::new(cfg(4, 100, None), FakeAllocator::new(4, 1000));
    h.add(0, 2);
    h.seqs.get_mut(&0).unwrap().request.params.max_tokens = 3;
    h.step(); // 1 output token
    h.draft(0, 4);
    assert_eq!(h.step(), [sched(0, 2, 1, 2)], "3 - 1 emitted - 1 = 1 draft");
    // The context limit likewise.
    let mut h = Harness::new(
        SchedulerConfig {
            max_model_len: 6,
            ..cfg(4, 100, None)
        },
        FakeAllocator::new(4, 1000),
    );
    h.add(0, 2);
    h.step(); // 3 tokens
    h.draft(0, 4);
    assert_eq!(h.step(), [sched(0, 3, 2, 3)], "6 - 3 - 1 = 2 drafts");
}

#[test]
fn drafts_are_dropped_before_anyone_is_preempted() {
    // Room for 6 + 1 + 1 tokens: the drafts do not fit, the sequence's own token does.
    let mut h = Harness::new(cfg(4, 100, None), FakeAllocator::new(4, 8));
    h.add(0, 6);
    h.step();
    h.draft(0, 3);
    assert_eq!(h.step(), [sched(0, 1, 0, 1)]);
    assert!(h.out.preempted.is_empty());
}

/// A sink whose reader is behind while the flag is set.
struct SlowSink(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl crate::request::OutputSink for SlowSink {
    fn send(&mut self, _: RequestOutput) -> bool {
        true
    }

    fn has_room(&self) -> bool {
        !self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[test]
fn a_sequence_whose_reader_is_behind_waits_with_its_cache() {
    let mut h = Harness::new(cfg(4, 100, None), FakeAllocator::new(4, 1000));
    h.add(0, 3);
    h.add(1, 3);
    let behind = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    h.seqs.get_mut(&1).unwrap().out = Box::new(SlowSink(behind.clone()));
    assert_eq!(h.step().len(), 2);
    behind.store(true, std::sync::atomic::Ordering::Relaxed);
    for _ in 0..3 {
        let ids: Vec<RequestId> = h.step().iter().map(|s| s.id).collect();
        assert_eq!(ids, [0]);
    }
    // Paused, not preempted: it still holds its cache and is still running.
    assert!(h.seqs[&1].cache.is_some() && h.sched.running.contains(&1));
    behind.store(false, std::sync::atomic::Ordering::Relaxed);
    let ids: Vec<RequestId> = h.step().iter().map(|s| s.id).collect();
    assert_eq!(ids, [0, 1]);
}

#[test]
fn a_paused_sequence_gives_its_place_to_a_waiting_one() {
    let mut h = Harness::new(cfg(1, 100, None), FakeAllocator::new(1, 1000));
    h.add(0, 3);
    let behind = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    h.seqs.get_mut(&0).unwrap().out = Box::new(SlowSink(behind.clone()));
    assert_eq!(h.step().len(), 1);
    h.add(1, 3);
    // Sequence 0 holds the only slot but waits for its reader: 1 takes its place.
    behind.store(true, std::sync::atomic::Ordering::Relaxed);
    let ids: Vec<RequestId> = h.step().iter().map(|s| s.id).collect();
    assert_eq!(ids, [1]);
    assert_eq!(h.out.preempted, [0]);
    assert!(h.seqs[&0].cache.is_none() && h.sched.waiting.contains(&0));
    // Still behind: it keeps its place in line but is not admitted.
    let ids: Vec<RequestId> = h.step().iter().map(|s| s.id).collect();
    assert_eq!(ids, [1]);
    assert!(h.out.preempted.is_empty());
}

#[test]
fn a_request_whose_prefix_is_read_ahead_waits_while_others_run() {
    let mut h = Harness::new(cfg(4, 64, None), FakeAllocator::new(4, 1000));
    h.add(1, 8);
    assert_eq!(h.step(), [sched(1, 8, 0, 1)]);
    let done = crate::cache::disk::ReadAhead::default();
    h.add(2, 8);
    h.add(3, 8);
    h.seqs.get_mut(&2).unwrap().read_ahead = Some(done.clone());
    // 1 decodes, 3 (behind 2 in line) is admitted, 2 keeps its place.
    assert_eq!(h.step(), [sched(1, 1, 0, 1), sched(3, 8, 0, 1)]);
    assert_eq!(h.sched.waiting, [2]);
    done.store(true, std::sync::atomic::Ordering::Release);
    assert_eq!(
        h.step(),
        [sched(1, 1, 0, 1), sched(3, 1, 0, 1), sched(2, 8, 0, 1)]
    );
    // Alone, nothing to overlap with: admitted at once, read or not.
    let mut h = Harness::new(cfg(4, 64, None), FakeAllocator::new(4, 1000));
    h.add(5, 8);
    h.seqs.get_mut(&5).unwrap().read_ahead = Some(Default::default());
    assert_eq!(h.step(), [sched(5, 8, 0, 1)]);
}

/// A prefill chunk never ends inside an image span: it stops before one, or when one
/// starts the chunk, takes it whole, past the chunk size and the budget if need be.
#[test]
fn chunks_keep_image_spans_whole() {
    use crate::request::{ImageSource, PromptImage};
    let mut h = Harness::new(cfg(4, 16, Some(8)), FakeAllocator::new(4, 10_000));
    h.sched.whole_images = true;
    h.add(0, 60);
    let image = |offset, len| PromptImage {
        offset,
        len,
        source: ImageSource::Embeds(Vec::new().into()),
        digest: [0; 32],
    };
    // Spans 5..25 (longer than the budget) and 30..34.
    h.seqs.get_mut(&0).unwrap().request.images = vec![image(5, 20), image(30, 4)];
    let chunks: Vec<usize> = (0..8).map(|_| h.step()[0].num_tokens).collect();
    assert_eq!(chunks, [5, 20, 5, 8, 8, 8, 6, 1]);
}
