//! Fixture access shared by the golden tests.
#![allow(dead_code)]

use deepinfer_engine::cache::{CacheBudget, CacheConfig, SeqId};
use deepinfer_engine::runner::{ModelRunner, SeqWork};
use deepinfer_model::batch::Logits;
use deepinfer_model::v4::Model;
use safetensors::SafeTensors;
use serde_json::Value;
use std::path::{Path, PathBuf};

pub const LOGIT_TOL: f32 = 1e-4;

pub fn fixture(config: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/golden")
        .join(config)
}

/// What HF computed for one config (tools/make_golden.py).
pub struct Golden {
    pub meta: Value,
    bytes: Vec<u8>,
}

impl Golden {
    pub fn load(config: &str) -> Self {
        let dir = fixture(config);
        let meta = serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap())
            .unwrap();
        let bytes = std::fs::read(dir.join("golden.safetensors")).unwrap();
        Self { meta, bytes }
    }

    pub fn f32s(&self, name: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(name).unwrap();
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    pub fn i64s(&self, name: &str) -> Vec<i64> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(name).unwrap();
        t.data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    pub fn prompts(&self) -> &Vec<Value> {
        self.meta["prompts"].as_array().unwrap()
    }
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn load(config: &str, layout: &str) -> Model {
    Model::load(&fixture(config).join(layout)).unwrap_or_else(|e| panic!("{config}/{layout}: {e}"))
}

/// Cache settings for the tests: `budget` bytes, `max_seqs` state slots, `slack` tokens of
/// rollback, small blocks so that entries cross block boundaries often.
pub fn cache_config(budget: usize, max_seqs: usize, slack: usize) -> CacheConfig {
    CacheConfig {
        budget: CacheBudget::Bytes(budget),
        max_seqs,
        rollback_slack: slack,
        block_entries: 4,
    }
}

/// A runner over `model` with room for `max_seqs` sequences and `slack` tokens of rollback.
pub fn runner(model: Model, max_seqs: usize, slack: usize) -> ModelRunner {
    ModelRunner::new(model, cache_config(256 << 20, max_seqs, slack)).unwrap()
}

/// Appends `tokens` to `seq` in one step; logits of every token or of the last.
pub fn feed(r: &mut ModelRunner, seq: SeqId, tokens: &[u32], all_logits: bool) -> Logits {
    r.step(&[SeqWork {
        seq,
        tokens,
        all_logits,
    }])
    .unwrap()
    .clone()
}

/// Logits of every position of `tokens` fed to a fresh sequence in chunks of `chunk`.
pub fn chunked_logits(r: &mut ModelRunner, tokens: &[u32], chunk: usize) -> Vec<Vec<f32>> {
    let seq = r.add_sequence().unwrap();
    let mut out = Vec::new();
    for part in tokens.chunks(chunk) {
        let l = feed(r, seq, part, true);
        out.extend((0..l.rows()).map(|i| l.row(i).to_vec()));
    }
    r.free(seq).unwrap();
    out
}
