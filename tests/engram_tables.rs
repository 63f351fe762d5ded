//! V4.1's Engram tables stay in the checkpoint's files (docs/MODEL.md §8.6: ~100 GB per layer in the
//! real model): loading and running a model whose tables are larger than everything else in
//! it grows the process by about the rest, not by the tables. Its own test binary, so no other
//! test shares the process whose resident memory is measured.

use deepinfer_engine::cache::CacheManager;
use deepinfer_engine::runner::{ModelRunner, SeqWork};
use deepinfer_model::engram::EngramLayout;
use deepinfer_model::synth::{preset, write_checkpoint};
use deepinfer_model::v4::Model;

mod common;

/// Resident set of this process, in bytes (Linux).
fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS line");
    let kb: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

#[test]
fn engram_tables_are_not_loaded() {
    let mut spec = preset("tiny-v41").unwrap();
    let v = spec.config.v41.as_mut().unwrap();
    let e = v.engram.as_mut().unwrap();
    // About 24 · 190 000 rows of 33 bytes: ~150 MB per table, twice the rest of the model.
    e.vocab_size = 190_000;
    let rows = EngramLayout::with_pad_id(&e.params(), 0).unwrap();
    e.num_embeddings = rows.rows_per_layer().iter().map(|&r| r as usize).collect();
    let table_bytes: usize = e
        .num_embeddings
        .iter()
        .map(|r| r * (e.head_dim + e.head_dim / 32))
        .sum();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(&spec, dir.path(), 0, |_, _| {}).unwrap();
    let file_bytes: usize = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|f| f.unwrap().metadata().unwrap().len() as usize)
        .sum();
    let rest = file_bytes - table_bytes;
    assert!(table_bytes > rest, "tables {table_bytes} B, rest {rest} B");

    let before = rss();
    let model = Model::load(dir.path()).unwrap();
    let loaded = rss() - before;
    let mut cache = CacheManager::new(&model.config, common::cache_config(64 << 20, 1, 0)).unwrap();
    let mut runner = ModelRunner::new(model);
    let seq = cache.add_seq().unwrap();
    let prompt: Vec<u32> = (0..256).map(|i| (i * 7919 % 120_000) as u32).collect();
    cache.ensure_capacity(seq, prompt.len()).unwrap();
    let work = SeqWork {
        seq,
        start: 0,
        tokens: &prompt,
        num_logits: 1,
        history: &[],
        images: &[],
    };
    let logits = runner.step(&mut cache, &[work]).unwrap();
    assert!(logits.row(0).iter().all(|v| v.is_finite()));
    let ran = rss() - before;
    let mb = |b: usize| b as f64 / 1e6;
    eprintln!(
        "tables {:.0} MB, rest of the checkpoint {:.0} MB; resident memory +{:.0} MB after \
         load, +{:.0} MB after a 256-token prefill",
        mb(table_bytes),
        mb(rest),
        mb(loaded),
        mb(ran),
    );
    // Loading the rest, its arenas, the cache and the step's buffers cost about twice the
    // rest; reading the tables in would cost them whole on top.
    assert!(
        ran < 3 * rest + table_bytes / 4,
        "resident memory grew by {ran} B: the tables ({table_bytes} B) were read in"
    );
}
