//! Fields that do not change how the forward pass is computed here, but say what the
//! checkpoint is: the architecture, the activation, tied embeddings, the storage formats.
//! Each is read, and a value that describes something this engine does not run is refused,
//! so a config for another model (or a corrupted one) is an error, not a silently different
//! computation. (The formats themselves are read off every tensor's dtype and scale grid.)

use super::fields::{json_kind, Fields};
use super::{invalid, ConfigError};
use serde_json::Value;

/// HF's classes for DeepSeek-V4 and V4.1 (the only ones `architectures` may name; V4.1's
/// checkpoints declare the vision-language class even for text-only use).
const ARCHITECTURES: [&str; 3] = [
    "DeepseekV4ForCausalLM",
    "DeepseekV41ForCausalLM",
    "DeepseekV41LLMForCausalLM",
];

/// The two vocabularies of `dtype`. In a Hugging Face config it (and the older
/// `torch_dtype`) names the torch dtype of the saved tensors, as `save_pretrained` writes it;
/// in DeepSeek's inference config it names the storage scheme.
const HF_DTYPES: [&str; 3] = ["float32", "bfloat16", "float16"];
const OFFICIAL_DTYPES: [&str; 2] = ["fp8", "bf16"];

/// Checks the declarative fields of either flavour (`hf`: Hugging Face's layout of
/// config.json, else DeepSeek's inference `ModelArgs` layout).
pub(super) fn check(f: &Fields, hf: bool) -> Result<(), ConfigError> {
    if let Some(list) = f.str_list("architectures")? {
        if !list.iter().any(|(_, a)| ARCHITECTURES.contains(a)) {
            let names: Vec<&str> = list.iter().map(|(_, a)| *a).collect();
            return Err(invalid(
                "architectures",
                format!("{names:?}"),
                format!("this engine runs {} only", ARCHITECTURES.join(" or ")),
            ));
        }
    }
    one_of(
        f,
        "hidden_act",
        &["silu"],
        "DeepSeek-V4's experts are SwiGLU (silu)",
    )?;
    if f.bool_or("tie_word_embeddings", false)? {
        return Err(invalid(
            "tie_word_embeddings",
            true,
            "DeepSeek-V4 has its own output head; a tied one is another model",
        ));
    }
    one_of(
        f,
        "expert_dtype",
        &["fp4", "fp8", "bf16"],
        "routed experts are stored as FP4, FP8 or BF16",
    )?;
    if hf {
        for key in ["dtype", "torch_dtype"] {
            one_of(
                f,
                key,
                &HF_DTYPES,
                "a Hugging Face config names the torch dtype of the saved tensors",
            )?;
        }
    } else {
        one_of(
            f,
            "dtype",
            &OFFICIAL_DTYPES,
            "DeepSeek's inference config names the storage scheme: FP8 or BF16",
        )?;
    }
    one_of(f, "scale_fmt", &["ue8m0"], "block scales are UE8M0")?;
    if let Some(q) = f.obj("quantization_config")? {
        one_of(
            &q,
            "quant_method",
            &["fp8"],
            "DeepSeek-V4 ships FP8 block quantisation",
        )?;
        one_of(&q, "fmt", &["e4m3"], "FP8 weights are e4m3")?;
        one_of(&q, "scale_fmt", &["ue8m0"], "block scales are UE8M0")?;
        if let Some(b) = q.usize_list("weight_block_size")? {
            if b.len() != 2 || b.contains(&0) {
                return Err(invalid(
                    q.name("weight_block_size"),
                    format!("{b:?}"),
                    "must be two block sides >= 1 ([rows, columns])",
                ));
            }
        }
    }
    Ok(())
}

/// `key`, when present, must be one of `allowed`.
fn one_of(f: &Fields, key: &str, allowed: &[&str], why: &str) -> Result<(), ConfigError> {
    match f.obj.get(key) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if allowed.contains(&s.as_str()) => Ok(()),
        Some(Value::String(s)) => Err(invalid(
            f.name(key),
            format!("{s:?}"),
            format!("{why}; expected {}", allowed.join(" or ")),
        )),
        Some(v) => Err(invalid(f.name(key), json_kind(v), "must be a string")),
    }
}
