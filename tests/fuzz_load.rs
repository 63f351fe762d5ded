//! A bounded, seeded fuzz of config and checkpoint loading: the golden checkpoints with
//! their config, index and safetensors headers mutated (absurd and odd values, wrong types,
//! missing and extra keys, retagged dtypes, reshaped and moved tensors, truncated files).
//! Loading must end in a model or an error within a time bound, never a panic, an abort or a
//! hang; a model that loads must run a few greedy steps through the engine the same way.
//!
//! `DEEPINFER_FUZZ_CASES` sets the number of cases (default 300) and `DEEPINFER_FUZZ_SEED`
//! the seed (default 18).

use deepinfer_engine::cache::CacheConfig;
use deepinfer_engine::engine::{self, EngineConfig};
use deepinfer_engine::sampling_params::SamplingParams;
use deepinfer_engine::scheduler::SchedulerConfig;
use deepinfer_model::v4::Model;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha12Rng;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A seeded generator (the workspace's ChaCha), so a failing case can be replayed.
struct Rng(ChaCha12Rng);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(ChaCha12Rng::seed_from_u64(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.random()
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.random_range(0..n.max(1))
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn golden(config: &str, layout: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/golden")
        .join(config)
        .join(layout)
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
}

/// Values a mutation puts in place of another.
fn random_value(rng: &mut Rng) -> Value {
    match rng.below(12) {
        0 => Value::Null,
        1 => json!(rng.below(2) == 0),
        2 => json!(*rng.pick(&[
            0u64,
            1,
            2,
            3,
            7,
            1 << 16,
            100_000_000_000,
            1_000_000_000_000,
            1_000_000_000_000_000_000,
            u64::MAX
        ])),
        3 => json!(*rng.pick(&[-1i64, -1_000_000])),
        4 => json!(*rng.pick(&[0.0f64, 0.5, 1.5, 1e30, -2.5, 1e-30])),
        5 => json!(*rng.pick(&["gelu", "silu", "", "fp4", "fp8", "int4", "I8", "yarn", "x"])),
        6 => json!([0, 0]),
        7 => json!([128, 128]),
        8 => json!({}),
        9 => json!(["LlamaForCausalLM"]),
        10 => Value::Array((0..rng.below(70)).map(|i| json!(i % 5)).collect()),
        _ => json!(1e18),
    }
}

/// Keys worth adding: declared fields and sizes the loader reads.
const KEYS: &[&str] = &[
    "hidden_act",
    "tie_word_embeddings",
    "architectures",
    "expert_dtype",
    "dtype",
    "num_hidden_layers",
    "n_layers",
    "index_topk",
    "hc_sinkhorn_iters",
    "hc_mult",
    "max_position_embeddings",
    "max_seq_len",
    "eos_token_id",
    "bos_token_id",
    "vocab_size",
    "sliding_window",
    "window_size",
    "quantization_config",
    "num_nextn_predict_layers",
    "compress_ratios",
    "rope_scaling",
    "o_groups",
    "head_dim",
    "index_n_heads",
];

fn mutate_config(v: &mut Value, rng: &mut Rng) {
    let Some(obj) = v.as_object_mut() else {
        return;
    };
    match rng.below(4) {
        0 if !obj.is_empty() => {
            let key = obj.keys().nth(rng.below(obj.len())).unwrap().clone();
            obj.remove(&key);
        }
        1 if !obj.is_empty() => {
            let key = obj.keys().nth(rng.below(obj.len())).unwrap().clone();
            match obj.get_mut(&key).unwrap() {
                Value::Object(inner) if !inner.is_empty() => {
                    let k = inner.keys().nth(rng.below(inner.len())).unwrap().clone();
                    inner.insert(k, random_value(rng));
                }
                other => *other = random_value(rng),
            }
        }
        _ => {
            obj.insert(rng.pick(KEYS).to_string(), random_value(rng));
        }
    }
}

/// A safetensors file as its header and its data.
fn read_safetensors(path: &Path) -> (Value, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header, bytes[8 + n..].to_vec())
}

fn write_safetensors(path: &Path, header: &Value, data: &[u8]) {
    let h = serde_json::to_vec(header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

/// Retags, reshapes or moves one tensor in a header.
fn mutate_header(h: &mut Value, rng: &mut Rng) {
    let obj = h.as_object_mut().unwrap();
    let names: Vec<String> = obj
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    if names.is_empty() {
        return;
    }
    let name = rng.pick(&names).clone();
    let t = obj.get_mut(&name).unwrap();
    match rng.below(4) {
        0 => {
            let dtypes = [
                "I8", "U8", "F32", "BF16", "F16", "F8_E4M3", "F8_E8M0", "I32", "I64", "BOOL", "F4",
            ];
            t["dtype"] = json!(*rng.pick(&dtypes));
        }
        1 => {
            let shape = t["shape"].as_array_mut().unwrap();
            if !shape.is_empty() {
                let i = rng.below(shape.len());
                let d = shape[i].as_u64().unwrap();
                shape[i] = json!(*rng.pick(&[0, 1, d + 1, d * 2, d / 2, 1 << 40]));
            } else {
                shape.push(json!(2));
            }
        }
        2 => {
            let offs = t["data_offsets"].as_array_mut().unwrap();
            let i = rng.below(2);
            let o = offs[i].as_u64().unwrap();
            offs[i] = json!(*rng.pick(&[0, o + 1, o.saturating_sub(1), o * 3, u64::MAX / 2]));
        }
        _ => {
            let s = t["shape"].as_array_mut().unwrap();
            s.reverse();
        }
    }
}

/// Damages one checkpoint directory in one way; says how.
fn mutate(dir: &Path, rng: &mut Rng) -> String {
    let mut shards: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    shards.sort();
    let index = dir.join("model.safetensors.index.json");
    match rng.below(10) {
        0..=4 => {
            let path = dir.join("config.json");
            let mut v: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            for _ in 0..1 + rng.below(2) {
                mutate_config(&mut v, rng);
            }
            std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
            format!("config {v}")
        }
        5 | 6 => {
            let shard = rng.pick(&shards).clone();
            let (mut h, data) = read_safetensors(&shard);
            mutate_header(&mut h, rng);
            write_safetensors(&shard, &h, &data);
            format!("header of {}", shard.display())
        }
        7 => {
            let shard = rng.pick(&shards).clone();
            let len = std::fs::metadata(&shard).unwrap().len();
            let cut = rng.below(len as usize) as u64;
            std::fs::OpenOptions::new()
                .write(true)
                .open(&shard)
                .unwrap()
                .set_len(cut)
                .unwrap();
            format!("{} cut to {cut} bytes", shard.display())
        }
        8 => {
            let shard = rng.pick(&shards).clone();
            let mut bytes = std::fs::read(&shard).unwrap();
            let n = (u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize).min(bytes.len());
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(n + 8);
                bytes[at] = rng.next() as u8;
            }
            std::fs::write(&shard, bytes).unwrap();
            format!("header bytes of {} flipped", shard.display())
        }
        _ if index.is_file() => {
            let mut v: Value =
                serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
            let map = v["weight_map"].as_object_mut().unwrap();
            let key = map.keys().nth(rng.below(map.len())).unwrap().clone();
            match rng.below(3) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    map.insert(key, json!("model-99999-of-99999.safetensors"));
                }
                _ => {
                    map.insert(
                        format!("layers.{}.attn.wq_a.weight", rng.below(100)),
                        json!(map[&key].clone()),
                    );
                }
            }
            std::fs::write(&index, serde_json::to_string(&v).unwrap()).unwrap();
            "index".into()
        }
        _ => {
            std::fs::write(
                dir.join("extra.safetensors"),
                b"\x05\x00\x00\x00\x00\x00\x00\x00{}   ",
            )
            .unwrap();
            "an extra shard".into()
        }
    }
}

/// Runs four greedy tokens through an engine on `model`: it must answer, one way or another.
fn generate(model: Model) -> Result<Vec<u32>, String> {
    let cache = CacheConfig {
        max_seqs: 2,
        block_tokens: 64,
        ..CacheConfig::default()
    };
    let mut config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 2,
            max_num_batched_tokens: 256,
            prefill_chunk: None,
            max_model_len: model.config.max_position_embeddings,
        },
        cache,
        model_name: "fuzz".into(),
        forced_output: None,
        speculative: None,
        prefix_disk: None,
    };
    let fits =
        engine::max_model_len_that_fits(&model.config, &config).map_err(|e| e.to_string())?;
    config.scheduler.max_model_len = config.scheduler.max_model_len.min(fits);
    let vocab = model.config.vocab_size as u32;
    let (handle, join) = engine::start(model, config).map_err(|e| e.to_string())?;
    let prompt = vec![1 % vocab, 2 % vocab, 3 % vocab];
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 4,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let result = match handle.add_request(prompt, params) {
        Err(e) => Err(e.to_string()),
        Ok((_, rx)) => {
            let mut tokens = Vec::new();
            loop {
                match rx.recv_timeout(Duration::from_secs(30)) {
                    Ok(out) => {
                        tokens.extend(out.new_token_ids);
                        if out.finish_reason.is_some() {
                            break Ok(tokens);
                        }
                    }
                    Err(e) => break Err(format!("no output: {e}")),
                }
            }
        }
    };
    handle.shutdown();
    if join.join().is_err() {
        panic!("the engine thread panicked");
    }
    result
}

#[test]
fn loading_fuzzed_checkpoints_ends_in_a_model_or_an_error() {
    let cases = env_or("DEEPINFER_FUZZ_CASES", 300);
    let seed = env_or("DEEPINFER_FUZZ_SEED", 18);
    let bases = [
        golden("tiny-a", "official"),
        golden("tiny-a-dspark", "official"),
        golden("tiny-b", "official"),
        golden("tiny-c", "hf"),
    ];
    let mut rng = Rng::new(seed);
    let (mut loaded, mut refused, mut slowest) = (0, 0, 0.0f64);
    for case in 0..cases {
        let dir = tempfile::tempdir().unwrap();
        let base: &PathBuf = rng.pick(&bases);
        copy_dir(base, dir.path());
        let what = mutate(dir.path(), &mut rng);
        let t = Instant::now();
        let path = dir.path().to_path_buf();
        let outcome = std::panic::catch_unwind(move || match Model::load(&path) {
            Ok(model) => Ok(generate(model)),
            Err(e) => Err(e.to_string()),
        });
        let secs = t.elapsed().as_secs_f64();
        slowest = slowest.max(secs);
        match outcome {
            Err(_) => panic!("case {case} (seed {seed}) panicked: {what}"),
            Ok(Ok(_)) => loaded += 1,
            Ok(Err(e)) => {
                assert!(!e.is_empty(), "case {case}: an empty error");
                refused += 1;
            }
        }
        assert!(
            secs < 30.0,
            "case {case} (seed {seed}) took {secs:.1} s: {what}"
        );
    }
    eprintln!("{cases} cases (seed {seed}): {loaded} loaded and ran, {refused} refused; slowest {slowest:.2} s");
    assert!(loaded > 0 && refused > 0);
}
