//! The configs DeepSeek published, as files (`published/`), each accepted whole with the
//! shape the spec's table gives, and the `dtype` vocabularies of every layout a user may
//! bring (a transformers `save_pretrained` round trip writes `dtype` as a torch dtype).
//!
//! | file | what | where it was read |
//! |---|---|---|
//! | v4-flash-0731.json | `deepseek-ai/DeepSeek-V4-Flash-0731` config.json @ 7872f01b | byte-exact: sha256 6c8f3d2d…a023, 1888 bytes, as pinned by a public source-identity check that embeds it |
//! | v4-flash-inference.json | `deepseek-ai/DeepSeek-V4-Flash` inference/config.json | byte-exact: its git blob hash 692cf97a… is the hub cache's blob name of the upstream file (a public fork's copy, the fork's one added line removed) |
//! | v4-flash.json, v4-pro.json | V4-Flash and V4-Pro config.json, first upload (no `expert_dtype`) | transcribed from a printed model report, not hash-checked |
//! | v41-flash.json | V4.1-Flash: `text_config` verbatim as quoted by a public test, wrapped in the outer keys its published excerpts show (`dtype`, `quantization_config`, `vision_config`) | reconstructed around a verbatim `text_config` |

use super::*;

/// `(file, its text, hidden_size, main layers, routed experts, V4.1, DSpark stages)`.
const PUBLISHED: [(&str, &str, usize, usize, usize, bool, usize); 5] = [
    (
        "v4-flash-0731.json",
        include_str!("published/v4-flash-0731.json"),
        4096,
        43,
        256,
        false,
        3,
    ),
    (
        "v4-flash-inference.json",
        include_str!("published/v4-flash-inference.json"),
        4096,
        43,
        256,
        false,
        0,
    ),
    (
        "v4-flash.json",
        include_str!("published/v4-flash.json"),
        4096,
        43,
        256,
        false,
        0,
    ),
    (
        "v4-pro.json",
        include_str!("published/v4-pro.json"),
        7168,
        61,
        384,
        false,
        0,
    ),
    (
        "v41-flash.json",
        include_str!("published/v41-flash.json"),
        5120,
        40,
        384,
        true,
        3,
    ),
];

#[test]
fn every_published_config_is_accepted_as_published() {
    for (file, text, hidden, layers, experts, v41, stages) in PUBLISHED {
        let c = ModelConfig::from_json_str(text).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.n_routed_experts),
            (hidden, layers, experts),
            "{file}"
        );
        assert_eq!(c.v41.is_some(), v41, "{file}");
        assert_eq!(c.dspark.as_ref().map_or(0, |d| d.stages), stages, "{file}");
    }
}

/// What each layout's `dtype` (and the older `torch_dtype`) may say: a Hugging Face config
/// names the saved tensors' torch dtype (transformers 5.x writes `dtype`, 4.x `torch_dtype`),
/// DeepSeek's inference config its storage scheme; FP8 V4-Flash-Base declares FP8 experts.
#[test]
fn dtype_is_read_in_each_layouts_vocabulary() {
    let hf = include_str!("published/v4-flash.json");
    let official = include_str!("published/v4-flash-inference.json");
    let accepted = [
        (hf, "torch_dtype", "bfloat16"),
        (hf, "torch_dtype", "float32"),
        (hf, "dtype", "float32"),
        (hf, "dtype", "bfloat16"),
        (hf, "dtype", "float16"),
        (hf, "expert_dtype", "fp8"),
        (official, "dtype", "fp8"),
        (official, "dtype", "bf16"),
    ];
    for (base, key, value) in accepted {
        let text = edit(base, &[(key, Some(Value::from(value)))]);
        assert!(ModelConfig::from_json_str(&text).is_ok(), "{key} = {value}");
    }
    let refused = [
        (hf, "dtype", "fp8"),
        (hf, "torch_dtype", "int8"),
        (official, "dtype", "float32"),
    ];
    for (base, key, value) in refused {
        let text = edit(base, &[(key, Some(Value::from(value)))]);
        let err = ModelConfig::from_json_str(&text).unwrap_err().to_string();
        assert!(
            err.contains(key) && err.contains(value),
            "{key} = {value}: {err}"
        );
    }
}
