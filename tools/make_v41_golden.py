#!/usr/bin/env python3
"""DeepSeek-V4.1 on the CPU, in float32, and goldens from it (no reference runs V4.1 on a CPU:
vLLM's and SGLang's paths need GPU kernels, HF has no V4.1).

Run by hand (outputs are committed under tests/fixtures/golden/<cfg>/):

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy tokenizers
    /tmp/venv/bin/python tools/make_v41_golden.py

It draws tiny random V4.1 checkpoints in DeepSeek's layout (FP8 e4m3 with E8M0 32x32 block
scales for the dense projections, FP4 e2m1 experts with E8M0 1x32 scales, FP8 Engram tables with
E8M0 scales per 32 columns, BF16 norms/embed/head/compressors/indexer keys, F32 mHC/sinks/router
bias), a V4.1 `config.json` (HF shape: `model_type: deepseek_v41` with a `text_config`), and
records what the forward below computes on the stored values: last-position logits, greedy
tokens (full recompute per step), every layer's residual streams for one prompt, and the
smallest selection margins (router, indexer, candidate blocks) of every prompt.

The model itself (configs, weights, forward) is golden/v41.py, whose docstring says which
source (vLLM 0.33.0's `vllm/models/deepseek_v41/`, docs/MODEL.md §8) each part
follows and how image positions are treated.
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden.paths import GOLDEN as OUT, TOKENIZER  # noqa: E402
from golden.storage import raw, write_safetensors  # noqa: E402
from golden.v41 import CONFIGS, V41, build, write_config  # noqa: E402

GREEDY_STEPS = 16
TOPK_LOGITS = 20
TIE_GAP = 1e-4
RETRIES = 6
INTER_POSITIONS = 12


@torch.no_grad()
def run_prompt(m, ids, want_layers):
    """The forward on `ids`, then GREEDY_STEPS greedy tokens by full recompute; the smallest
    selection margins over every pass."""
    logits, layers, gaps = m.forward(ids, want_layers)
    seq, greedy, top_ids, top_vals, greedy_gap = list(ids), [], [], [], math.inf
    last = logits[-1]
    for step in range(GREEDY_STEPS):
        v, i = last.topk(TOPK_LOGITS)
        greedy_gap = min(greedy_gap, float(v[0] - v[1]))
        greedy.append(int(i[0]))
        top_ids.append(i.clone())
        top_vals.append(v.clone())
        seq.append(int(i[0]))
        if step + 1 < GREEDY_STEPS:
            lg, _, g2 = m.forward(seq)
            last = lg[-1]
            gaps.router = min(gaps.router, g2.router)
            gaps.indexer = min(gaps.indexer, g2.indexer)
            gaps.candidate = min(gaps.candidate, g2.candidate)
    return dict(ids=ids, last_logits=logits[-1], argmax=logits.argmax(-1), layers=layers,
                greedy=torch.tensor(greedy), top_ids=torch.stack(top_ids), top_vals=torch.stack(top_vals), gaps=gaps,
                greedy_gap=greedy_gap)


def finite(x):
    return None if math.isinf(x) else x


def draw_prompt(c, g, n):
    """A random prompt of n ids; where the config's image token is inside the vocabulary, a
    few image positions (and a span of two) in every prompt that has room."""
    ids = torch.randint(0, c["vocab_size"], (n,), generator=g).tolist()
    if c.get("image_token_id", c["vocab_size"]) < c["vocab_size"]:
        for at in range(4, n, 23):
            ids[at] = c["image_token_id"]
            if at + 1 < n and at % 2 == 0:
                ids[at + 1] = c["image_token_id"]
    return ids


def write_checkpoint(name, spec, c):
    """official/: model.safetensors, config.json and a link to the committed tokenizer;
    returns the weights for the forward."""
    ck = os.path.join(OUT, name, "official")
    os.makedirs(ck, exist_ok=True)
    w, files = build(name, spec)
    write_safetensors(os.path.join(ck, "model.safetensors"), files)
    write_config(c, ck)
    link = os.path.join(ck, "tokenizer.json")
    if not os.path.lexists(link):
        os.symlink(os.path.relpath(TOKENIZER, ck), link)
    return w


def record_prompt(meta, golden, pi, ids, r):
    """Prompt `pi`'s entry in golden.json and its tensors; returns tie_safe."""
    gp = r["gaps"]
    tie_safe = min(gp.router, gp.indexer, gp.candidate, r["greedy_gap"]) > TIE_GAP
    meta["prompts"].append({
        "index": pi, "len": len(ids), "ids": ids, "greedy": r["greedy"].tolist(),
        "router_gap": finite(gp.router), "indexer_gap": finite(gp.indexer),
        "candidate_gap": finite(gp.candidate), "greedy_gap": r["greedy_gap"], "tie_safe": tie_safe,
    })
    golden[f"p{pi}.last_logits"] = raw(r["last_logits"], "F32")
    golden[f"p{pi}.argmax"] = raw(r["argmax"], "I64")
    golden[f"p{pi}.greedy"] = raw(r["greedy"], "I64")
    golden[f"p{pi}.top_ids"] = raw(r["top_ids"], "I64")
    golden[f"p{pi}.top_logits"] = raw(r["top_vals"], "F32")
    for li, h in enumerate(r["layers"]):
        golden[f"p{pi}.layer{li}"] = raw(h[-INTER_POSITIONS:], "F32")
    return tie_safe


def main():
    only = sys.argv[1:]
    for name, spec in CONFIGS.items():
        if only and name not in only:
            continue
        c = dict(spec["cfg"])
        spec = dict(spec, cfg=c)
        m = V41(c, write_checkpoint(name, spec, c))
        g = torch.Generator().manual_seed(2000 + spec["seed"])
        golden, meta = {}, {"config": name, "greedy_steps": GREEDY_STEPS, "top_logprobs": TOPK_LOGITS,
                            "tie_gap": TIE_GAP, "prompts": []}
        for pi, n in enumerate(spec["prompt_lengths"]):
            for _ in range(RETRIES):
                r = run_prompt(m, draw_prompt(c, g, n), pi == spec["intermediates_prompt"])
                gp = r["gaps"]
                if min(gp.router, gp.indexer, gp.candidate, r["greedy_gap"]) > TIE_GAP:
                    break
            tie_safe = record_prompt(meta, golden, pi, r["ids"], r)
            print(f"{name} prompt {pi} len {n}: router {gp.router:.3g} indexer {gp.indexer:.3g} "
                  f"candidate {gp.candidate:.3g} greedy {r['greedy_gap']:.3g} tie_safe {tie_safe}")
        meta["intermediates_prompt"] = spec["intermediates_prompt"]
        meta["intermediates_positions"] = INTER_POSITIONS
        write_safetensors(os.path.join(OUT, name, "golden.safetensors"), golden)
        with open(os.path.join(OUT, name, "golden.json"), "w") as f:
            json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
