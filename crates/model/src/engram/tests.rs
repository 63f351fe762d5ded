//! Bit-exactness against the Python reference (tools/golden/engram.py, fixtures written by
//! tools/make_engram_fixtures.py) and the numbers DeepSeek released for V4.1-Flash.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use super::*;

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}

fn fixture_json() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let text = std::fs::read_to_string(repo_path("tests/fixtures/engram/engram.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    })
}

fn real_map() -> &'static CompressedTokenMap {
    static MAP: OnceLock<CompressedTokenMap> = OnceLock::new();
    MAP.get_or_init(|| {
        CompressedTokenMap::from_tokenizer_file(repo_path("assets/tokenizer/tokenizer.json"))
            .unwrap()
    })
}

fn u64s(value: &Value) -> Vec<u64> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

fn usizes(value: &Value) -> Vec<usize> {
    u64s(value).into_iter().map(|v| v as usize).collect()
}

fn params_of(layout: &Value) -> EngramParams {
    EngramParams {
        layer_ids: usizes(&layout["layer_ids"]),
        engram_vocab_size: layout["engram_vocab_size"].as_u64().unwrap(),
        compressed_vocab_size: layout["compressed_vocab"].as_u64().unwrap() as usize,
        max_ngram: layout["max_ngram"].as_u64().unwrap() as usize,
        n_heads: layout["n_heads"].as_u64().unwrap() as usize,
        pad_token_id: layout["pad_token_id"].as_u64().unwrap() as u32,
    }
}

fn flash_params() -> EngramParams {
    EngramParams {
        layer_ids: vec![1, 14],
        engram_vocab_size: 16_000_000,
        compressed_vocab_size: 99092,
        max_ngram: 4,
        n_heads: 8,
        pad_token_id: 2,
    }
}

#[test]
fn released_flash_multipliers_primes_and_rows() {
    let layout = EngramLayout::with_pad_id(&flash_params(), 2).unwrap();
    let released = [
        [
            76632096046245,
            4839876093313,
            35959672319349,
            73987337458391,
        ],
        [
            67716810739261,
            51510806800915,
            30921347202721,
            82619226485591,
        ],
    ];
    for (layer, expected) in released.iter().enumerate() {
        assert_eq!(layout.multipliers(layer), expected);
    }
    assert_eq!(&layout.primes(0)[..3], &[16000057, 16000079, 16000081]);
    assert_eq!(layout.rows_per_layer(), &[384006168, 384016682]);
    assert_eq!(layout.n_hash_cols(), 24);
}

#[test]
fn layouts_match_python() {
    for (name, expected) in fixture_json()["layouts"].as_object().unwrap() {
        let layout = EngramLayout::with_pad_id(&params_of(expected), 2).unwrap();
        for layer in 0..layout.layer_ids().len() {
            let primes: Vec<u64> = expected["primes"][layer]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(u64s)
                .collect();
            assert_eq!(layout.primes(layer), primes, "{name} primes, layer {layer}");
            assert_eq!(
                layout.offsets(layer),
                u64s(&expected["offsets"][layer]),
                "{name}"
            );
            assert_eq!(
                layout.multipliers(layer),
                u64s(&expected["multipliers"][layer])
            );
        }
        assert_eq!(
            layout.rows_per_layer(),
            u64s(&expected["rows_per_layer"]),
            "{name}"
        );
    }
}

/// NumPy's 64-bit and 32-bit Lemire paths, seed 0 and a bound of 1.
#[test]
fn multipliers_match_numpy_across_bounds() {
    for case in fixture_json()["multiplier_cases"].as_array().unwrap() {
        let vocab = case["compressed_vocab"].as_u64().unwrap() as usize;
        let got = hash_multipliers(
            &usizes(&case["layer_ids"]),
            case["max_ngram"].as_u64().unwrap() as usize,
            vocab,
        )
        .unwrap();
        let expected: Vec<Vec<u64>> = case["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(u64s)
            .collect();
        assert_eq!(got, expected, "compressed vocab {vocab}");
    }
}

/// FNV-1a 64 over the map as little-endian u32, as the fixture script computes it.
fn fnv1a64(ids: &[u32]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for byte in ids.iter().flat_map(|id| id.to_le_bytes()) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[test]
fn token_map_matches_python() {
    let map = real_map();
    let expected = &fixture_json()["tokenizer"];
    assert_eq!(map.size(), 99092);
    assert_eq!(
        map.size() as u64,
        expected["compressed_vocab"].as_u64().unwrap()
    );
    assert_eq!(
        map.vocab_size() as u64,
        expected["vocab_size"].as_u64().unwrap()
    );
    for pair in expected["samples"].as_array().unwrap() {
        let (token, id) = (
            pair[0].as_u64().unwrap() as u32,
            pair[1].as_u64().unwrap() as u32,
        );
        assert_eq!(map.id(token), id, "token {token}");
    }
    let checksum = format!("{:016x}", fnv1a64(map.as_slice()));
    assert_eq!(checksum, expected["map_fnv1a64_le_u32"].as_str().unwrap());
    assert_eq!(map.get(map.vocab_size() as u32), None);
}

/// One fixture layout's streams: ids `[streams][len]` and rows `[streams][layers][len][cols]`.
struct Streams {
    layout: EngramLayout,
    image_token: u32,
    ids: Vec<Vec<u32>>,
    rows: Vec<Vec<Vec<u64>>>,
}

fn tensor_u64s(tensors: &SafeTensors<'_>, name: &str) -> (Vec<usize>, Vec<u64>) {
    let view = tensors.tensor(name).unwrap();
    let data = view.data();
    let values = match view.dtype() {
        Dtype::U8 => data.iter().map(|&b| u64::from(b)).collect(),
        Dtype::U16 => data
            .chunks_exact(2)
            .map(|c| u64::from(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        Dtype::U32 => data
            .chunks_exact(4)
            .map(|c| u64::from(u32::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        other => panic!("{name}: unexpected dtype {other:?}"),
    };
    (view.shape().to_vec(), values)
}

fn load_streams(name: &str) -> Streams {
    let expected = &fixture_json()["layouts"][name];
    let layout = EngramLayout::new(&params_of(expected), real_map()).unwrap();
    let bytes = std::fs::read(repo_path("tests/fixtures/engram/streams.safetensors")).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    let (shape, ids) = tensor_u64s(&tensors, &format!("{name}.ids"));
    let (_, dead) = tensor_u64s(&tensors, &format!("{name}.dead"));
    let (row_shape, rows) = tensor_u64s(&tensors, &format!("{name}.rows"));
    let image_token = expected["image_token_id"].as_u64().unwrap() as u32;
    for (&id, &d) in ids.iter().zip(&dead) {
        assert_eq!(
            d == 1,
            id == u64::from(image_token),
            "dead flags follow the image token"
        );
    }
    let (len, layers, cols) = (shape[1], row_shape[1], row_shape[3]);
    assert_eq!(cols, layout.n_hash_cols());
    let ids = ids
        .chunks(len)
        .map(|s| s.iter().map(|&t| t as u32).collect())
        .collect();
    let rows = rows
        .chunks(layers * len * cols)
        .map(|stream| stream.chunks(len * cols).map(<[u64]>::to_vec).collect())
        .collect();
    Streams {
        layout,
        image_token,
        ids,
        rows,
    }
}

#[test]
fn rows_match_python_whole_streams() {
    for name in ["tiny", "flash"] {
        let streams = load_streams(name);
        let image = streams.image_token;
        let hasher = NgramHasher::new(&streams.layout, real_map(), |t| t == image).unwrap();
        for (s, ids) in streams.ids.iter().enumerate() {
            let chunk = TokenChunk {
                history: &[],
                tokens: ids,
                start: 0,
            };
            for (layer, expected) in streams.rows[s].iter().enumerate() {
                let mut out = vec![0; expected.len()];
                hasher.hash_layer(layer, &chunk, &mut out).unwrap();
                assert!(out == *expected, "{name} stream {s} layer {layer}");
            }
        }
    }
}

/// xorshift64*: chunk sizes without a dependency on a particular RNG crate's API.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Random chunk boundaries, history cut to the minimum or given whole, all layers at once.
#[test]
fn rows_match_python_in_random_chunks() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for name in ["tiny", "flash"] {
        let streams = load_streams(name);
        let image = streams.image_token;
        let layout = &streams.layout;
        let hasher = NgramHasher::new(layout, real_map(), |t| t == image).unwrap();
        let (layers, cols) = (layout.layer_ids().len(), layout.n_hash_cols());
        for (s, ids) in streams.ids.iter().enumerate() {
            let mut out = vec![0u64; 300 * layers * cols];
            let mut start = 0;
            while start < ids.len() {
                let len = (1 + next_random(&mut state) % 300) as usize;
                let end = (start + len).min(ids.len());
                let keep = if next_random(&mut state).is_multiple_of(2) {
                    layout.max_ngram() - 1
                } else {
                    start
                };
                let history = &ids[start.saturating_sub(keep)..start];
                let chunk = TokenChunk {
                    history,
                    tokens: &ids[start..end],
                    start,
                };
                let out = &mut out[..(end - start) * layers * cols];
                hasher.hash_all_layers(&chunk, out).unwrap();
                for (layer, expected) in streams.rows[s].iter().enumerate() {
                    for i in 0..end - start {
                        let got = &out[(i * layers + layer) * cols..][..cols];
                        let want = &expected[(start + i) * cols..][..cols];
                        assert_eq!(
                            got,
                            want,
                            "{name} stream {s} layer {layer} pos {}",
                            start + i
                        );
                    }
                }
                start = end;
            }
        }
    }
}

#[test]
fn missing_tokenizer_file_is_an_error() {
    let err = CompressedTokenMap::from_tokenizer_file("/nonexistent/tokenizer.json").unwrap_err();
    assert!(matches!(err, EngramError::TokenizerLoad { .. }), "{err}");
}

#[test]
fn bad_layout_numbers_are_errors() {
    let bad = |edit: fn(&mut EngramParams), pad: u32| {
        let mut params = flash_params();
        edit(&mut params);
        EngramLayout::with_pad_id(&params, pad).unwrap_err()
    };
    assert!(matches!(
        bad(|p| p.engram_vocab_size = u64::MAX - 2, 2),
        EngramError::Layout(_)
    ));
    assert!(matches!(
        bad(|p| p.layer_ids = vec![usize::MAX], 2),
        EngramError::Layout(_)
    ));
    assert!(matches!(
        bad(|p| p.compressed_vocab_size = 0, 0),
        EngramError::Layout(_)
    ));
    assert!(matches!(
        bad(|p| p.max_ngram = 1, 2),
        EngramError::Layout(_)
    ));
    assert!(matches!(bad(|p| p.n_heads = 0, 2), EngramError::Layout(_)));
    assert!(matches!(bad(|_| {}, 99092), EngramError::Layout(_)));
    let mut params = flash_params();
    params.compressed_vocab_size = 1000;
    let err = EngramLayout::new(&params, real_map()).unwrap_err();
    assert!(matches!(
        err,
        EngramError::CompressedVocabMismatch { built: 99092, .. }
    ));
}

#[test]
fn bad_chunks_are_errors() {
    let layout = EngramLayout::new(&flash_params(), real_map()).unwrap();
    let hasher = NgramHasher::new(&layout, real_map(), |_| false).unwrap();
    let tokens = [5u32, 6, 7];
    let mut out = vec![0u64; 3 * 24];
    let short = TokenChunk {
        history: &[1, 2],
        tokens: &tokens,
        start: 10,
    };
    let err = hasher.hash_layer(0, &short, &mut out).unwrap_err();
    assert!(
        matches!(
            err,
            EngramError::ShortHistory {
                needed: 3,
                got: 2,
                ..
            }
        ),
        "{err}"
    );
    let chunk = TokenChunk {
        history: &[1, 2],
        tokens: &tokens,
        start: 2,
    };
    hasher.hash_layer(1, &chunk, &mut out).unwrap();
    assert!(matches!(
        hasher.hash_layer(2, &chunk, &mut out),
        Err(EngramError::LayerIndex {
            index: 2,
            layers: 2
        })
    ));
    assert!(matches!(
        hasher.hash_layer(0, &chunk, &mut out[1..]),
        Err(EngramError::OutputLen {
            expected: 72,
            got: 71
        })
    ));
    let outside = TokenChunk {
        history: &[1, 2],
        tokens: &[5, 129280, 7],
        start: 2,
    };
    assert!(matches!(
        hasher.hash_layer(0, &outside, &mut out),
        Err(EngramError::TokenOutOfRange { token: 129280, .. })
    ));
    let far = TokenChunk {
        history: &[1, 2, 3],
        tokens: &tokens,
        start: usize::MAX - 1,
    };
    assert!(matches!(
        hasher.hash_layer(0, &far, &mut out),
        Err(EngramError::PositionOverflow { .. })
    ));
}
