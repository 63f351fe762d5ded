//! Prefix caching, bit for bit: a request that resumes from a cached prefix gets exactly the
//! logits (and so the tokens) a cold prefill gives it, for shared prefixes of every length
//! around block, window and compression boundaries, chunked and batched, after evictions
//! and preemption; and every block and snapshot returns when the cache is reset.

mod common;
#[path = "prefix_cache/disk.rs"]
mod disk;

use common::*;
use deepinfer_engine::cache::{
    default_block_tokens, CacheBudget, CacheConfig, CacheManager, SeqId,
};
use deepinfer_engine::engine::{EngineConfig, EngineCore};
use deepinfer_engine::metrics::EngineMetrics;
use deepinfer_engine::request::Request;
use deepinfer_engine::runner::ModelRunner;
use deepinfer_engine::sampling_params::SamplingParams;
use deepinfer_engine::scheduler::SchedulerConfig;
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Instant;

/// Tokens per block in these tests: small, so that prompts cross many boundaries (tiny-a's
/// window is 8 tokens, its CSA ratio 4 and HCA ratio 8; tiny-b/c's HCA ratio 16).
const BLOCK: usize = 16;

fn cache(model: &ModelRunner, budget: usize, max_seqs: usize, prefix: bool) -> CacheManager {
    let cfg = CacheConfig {
        budget: CacheBudget::Bytes(budget),
        max_seqs,
        block_tokens: BLOCK,
        prefix_caching: prefix,
        ..CacheConfig::default()
    };
    CacheManager::new(&model.model().config, cfg).unwrap()
}

/// Runs sequences to their end as the engine would (resume from the prefix cache, capture
/// snapshots around every step, cache completed blocks) and returns the logits of every
/// position each computed, with where each resumed. All run side by side in steps of
/// `chunk` tokens.
fn run(
    r: &mut ModelRunner,
    c: &mut CacheManager,
    seqs: &[&[u32]],
    chunk: usize,
) -> (Vec<Vec<Vec<f32>>>, Vec<usize>) {
    let ids: Vec<SeqId> = seqs.iter().map(|_| c.add_seq().unwrap()).collect();
    let mut done: Vec<usize> = ids
        .iter()
        .zip(seqs)
        .map(|(&id, t)| c.attach_prefix(id, t.len(), &|i| t[i]).unwrap())
        .collect();
    let resumed = done.clone();
    let mut logits = vec![Vec::new(); seqs.len()];
    while done.iter().zip(seqs).any(|(d, t)| *d < t.len()) {
        r.clear();
        let mut who = Vec::new();
        for (i, t) in seqs.iter().enumerate() {
            let n = chunk.min(t.len() - done[i]);
            if n == 0 {
                continue;
            }
            c.ensure_capacity(ids[i], done[i] + n).unwrap();
            c.begin_capture(ids[i], done[i], done[i] + n).unwrap();
            r.add(ids[i], done[i], t[done[i]..done[i] + n].iter().copied(), n);
            r.add_lookback(t[..done[i]].iter().copied());
            who.push((i, n));
        }
        r.run(c, false).unwrap();
        let mut row = 0;
        for (i, n) in who {
            let l = r.logits();
            logits[i].extend((row..row + n).map(|j| l.row(j).to_vec()));
            row += n;
            done[i] += n;
            let t = seqs[i];
            c.commit_prefix(ids[i], done[i], &|k| t[k]).unwrap();
        }
    }
    for id in ids {
        c.free_seq(id).unwrap();
    }
    (logits, resumed)
}

/// `base` up to `shared`, then different tokens.
fn diverging(base: &[u32], shared: usize, vocab: u32) -> Vec<u32> {
    base.iter()
        .enumerate()
        .map(|(i, &t)| {
            if i < shared {
                t
            } else {
                (t + 7 + i as u32) % vocab
            }
        })
        .collect()
}

fn assert_rows_equal(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: rows");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            same_bits(a, b),
            "{what}: row {i} differs by {}",
            max_abs_diff(a, b)
        );
    }
}

#[test]
fn a_cached_prefix_gives_the_cold_logits_bit_for_bit() {
    // V4.1's too: shared compressed entries and keys, Engram n-grams across the boundary.
    for (config, pi) in [
        ("tiny-a", 2),
        ("tiny-b", 1),
        ("tiny-c", 3),
        ("tiny-v41-a", 2),
        ("tiny-v41-b", 2),
    ] {
        let g = Golden::load(config);
        let base: Vec<u32> = long_sequence(&g, pi).into_iter().take(160).collect();
        let mut r = ModelRunner::new(load(config, "official"));
        let vocab = r.model().config.vocab_size as u32;
        // Around block (16), window (8) and compression (4, 8, 16) boundaries.
        for shared in [
            1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 63, 64, 65, 100, 159, 160,
        ] {
            let other = diverging(&base, shared, vocab);
            let mut cold_cache = cache(&r, 64 << 20, 2, false);
            let (cold, _) = run(&mut r, &mut cold_cache, &[&other], 64);
            let mut warm_cache = cache(&r, 64 << 20, 2, true);
            run(&mut r, &mut warm_cache, &[&base], 64);
            for chunk in [1, 5, 64] {
                let (warm, resumed) = run(&mut r, &mut warm_cache, &[&other], chunk);
                let hit = shared.min(other.len() - 1) / BLOCK * BLOCK;
                assert!(
                    resumed[0] >= hit,
                    "{config} shared {shared}: resumed at {}",
                    resumed[0]
                );
                let label = format!("{config} shared {shared} chunk {chunk}");
                assert_rows_equal(&warm[0], &cold[0][resumed[0]..], &label);
            }
        }
    }
}

/// Official numerics keeps packed FP8/FP4 records in the pools and the snapshots: a resumed
/// prefix still gives the cold logits bit for bit.
#[test]
fn a_cached_prefix_of_packed_records_gives_the_cold_logits_bit_for_bit() {
    let g = Golden::load("tiny-a");
    let base: Vec<u32> = long_sequence(&g, 2).into_iter().take(100).collect();
    let mut model = load("tiny-a", "official");
    model
        .set_numerics(deepinfer_model::numerics::Numerics::Official)
        .unwrap();
    let mut r = ModelRunner::new(model);
    let vocab = r.model().config.vocab_size as u32;
    for shared in [7, 16, 17, 33, 64, 99] {
        let other = diverging(&base, shared, vocab);
        let mut cold_cache = cache(&r, 64 << 20, 2, false);
        let (cold, _) = run(&mut r, &mut cold_cache, &[&other], 64);
        let mut warm_cache = cache(&r, 64 << 20, 2, true);
        run(&mut r, &mut warm_cache, &[&base], 64);
        for chunk in [1, 64] {
            let (warm, resumed) = run(&mut r, &mut warm_cache, &[&other], chunk);
            assert!(resumed[0] >= shared / BLOCK * BLOCK, "shared {shared}");
            let label = format!("official shared {shared} chunk {chunk}");
            assert_rows_equal(&warm[0], &cold[0][resumed[0]..], &label);
        }
    }
}

#[test]
fn batched_sequences_share_one_cached_prefix() {
    let g = Golden::load("tiny-a");
    let base: Vec<u32> = long_sequence(&g, 3).into_iter().take(200).collect();
    let mut r = ModelRunner::new(load("tiny-a", "official"));
    let vocab = r.model().config.vocab_size as u32;
    let others: Vec<Vec<u32>> = [20, 48, 49, 130]
        .iter()
        .map(|&s| diverging(&base, s, vocab))
        .collect();
    let refs: Vec<&[u32]> = others.iter().map(|o| o.as_slice()).collect();
    let mut cold_cache = cache(&r, 64 << 20, 4, false);
    let (cold, _) = run(&mut r, &mut cold_cache, &refs, 32);
    let mut warm_cache = cache(&r, 64 << 20, 4, true);
    run(&mut r, &mut warm_cache, &[&base], 200);
    let (warm, resumed) = run(&mut r, &mut warm_cache, &refs, 7);
    assert_eq!(resumed, [16, 48, 48, 128]);
    for (i, (w, c)) in warm.iter().zip(&cold).enumerate() {
        assert_rows_equal(w, &c[resumed[i]..], &format!("sequence {i}"));
    }
}

#[test]
fn evicted_prefixes_are_recomputed_and_the_cache_empties() {
    let g = Golden::load("tiny-a");
    let mut r = ModelRunner::new(load("tiny-a", "official"));
    let vocab = r.model().config.vocab_size as u32;
    let seqs = unrelated_sequences(&g, vocab);
    // Room for about two of them: later ones evict the older ones' blocks and snapshots.
    let budget = budget_for_one("tiny-a", 1, 330);
    let mut cold_cache = cache(&r, 64 << 20, 1, false);
    let mut small = cache(&r, budget, 1, true);
    for round in 0..2 {
        for (k, s) in seqs.iter().enumerate() {
            let (cold, _) = run(&mut r, &mut cold_cache, &[s], 64);
            let (warm, resumed) = run(&mut r, &mut small, &[s], 64);
            assert_rows_equal(
                &warm[0],
                &cold[0][resumed[0]..],
                &format!("round {round} seq {k}"),
            );
        }
    }
    let usage = small.usage();
    assert!(usage.iter().all(|u| u.used_blocks == 0), "{usage:?}");
    small.reset_prefix_cache(false);
    for u in small.usage() {
        assert_eq!((u.used_blocks, u.cached_blocks), (0, 0), "{}", u.name);
    }
    let p = small.prefix_usage().unwrap();
    assert_eq!((p.nodes, p.snapshots), (0, 0));
}

/// Four sequences of up to 150 tokens with no prefix in common (the golden long sequences,
/// shifted), for evictions.
fn unrelated_sequences(g: &Golden, vocab: u32) -> Vec<Vec<u32>> {
    (0..4)
        .map(|k| {
            diverging(&long_sequence(g, k), 0, vocab)
                .into_iter()
                .take(150)
                .collect()
        })
        .collect()
}

/// Logits of every position of `tokens` from a cold prefill (steps of 64), in a cache that
/// keeps no prefixes.
fn cold_logits(r: &mut ModelRunner, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut c = cache(r, 64 << 20, 2, false);
    run(r, &mut c, &[tokens], 64).0.remove(0)
}

/// A budget that holds `tokens` tokens of `max_seqs` sequences with prefix caching.
fn budget_for_one(config: &str, max_seqs: usize, tokens: usize) -> usize {
    let model = load(config, "official");
    let mut lo = 1usize << 16;
    let mut hi = 1usize << 28;
    while lo < hi {
        let mid = (lo + hi) / 2;
        let cfg = CacheConfig {
            budget: CacheBudget::Bytes(mid),
            max_seqs,
            block_tokens: BLOCK,
            ..CacheConfig::default()
        };
        match CacheManager::max_tokens_for(&model.config, cfg) {
            Ok(n) if n >= tokens => hi = mid,
            _ => lo = mid + 1,
        }
    }
    lo
}

fn engine(prefix: bool, budget: usize, max_seqs: usize, chunk: Option<usize>) -> EngineCore {
    let config = engine_config(prefix, budget, max_seqs, chunk);
    let metrics = Arc::new(EngineMetrics::new("prefix"));
    EngineCore::new(load("tiny-a", "official"), config, metrics).unwrap()
}

fn engine_config(
    prefix: bool,
    budget: usize,
    max_seqs: usize,
    chunk: Option<usize>,
) -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: max_seqs,
            max_num_batched_tokens: 96,
            prefill_chunk: chunk,
            max_model_len: 256,
        },
        cache: CacheConfig {
            prefix_caching: prefix,
            block_tokens: BLOCK,
            ..cache_config(budget, max_seqs, 0)
        },
        model_name: "prefix".into(),
        forced_output: None,
        speculative: None,
        prefix_disk: None,
    }
}

/// Runs `prompts` (all queued at once) to the end on `core`.
fn serve(core: &mut EngineCore, prompts: &[Vec<u32>], first_id: u64) -> Vec<Outcome> {
    let rxs: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (tx, rx) = channel();
            let params = SamplingParams {
                logprobs: Some(5),
                ..greedy(12)
            };
            let req = Request {
                id: first_id + i as u64,
                prompt_ids: p.clone(),
                params,
                arrival: Instant::now(),
                images: Vec::new(),
            };
            core.add_request(req, Box::new(tx));
            rx
        })
        .collect();
    while core.has_work() {
        core.step().unwrap();
    }
    rxs.into_iter().map(outcome).collect()
}

#[test]
fn engine_turns_reuse_earlier_turns_and_report_it() {
    let g = Golden::load("tiny-a");
    // A chat: each turn is the last one's prompt, its answer and a new message.
    let mut warm = engine(true, 32 << 20, 4, Some(24));
    let mut cold = engine(false, 32 << 20, 4, None);
    let vocab = warm.vocab() as u32;
    let mut prompt: Vec<u32> = ids(&g.prompts()[1]["ids"]);
    for turn in 0..4u32 {
        let got = serve(&mut warm, std::slice::from_ref(&prompt), turn as u64 * 10);
        let want = serve(&mut cold, std::slice::from_ref(&prompt), turn as u64 * 10);
        assert_eq!(
            (&got[0].0, &got[0].1),
            (&want[0].0, &want[0].1),
            "turn {turn}"
        );
        if turn > 0 {
            // At least everything before the last turn's answer, in whole blocks.
            assert!(
                got[0].2 >= (prompt.len() - 30) / BLOCK * BLOCK - BLOCK,
                "turn {turn}: {}",
                got[0].2
            );
        }
        assert_eq!(want[0].2, 0);
        prompt.extend(&got[0].0);
        prompt.extend((0..9).map(|i| (turn * 31 + i * 7) % vocab));
    }
    let m = warm.metrics();
    assert!(m.prefix_cache_hits.get() > 0);
    assert!(m.prefix_cache_queries.get() > m.prefix_cache_hits.get());
    // Concurrent requests sharing a system prompt, with preemption (a cache for two of
    // three at full length): the same bits as without caching.
    let system: Vec<u32> = (0..70).map(|i| (i * 13 + 5) % vocab).collect();
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|k| {
            [
                system.clone(),
                (0..20 + 5 * k).map(|i| (i * 3 + k) % vocab).collect(),
            ]
            .concat()
        })
        .collect();
    let budget = budget_for_one("tiny-a", 3, 260);
    let mut tight = engine(true, budget, 3, Some(16));
    let got = serve(&mut tight, &prompts, 100);
    let again = serve(&mut tight, &prompts, 200);
    let want = serve(&mut cold, &prompts, 100);
    for k in 0..3 {
        assert_eq!(
            (&got[k].0, &got[k].1),
            (&want[k].0, &want[k].1),
            "request {k}"
        );
        assert_eq!(
            (&again[k].0, &again[k].1),
            (&want[k].0, &want[k].1),
            "again {k}"
        );
    }
    // With room for the snapshots, the second round resumes after the system prompt.
    let mut roomy = engine(true, 32 << 20, 3, Some(16));
    serve(&mut roomy, &prompts, 100);
    let again = serve(&mut roomy, &prompts, 200);
    for k in 0..3 {
        assert_eq!(
            (&again[k].0, &again[k].1),
            (&want[k].0, &want[k].1),
            "roomy {k}"
        );
        assert!(again[k].2 >= 64, "request {k} reused {}", again[k].2);
    }
    assert!(
        tight.metrics().num_preemptions.get() > 0,
        "no preemption happened"
    );
    for u in tight.cache().usage() {
        assert_eq!(u.used_blocks, 0, "{}", u.name);
    }
}

#[test]
fn the_default_block_is_whole_windows_of_at_least_128_tokens() {
    let m = load("tiny-b", "official");
    let b = default_block_tokens(&m.config);
    let (csa, hca) = (m.config.compress_rate_csa, m.config.compress_rate_hca);
    assert!(b >= 128 && b.is_multiple_of(hca) && b.is_multiple_of(csa));
    assert!(b < 128 + m.config.compress_rate_hca.max(m.config.compress_rate_csa));
}

/// Many requests at once, sharing prefixes of every length with each other: all get the
/// cold bits, and once they are done nothing is held but the cache, which resets to empty.
#[test]
fn a_load_of_shared_prefixes_returns_every_reference() {
    let mut cold = engine(false, 32 << 20, 8, None);
    let mut warm = engine(true, 8 << 20, 8, Some(40));
    let vocab = warm.vocab() as u32;
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let roots: Vec<Vec<u32>> = (0..3)
        .map(|r| (0..120).map(|i| (i * 11 + r * 5 + 1) % vocab).collect())
        .collect();
    for round in 0..3 {
        let prompts: Vec<Vec<u32>> = (0..12)
            .map(|_| {
                let root = &roots[next(3) as usize];
                let keep = next(121) as usize;
                let extra = 1 + next(40) as u32;
                let tail = (0..extra).map(|i| (i * 3 + keep as u32) % vocab);
                root[..keep].iter().copied().chain(tail).collect()
            })
            .collect();
        let got = serve(&mut warm, &prompts, 1000 * round);
        let want = serve(&mut cold, &prompts, 1000 * round);
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!((&g.0, &g.1), (&w.0, &w.1), "round {round} request {k}");
        }
    }
    assert!(warm.metrics().prefix_cache_hits.get() > 0);
    for u in warm.cache().usage() {
        assert_eq!((u.used_blocks, u.used_bytes), (0, 0), "{}", u.name);
    }
    warm.reset_prefix_cache(false);
    for u in warm.cache().usage() {
        assert_eq!((u.used_blocks, u.cached_blocks), (0, 0), "{}", u.name);
    }
    let p = warm.cache().prefix_usage().unwrap();
    assert_eq!((p.nodes, p.snapshots), (0, 0));
}
