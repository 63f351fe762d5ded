#!/usr/bin/env python3
"""HF transformers' speed on a deepinfer checkpoint (DeepSeek's official layout), for the
side-by-side comparison in tools/bench_peers.sh. Prints one JSON object.

    python tools/hf_bench.py MODEL_DIR [--dtype bfloat16|float32] [--prompts 128,512] [--gen 64]

The official tensors are read as stored and converted to HF's names and layout (FP4 experts
dequantised, exactly, and stacked as gate_up_proj / down_proj), then loaded into
`DeepseekV4ForCausalLM`. Prefill: one forward over a prompt of each length. Decode: greedy
`generate` of --gen tokens after a 1-token prompt, minus that prompt's forward.
"""

import argparse
import json
import os
import sys
import time

import torch
from safetensors import safe_open
from transformers import AutoConfig, DeepseekV4ForCausalLM
from transformers.initialization import no_init_weights

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden.hf_v4  # noqa: E402,F401  (registers the "softmax" router activation tiny-c uses)
from golden.layout import official_name_and_format  # noqa: E402
from golden.read import dequant_fp4, dequant_fp8  # noqa: E402


def reader(model_dir):
    """official name -> tensor, across the shards of an index."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    where = {}
    handles = [safe_open(os.path.join(model_dir, f), framework="pt") for f in files]
    for h in handles:
        for k in h.keys():
            where[k] = h
    return lambda name: where[name].get_tensor(name), where


def load_hf_state(model, get, where, dtype):
    """Copies every tensor into the model's own (uninitialised) storage, one at a time."""
    sd = model.state_dict()
    for hf_name, param in sd.items():
        oname, kind = official_name_and_format(hf_name)
        if kind in ("experts_gate_up", "experts_down"):
            n_exp = param.shape[0]
            mats = []
            for e in range(n_exp):
                def fp4(w):
                    stem = f"{oname}.{e}.{w}"
                    return dequant_fp4(get(stem + ".weight"), get(stem + ".scale"))
                if kind == "experts_gate_up":
                    mats.append(torch.cat([fp4("w1"), fp4("w3")], dim=0))
                else:
                    mats.append(fp4("w2"))
            t = torch.stack(mats)
        elif oname.endswith(".weight") and oname[: -len(".weight")] + ".scale" in where:
            t = dequant_fp8(get(oname), get(oname[: -len(".weight")] + ".scale"))
        else:
            t = get(oname)
        with torch.no_grad():
            param.copy_(t.to(param.dtype))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--prompts", default="128,512")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    config = AutoConfig.from_pretrained(args.model)
    config._attn_implementation = "eager"
    torch.set_default_dtype(dtype)
    with no_init_weights():
        model = DeepseekV4ForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    get, where = reader(args.model)
    t0 = time.time()
    load_hf_state(model, get, where, dtype)
    model = model.eval()
    load_s = time.time() - t0
    vocab = config.vocab_size
    out = {"dtype": args.dtype, "threads": args.threads, "load_s": load_s, "prefill": [], "decode": {}}
    with torch.no_grad():
        for n in [int(p) for p in args.prompts.split(",") if p]:
            ids = (torch.arange(n) * 7919 + 13) % vocab
            model(ids[None])  # warm-up
            t = time.time()
            model(ids[None])
            s = time.time() - t
            out["prefill"].append({"tokens": n, "seconds": s, "tokens_per_s": n / s})
        one = torch.tensor([[13]])
        t = time.time()
        model(one)
        first = time.time() - t
        t = time.time()
        gen = model.generate(one, max_new_tokens=args.gen, min_new_tokens=args.gen, do_sample=False)
        total = time.time() - t
        steps = gen.shape[1] - 1
        out["decode"] = {"tokens": steps, "seconds": total - first, "tokens_per_s": (steps - 1) / max(total - first, 1e-9)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
