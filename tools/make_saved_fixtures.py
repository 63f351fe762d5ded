#!/usr/bin/env python3
"""Checkpoints as HF transformers 5.23 writes them back, and goldens computed on them.

Run by hand (outputs are committed under tests/fixtures/golden/tiny-c/):

    python3 -m venv /tmp/venv
    /tmp/venv/bin/pip install torch transformers==5.23.0 numpy safetensors accelerate
    /tmp/venv/bin/python tools/make_saved_fixtures.py

transformers calls exercised (nothing else of transformers is used to write the files):
  * `DeepseekV4ForCausalLM.from_pretrained(src, dtype=...)`: the `deepseek_v4` conversion
    mapping (DeepSeek names -> HF names, per-expert w1/w3/w2 -> stacked gate_up_proj/down_proj)
    and the fine-grained FP8 quantizer (`.scale` -> `weight_scale_inv`, FP8/FP4 kept or
    dequantised).
  * `model.save_pretrained(out)` with its defaults (`save_original_format=True`): the
    conversion mapping run backwards (`revert_weight_conversion`), config.json,
    generation_config.json, one `model.safetensors` (no index: far below the 50GB shard size).
  * `DeepseekV4ForCausalLM.from_pretrained(out, dtype=torch.float32)` on the CPU, then
    golden/hf_v4.py's `run_prompt` on it (make_golden.py's reference run): the goldens.

Which checkpoint, and why tiny-c: it is the only tiny config whose official/ layout transformers
can load as committed and dequantise exactly. tiny-a's official config has an HCA ratio of 8,
which the legacy `compress_ratios` map (0/4/128 only) rejects (KeyError), and tiny-a has FP8
weights with more than 128 rows or columns and a short last block (hidden 192), which HF's
`Fp8Dequantize` splits evenly (block = rows // scale_rows) instead of 128 + rest, so HF loads
other values than the ones its goldens ran on (logits off by ~0.3 even with the ratio patched).
tiny-b's official config is in DeepSeek's ModelArgs layout, which transformers cannot read. tiny-c lacks hash layers: run on a patched copy of tiny-a,
`tid2eid` comes back as `model.layers.N.ffn.gate.tid2eid` (I64) from the official layout and as
`model.layers.N.mlp.gate.tid2eid` (I32, as stored) from the HF one.

What it writes (tests/fixtures/golden/tiny-c/):
  saved-f32/      official/ loaded with dtype=float32 and saved: the issue's case. Names are
                  DeepSeek's under `model.` except `head.weight` (e.g. `model.embed_tokens.weight`,
                  `model.hc_head.hc_fn`, `model.layers.N.attn.wq_a.weight`/`.scale`,
                  `model.layers.N.attn.norm.weight` for kv_norm, `model.layers.N.ffn.experts.E.w1.
                  weight`); FP8 e4m3 + E8M0 `.scale` and FP4 (I8) experts + E8M0 scales kept as
                  stored; BF16 tensors upcast to F32; config.json in HF's own keys (`dtype`,
                  `layer_types`, `compress_rates`, `mlp_layer_types`, `rope_parameters`, a
                  `quantization_config` with `expert_dtype` and `dequantize: false`, no
                  `compress_ratios`/`torch_dtype`); `num_nextn_predict_layers` stays 1 although the
                  MTP tensors (mtp.safetensors) are dropped.
  saved-bf16/     the same with dtype=bfloat16: F32 stays F32 for norms, mHC, sinks, ape and the
                  gate bias (HF keeps those modules in fp32), BF16 elsewhere, FP8/FP4 as stored.
  saved-hf-bf16/  hf/ loaded with dtype=bfloat16 and saved. HF names, except that every
                  `kv_norm` comes back as `norm` (`self_attn.norm.weight`,
                  `self_attn.compressor.norm.weight`, `self_attn.compressor.indexer.norm.weight`):
                  the mapping's `.norm.` -> `.kv_norm.` rename is reverted. Dequantised (no
                  scales, no quantization_config), stacked experts, BF16 except what HF keeps F32.
  <name>_golden.json / <name>_golden.safetensors beside each directory (not inside: the Rust
                  loader reads every *.safetensors of a directory without an index): the same
                  format as make_golden.py's golden.json/golden.safetensors, on the same prompts.

Two workarounds, both because this runs without a GPU:
  * On a CPU transformers 5.23 dequantises an FP8 checkpoint while loading, and then
    `save_pretrained` of an official-layout model fails ("Undefined Operation encountered!":
    the dequantising expert converters cannot be reverted). The names the issue reports come from
    the GPU path, where FP8/FP4 weights stay quantised. `gpu_code_path()` makes the FP8 quantizer
    take that path (it only asks `torch.cuda.is_available()` and the compute capability); loading
    and saving compute nothing, so no CUDA call is made. The goldens are computed after it is
    undone, on the ordinary CPU path.
  * hf/config.json as committed has no `quantization_config`, so transformers ignores the
    `weight_scale_inv` tensors ("UNEXPECTED") and loads FP8 codes unscaled (logits off by ~3).
    The HF round trip therefore starts from a temporary copy of hf/ given the quantization_config
    a real checkpoint carries.
"""

import contextlib
import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import DeepseekV4ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# golden.hf_v4 registers the "softmax" router activation tiny-c uses, and has the reference loop.
from golden.hf_v4 import GREEDY_STEPS, INTER_POSITIONS, TIE_GAP, TOPK_LOGITS, record_prompt, run_prompt  # noqa: E402
from golden.paths import GOLDEN  # noqa: E402
from golden.storage import write_safetensors  # noqa: E402

CONFIG = "tiny-c"
DIR = os.path.join(GOLDEN, CONFIG)
QUANTIZATION_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                       "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
# (output directory, source layout, dtype for from_pretrained, whether to take the GPU path)
FIXTURES = [
    ("saved-f32", "official", torch.float32, True),
    ("saved-bf16", "official", torch.bfloat16, True),
    ("saved-hf-bf16", "hf", torch.bfloat16, False),
]


@contextlib.contextmanager
def gpu_code_path():
    """What the FP8 quantizer asks to decide between keeping FP8 (GPU) and dequantising (CPU)."""
    saved = torch.cuda.is_available, torch.cuda.get_device_capability
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    try:
        yield
    finally:
        torch.cuda.is_available, torch.cuda.get_device_capability = saved


def source_dir(layout, tmp):
    if layout == "official":
        return os.path.join(DIR, "official")
    src = os.path.join(tmp, "hf")
    os.makedirs(src)
    shutil.copy(os.path.join(DIR, "hf", "model.safetensors"), src)
    with open(os.path.join(DIR, "hf", "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = QUANTIZATION_CONFIG
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return src


def round_trip(name, layout, dtype, on_gpu_path, tmp):
    out = os.path.join(DIR, name)
    shutil.rmtree(out, ignore_errors=True)
    with gpu_code_path() if on_gpu_path else contextlib.nullcontext():
        kw = {"device_map": "cpu"} if on_gpu_path else {}
        model = DeepseekV4ForCausalLM.from_pretrained(source_dir(layout, tmp), dtype=dtype, **kw)
        model.save_pretrained(out)
    os.chmod(os.path.join(out, "model.safetensors"), 0o644)  # written 0600 (via a temporary file)
    return out


def record(saved, name):
    """make_golden.py's recording (golden/hf_v4.py) on the saved checkpoint, on the original golden's prompts."""
    model = DeepseekV4ForCausalLM.from_pretrained(saved, dtype=torch.float32, attn_implementation="eager")
    # On the CPU path tensors stored as BF16 stay BF16 in memory; float32 holds them exactly.
    model = model.float().eval()
    with open(os.path.join(DIR, "golden.json")) as f:
        orig = json.load(f)
    orig_st = load_file(os.path.join(DIR, "golden.safetensors"))
    golden = {}
    meta = {"config": CONFIG, "checkpoint": name, "greedy_steps": GREEDY_STEPS, "top_logprobs": TOPK_LOGITS,
            "tie_gap": TIE_GAP, "prompts": []}
    for p in orig["prompts"]:
        pi = p["index"]
        r = run_prompt(model, p["ids"], pi == orig["intermediates_prompt"])
        tie_safe = min(r["router_gap"], r["indexer_gap"]) > TIE_GAP and r["greedy_gap"] > TIE_GAP
        diff = (r["last_logits"] - orig_st[f"p{pi}.last_logits"]).abs().max().item()
        # against tests/fixtures/golden/tiny-c/golden.* (the checkpoint before the round trip)
        same = r["greedy"].tolist() == p["greedy"]
        record_prompt(meta, golden, pi, p["ids"], r, tie_safe,
                      last_logits_max_abs_diff_vs_original=diff, greedy_equals_original=same)
        print(f"{name} prompt {pi} len {len(p['ids'])}: vs original {diff:.3g}, "
              f"greedy same {same}, tie_safe {tie_safe}")
    meta["intermediates_prompt"] = orig["intermediates_prompt"]
    meta["intermediates_positions"] = INTER_POSITIONS
    write_safetensors(os.path.join(DIR, f"{name}_golden.safetensors"), golden)
    with open(os.path.join(DIR, f"{name}_golden.json"), "w") as f:
        json.dump(meta, f, indent=1)


def main():
    only = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        for name, layout, dtype, on_gpu_path in FIXTURES:
            if only and name not in only:
                continue
            saved = round_trip(name, layout, dtype, on_gpu_path, tmp)
            record(saved, name)


if __name__ == "__main__":
    main()
