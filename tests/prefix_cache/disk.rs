//! The prefix cache's disk tier: a prefix read back from disk (after a restart, or after
//! memory evicted it) gives the cold logits bit for bit; corrupt, torn and foreign entries
//! are misses that cost nothing but the recomputation; a directory that cannot be written
//! leaves the cache in memory.

use super::*;
use deepinfer_engine::cache::disk::{DiskConfig, DiskStats};
use deepinfer_engine::cache::CacheError;
use deepinfer_engine::engine;
use deepinfer_engine::spec::SpeculativeConfig;
use deepinfer_model::numerics::Numerics;
use std::path::Path;
use std::sync::atomic::Ordering;

const CHECKPOINT: [u8; 32] = [7; 32];

fn disk_config(dir: &Path, checkpoint: [u8; 32]) -> DiskConfig {
    DiskConfig {
        dir: dir.to_path_buf(),
        max_bytes: 1 << 30,
        checkpoint,
        kernels: deepinfer_kernels::cpu::family(),
    }
}

/// A prefix-caching manager over `dir`, and its disk counters.
fn disk_cache(r: &ModelRunner, budget: usize, dir: &Path) -> (CacheManager, Arc<DiskStats>) {
    let mut c = cache(r, budget, 2, true);
    let stats = Arc::new(DiskStats::default());
    let on = c
        .attach_disk(
            &r.model().config,
            &disk_config(dir, CHECKPOINT),
            stats.clone(),
        )
        .unwrap();
    assert!(on, "the disk tier is usable");
    (c, stats)
}

fn runner(config: &str, numerics: Numerics) -> ModelRunner {
    let mut model = load(config, "official");
    model.set_numerics(numerics).unwrap();
    ModelRunner::new(model)
}

fn files(dir: &Path, ext: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(dir).unwrap().flatten() {
        if sub.path().is_dir() {
            for f in std::fs::read_dir(sub.path()).unwrap().flatten() {
                if f.path().extension().is_some_and(|e| e == ext) {
                    out.push(f.path());
                }
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_prefix_read_back_after_a_restart_gives_the_cold_logits_bit_for_bit() {
    // V4 in both numerics (official keeps packed records on disk), V4.1 in reference.
    let cases = [
        ("tiny-a", 2, Numerics::Official),
        ("tiny-a", 2, Numerics::Reference),
        ("tiny-b", 1, Numerics::Official),
        ("tiny-c", 3, Numerics::Reference),
        ("tiny-v41-a", 2, Numerics::Reference),
        ("tiny-v41-b", 2, Numerics::Reference),
    ];
    for (config, pi, numerics) in cases {
        let g = Golden::load(config);
        let base: Vec<u32> = long_sequence(&g, pi).into_iter().take(160).collect();
        let mut r = runner(config, numerics);
        let vocab = r.model().config.vocab_size as u32;
        // Around block (16), window (8) and compression (4, 8, 16) boundaries.
        for shared in [9, 16, 17, 33, 64, 65, 100, 160] {
            let other = diverging(&base, shared, vocab);
            let cold = cold_logits(&mut r, &other);
            let dir = tempfile::tempdir().unwrap();
            let (mut first, _) = disk_cache(&r, 64 << 20, dir.path());
            run(&mut r, &mut first, &[&base], 64);
            drop(first); // a clean shutdown
            let (mut second, stats) = disk_cache(&r, 64 << 20, dir.path());
            let chunk = if shared == 33 { 5 } else { 64 };
            let (warm, resumed) = run(&mut r, &mut second, &[&other], chunk);
            let hit = shared.min(other.len() - 1) / BLOCK * BLOCK;
            let label = format!("{config} {numerics:?} shared {shared}");
            assert_eq!(resumed[0], hit, "{label}: resumed");
            let from_disk = stats.hit_tokens.load(Ordering::Relaxed);
            assert_eq!(from_disk, hit as u64, "{label}: tokens read from disk");
            assert_rows_equal(&warm[0], &cold[resumed[0]..], &label);
        }
    }
}

/// Copies the entries of `from` into a fresh directory (what a crash leaves behind).
fn copy_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for sub in std::fs::read_dir(from).unwrap().flatten() {
        if sub.path().is_dir() {
            let dest = to.path().join(sub.file_name());
            std::fs::create_dir(&dest).unwrap();
            for f in std::fs::read_dir(sub.path()).unwrap().flatten() {
                std::fs::copy(f.path(), dest.join(f.file_name())).unwrap();
            }
        }
    }
    to
}

/// The depth (blocks from the start) an entry's header records.
fn depth_of(path: &Path) -> u32 {
    let b = std::fs::read(path).unwrap();
    u32::from_le_bytes(b[108..112].try_into().unwrap())
}

#[test]
fn a_chat_turn_after_a_crash_resumes_where_the_last_one_ended() {
    // Without a clean shutdown, the disk has every block (written as it was cached) and
    // the snapshot where the sequence ended: the next turn resumes there.
    let g = Golden::load("tiny-a");
    let turn1: Vec<u32> = long_sequence(&g, 2).into_iter().take(90).collect();
    let turn2: Vec<u32> = long_sequence(&g, 2).into_iter().take(150).collect();
    let mut r = runner("tiny-a", Numerics::Official);
    let cold = cold_logits(&mut r, &turn2);
    let dir = tempfile::tempdir().unwrap();
    let (mut first, _) = disk_cache(&r, 64 << 20, dir.path());
    run(&mut r, &mut first, &[&turn1], 64);
    first.flush_disk();
    let crashed = copy_dir(dir.path());
    let snaps = files(crashed.path(), "snap");
    assert_eq!(files(crashed.path(), "blk").len(), 5);
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    assert_eq!(depth_of(&snaps[0]), 5);
    let (mut second, stats) = disk_cache(&r, 64 << 20, crashed.path());
    let (warm, resumed) = run(&mut r, &mut second, &[&turn2], 64);
    assert_eq!(resumed[0], 80);
    assert_eq!(stats.hit_tokens.load(Ordering::Relaxed), 80);
    assert_rows_equal(&warm[0], &cold[80..], "second turn");
}

#[test]
fn corrupt_torn_and_foreign_entries_are_misses_and_go() {
    let g = Golden::load("tiny-a");
    let base: Vec<u32> = long_sequence(&g, 3).into_iter().take(120).collect();
    let mut r = runner("tiny-a", Numerics::Official);
    let cold = cold_logits(&mut r, &base);
    let dir = tempfile::tempdir().unwrap();
    let (mut first, _) = disk_cache(&r, 64 << 20, dir.path());
    run(&mut r, &mut first, &[&base], 64);
    drop(first);
    let at = |ext: &str, depth: u32| {
        let all = files(dir.path(), ext);
        all.into_iter().find(|p| depth_of(p) == depth).unwrap()
    };
    assert_eq!(files(dir.path(), "blk").len(), 7);
    assert_eq!(files(dir.path(), "snap").len(), 7);
    // A byte flipped in block 4, the deepest snapshot cut short, a torn write left behind.
    let block4 = at("blk", 4);
    let mut bytes = std::fs::read(&block4).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&block4, &bytes).unwrap();
    let corrupt = bytes;
    let snap7 = at("snap", 7);
    let len = std::fs::metadata(&snap7).unwrap().len();
    let f = std::fs::File::options().write(true).open(&snap7).unwrap();
    f.set_len(len - 3).unwrap();
    let sub = block4.parent().unwrap().to_path_buf();
    std::fs::write(sub.join(".tmp-77"), b"half an entry").unwrap();
    let (mut second, stats) = disk_cache(&r, 64 << 20, dir.path());
    assert!(
        !sub.join(".tmp-77").exists(),
        "torn writes are removed at start"
    );
    let (warm, resumed) = run(&mut r, &mut second, &[&base], 64);
    assert_eq!(resumed[0], 48, "up to the block before the corrupt one");
    assert_rows_equal(&warm[0], &cold[48..], "a corrupt block");
    assert_eq!(stats.errors.load(Ordering::Relaxed), 1);
    drop(second);
    let again = std::fs::read(&block4).unwrap();
    assert_ne!(again, corrupt, "block 4 was computed again and rewritten");
    // Block 4 was computed again and written; the cut snapshot is found out when read.
    let (mut third, stats) = disk_cache(&r, 64 << 20, dir.path());
    let (warm, resumed) = run(&mut r, &mut third, &[&base], 64);
    assert_eq!(resumed[0], 96);
    assert_eq!(stats.errors.load(Ordering::Relaxed), 1);
    assert_rows_equal(&warm[0], &cold[96..], "a cut snapshot");
    drop(third);
    assert_eq!(
        std::fs::metadata(&snap7).unwrap().len(),
        len,
        "rewritten whole"
    );
}

#[test]
fn memory_evictions_are_read_back_from_disk() {
    let g = Golden::load("tiny-a");
    let mut r = runner("tiny-a", Numerics::Official);
    let vocab = r.model().config.vocab_size as u32;
    let seqs = unrelated_sequences(&g, vocab);
    // Memory for about two of them: each evicts an older one, which goes to disk.
    let budget = budget_for_one("tiny-a", 2, 330);
    let dir = tempfile::tempdir().unwrap();
    let (mut small, stats) = disk_cache(&r, budget, dir.path());
    for round in 0..2 {
        if round == 1 {
            small.flush_disk();
        }
        for (k, s) in seqs.iter().enumerate() {
            let cold = cold_logits(&mut r, s);
            // Steps of one block: each takes one snapshot, so the few records suffice.
            let (warm, resumed) = run(&mut r, &mut small, &[s], BLOCK);
            let label = format!("round {round} seq {k}");
            if round == 1 {
                assert_eq!(resumed[0], (s.len() - 1) / BLOCK * BLOCK, "{label}");
            }
            assert_rows_equal(&warm[0], &cold[resumed[0]..], &label);
        }
    }
    assert!(
        stats.hit_tokens.load(Ordering::Relaxed) > 0,
        "some came from disk"
    );
    assert_eq!(stats.errors.load(Ordering::Relaxed), 0);
}

#[test]
fn another_identity_never_reads_and_a_second_process_is_kept_out() {
    let g = Golden::load("tiny-a");
    let base: Vec<u32> = long_sequence(&g, 1).into_iter().take(60).collect();
    let dir = tempfile::tempdir().unwrap();
    let mut r = runner("tiny-a", Numerics::Reference);
    let (mut first, _) = disk_cache(&r, 64 << 20, dir.path());
    run(&mut r, &mut first, &[&base], 64);
    // While the first holds the directory, no other cache may use it.
    let mut other = cache(&r, 64 << 20, 2, true);
    let busy = other.attach_disk(
        &r.model().config,
        &disk_config(dir.path(), CHECKPOINT),
        Default::default(),
    );
    let err = busy.unwrap_err();
    assert!(matches!(err, CacheError::PrefixDirInUse { .. }));
    assert!(err.to_string().contains("--prefix-cache-dir"), "{err}");
    drop(first);
    // Other numerics, another checkpoint or other kernels: another identity, nothing found.
    let mut official = runner("tiny-a", Numerics::Official);
    let (mut c, stats) = disk_cache(&official, 64 << 20, dir.path());
    let (_, resumed) = run(&mut official, &mut c, &[&base], 64);
    assert_eq!(
        (resumed[0], stats.hit_tokens.load(Ordering::Relaxed)),
        (0, 0)
    );
    drop(c);
    // Another checkpoint, or another kernel family (its sums in another order).
    let other_kernels = DiskConfig {
        kernels: "another kernel family",
        ..disk_config(dir.path(), CHECKPOINT)
    };
    for foreign in [disk_config(dir.path(), [8; 32]), other_kernels] {
        let mut c = cache(&r, 64 << 20, 2, true);
        assert!(c
            .attach_disk(&r.model().config, &foreign, Default::default())
            .unwrap());
        let (_, resumed) = run(&mut r, &mut c, &[&base], 64);
        assert_eq!(resumed[0], 0, "{foreign:?} read another identity's entries");
    }
    let (mut same, _) = disk_cache(&r, 64 << 20, dir.path());
    let (_, resumed) = run(&mut r, &mut same, &[&base], 64);
    assert_eq!(
        resumed[0], 48,
        "the first identity's entries are all still there"
    );
}

#[test]
fn a_directory_that_cannot_be_written_leaves_the_cache_in_memory() {
    let g = Golden::load("tiny-a");
    let base: Vec<u32> = long_sequence(&g, 1).into_iter().take(60).collect();
    let mut r = runner("tiny-a", Numerics::Official);
    let cold = cold_logits(&mut r, &base);
    // A path that is a file: no disk tier, and no error.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let mut c = cache(&r, 64 << 20, 2, true);
    let on = c.attach_disk(
        &r.model().config,
        &disk_config(&file, CHECKPOINT),
        Default::default(),
    );
    assert_eq!(on, Ok(false));
    // A directory that stops taking writes once running (as a full disk does).
    let dir = tempfile::tempdir().unwrap();
    let (mut c, stats) = disk_cache(&r, 64 << 20, dir.path());
    for sub in std::fs::read_dir(dir.path()).unwrap().flatten() {
        if sub.path().is_dir() {
            std::fs::remove_dir_all(sub.path()).unwrap();
            std::fs::write(sub.path(), b"in the way").unwrap();
        }
    }
    run(&mut r, &mut c, &[&base], 64);
    let (warm, resumed) = run(&mut r, &mut c, &[&base], 64);
    assert_eq!(resumed[0], 48, "memory hits go on");
    assert_rows_equal(&warm[0], &cold[48..], "memory only");
    c.flush_disk();
    assert!(stats.errors.load(Ordering::Relaxed) > 0);
}

/// The configuration of an engine on tiny-c (which has an MTP block) drafting 2 tokens a
/// step, its prefix cache on `dir` if given.
fn drafting_config(dir: Option<&Path>, budget: usize) -> EngineConfig {
    let json = r#"{"method": "mtp", "num_speculative_tokens": 2, "adaptive": false}"#;
    EngineConfig {
        speculative: Some(SpeculativeConfig::from_json(json, None).unwrap()),
        prefix_disk: dir.map(|d| disk_config(d, CHECKPOINT)),
        ..engine_config(true, budget, 3, Some(16))
    }
}

fn drafting_engine(dir: Option<&Path>, budget: usize) -> EngineCore {
    let metrics = Arc::new(EngineMetrics::new("prefix-disk"));
    let config = drafting_config(dir, budget);
    EngineCore::new(load("tiny-c", "official"), config, metrics).unwrap()
}

/// The smallest budget (in steps of 1/16) in which a drafting engine holds `tokens`.
fn drafting_budget(tokens: usize) -> usize {
    let model = load("tiny-c", "official");
    let mut budget = 1 << 12;
    loop {
        let config = drafting_config(None, budget);
        if engine::max_model_len_that_fits(&model.config, &config).is_ok_and(|n| n >= tokens) {
            return budget;
        }
        budget += budget / 16;
    }
}

#[test]
fn engine_turns_resume_from_disk_across_restarts_batched_preempted_and_drafting() {
    let vocab = drafting_engine(None, 32 << 20).vocab() as u32;
    let system: Vec<u32> = (0..70).map(|i| (i * 13 + 5) % vocab).collect();
    let mut prompts: Vec<Vec<u32>> = (0..3)
        .map(|k| {
            let own = (0..90 + 5 * k).map(|i| (i * 3 + k) % vocab);
            system.iter().copied().chain(own).collect()
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    // Room for two of the three at full length: preemption and evictions to disk.
    let budget = drafting_budget(256);
    let (mut cached_before, mut preempted) = (0, 0);
    for turn in 0..3u64 {
        // A fresh engine each turn: everything it reuses comes from the directory.
        let mut warm = drafting_engine(Some(dir.path()), budget);
        let got = serve(&mut warm, &prompts, 100 * turn);
        let mut cold = drafting_engine(None, 32 << 20);
        let want = serve(&mut cold, &prompts, 100 * turn);
        for k in 0..3 {
            assert_eq!(got[k].0, want[k].0, "turn {turn} request {k}: tokens");
        }
        let from_disk = warm.metrics().prefix_disk.hits.get();
        if turn > 0 {
            for (k, g) in got.iter().enumerate() {
                assert!(
                    g.2 >= cached_before,
                    "turn {turn} request {k}: {} cached",
                    g.2
                );
            }
            assert!(from_disk > 0, "turn {turn}: nothing read from disk");
        }
        preempted += warm.metrics().num_preemptions.get();
        assert!(warm.metrics().spec_decode_num_drafts.get() > 0);
        cached_before = 64;
        for (p, g) in prompts.iter_mut().zip(&got) {
            p.extend(&g.0);
            p.extend((0..5).map(|i| (i * 11 + turn as u32) % vocab));
        }
    }
    assert!(preempted > 0, "the budget was meant to force preemption");
}

#[test]
fn the_directory_stays_within_its_bound_and_keeps_the_recent() {
    let mut r = runner("tiny-a", Numerics::Official);
    let vocab = r.model().config.vocab_size as u32;
    let seqs: Vec<Vec<u32>> = (0..6u32)
        .map(|k| (0..120).map(|i| (i * 7 + k * 101 + 3) % vocab).collect())
        .collect();
    // Measure one sequence's entries, then allow about two and a half.
    let probe = tempfile::tempdir().unwrap();
    let (mut c, _) = disk_cache(&r, 64 << 20, probe.path());
    run(&mut r, &mut c, &[&seqs[0]], 64);
    drop(c);
    let one: u64 = ["blk", "snap"]
        .iter()
        .flat_map(|e| files(probe.path(), e))
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    let bound = one * 5 / 2;
    let dir = tempfile::tempdir().unwrap();
    let mut c = cache(&r, 64 << 20, 2, true);
    let cfg = DiskConfig {
        max_bytes: bound,
        ..disk_config(dir.path(), CHECKPOINT)
    };
    let stats = Arc::new(DiskStats::default());
    assert!(c
        .attach_disk(&r.model().config, &cfg, stats.clone())
        .unwrap());
    for s in &seqs {
        run(&mut r, &mut c, &[s], 64);
        c.flush_disk();
        let held = stats.bytes.load(Ordering::Relaxed);
        assert!(held <= bound, "{held} bytes on disk, bound {bound}");
    }
    let on_disk: u64 = ["blk", "snap"]
        .iter()
        .flat_map(|e| files(dir.path(), e))
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert_eq!(
        on_disk,
        stats.bytes.load(Ordering::Relaxed),
        "the index counts the files"
    );
    drop(c);
    // After a restart the most recent sequence resumes from disk, the oldest does not.
    let (mut c, _) = disk_cache(&r, 64 << 20, dir.path());
    let cold_last = cold_logits(&mut r, &seqs[5]);
    let (warm, resumed) = run(&mut r, &mut c, &[&seqs[5]], 64);
    assert_eq!(resumed[0], 112);
    assert_rows_equal(&warm[0], &cold_last[112..], "the most recent");
    let (_, resumed) = run(&mut r, &mut c, &[&seqs[0]], 64);
    assert_eq!(resumed[0], 0, "the least recent went");
}
