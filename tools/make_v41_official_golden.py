#!/usr/bin/env python3
"""DeepSeek-V4.1 as vLLM 0.33 serves it in FP8 (`--numerics official`), on the CPU, and goldens
from it.

Run by hand after make_v41_golden.py (outputs are committed beside its goldens,
tests/fixtures/golden/<cfg>/official_golden.{safetensors,json}):

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy tokenizers
    /tmp/venv/bin/python tools/make_v41_official_golden.py

DeepSeek's own V4.1 inference code is not published; vLLM's V4.1 path is the arithmetic of the
model as served. golden/v41.py computes the forward, golden/quant_sim.py's V41Numerics rounds
where vLLM quantises (its docstring cites each point), with f32 between those points as the
V4 port (make_official_golden.py) keeps it.

For every prompt of the config's golden.json, and for three more drawn until one is tie-safe
(`prompts_of`): the logits of every prompt position, GREEDY_STEPS
greedy tokens (full recompute per step: every rounding is per row, so a recompute rounds each
row as an incremental decode does) with each step's top logits, the smallest selection margins
(router, indexer, candidate blocks, greedy top-1), the number of FP8 roundings whose input lay
within 1e-6 of a boundary in one pass, and whether the results survive every bf16 and FP8 input
moved by an f32 ulp or two (`order_robust`). `tie_safe` asks for margins and robustness; tests/official_numerics.rs compares
tie-safe prompts tightly. The format is make_official_golden.py's.
"""

import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden.paths import GOLDEN as ROOT  # noqa: E402
from golden.quant_sim import V41Numerics  # noqa: E402
from golden.storage import write_arrays  # noqa: E402
from golden.v41 import CONFIGS, V41, build  # noqa: E402
from make_v41_golden import draw_prompt  # noqa: E402

GREEDY_STEPS = 16
TOPK_LOGITS = 20
TIE_GAP = 1e-4
ROBUST_REL = 1e-3
EXTRA_LENGTHS = [12, 24, 48]
RETRIES = 8


def top2_gap(logits):
    v = logits.topk(2, -1).values
    return float((v[..., 0] - v[..., 1]).min())


def merge(gaps, more):
    gaps.router = min(gaps.router, more.router)
    gaps.indexer = min(gaps.indexer, more.indexer)
    gaps.candidate = min(gaps.candidate, more.candidate)


@torch.no_grad()
def run_prompt(c, w, ids):
    """Prefill logits, greedy tokens, each step's top logits, gaps, greedy margin, fragile counts."""
    nm = V41Numerics(quantise=True)
    m = V41(c, w, nm)
    logits, _, gaps = m.forward(ids)
    greedy_gap = top2_gap(logits)
    seq, greedy, tops_i, tops_v, last = list(ids), [], [], [], logits[-1]
    for step in range(GREEDY_STEPS):
        t = last.topk(TOPK_LOGITS)
        tops_i.append(t.indices), tops_v.append(t.values)
        greedy.append(int(t.indices[0]))
        seq.append(greedy[-1])
        if step + 1 < GREEDY_STEPS:
            lg, _, more = m.forward(seq)
            merge(gaps, more)
            last = lg[-1]
            greedy_gap = min(greedy_gap, top2_gap(last))
    # The fragile roundings of one pass over the prompt and its greedy tokens: each row once.
    once = V41Numerics(quantise=True)
    V41(c, w, once).forward(seq[:-1])
    return logits, greedy, torch.stack(tops_i), torch.stack(tops_v), gaps, greedy_gap, (once.fragile, once.bf16_fragile)


@torch.no_grad()
def order_robust(c, w, ids, greedy, logits, tops_i, tops_v):
    """Whether the results survive another summation order: every bf16 and FP8 input moved by
    up to two f32 ulps (four draws), the prompt and its greedy tokens in one pass give the same
    argmax everywhere and logits within ROBUST_REL of the golden's (make_official_golden.py
    moves the bf16 inputs only)."""
    seq, n = ids + greedy[:-1], len(ids)
    scale = lambda row: max(1.0, float(row.abs().max()))
    for seed in range(4):
        nm = V41Numerics(quantise=True, jitter=torch.Generator().manual_seed(seed))
        got, _, _ = V41(c, w, nm).forward(seq)
        if not torch.equal(got[:n].argmax(-1), logits.argmax(-1)):
            return False
        if float((got[n - 1] - logits[-1]).abs().max()) > ROBUST_REL * scale(logits[-1]):
            return False
        for s in range(len(greedy)):
            row = got[n - 1 + s]
            if int(row.argmax()) != greedy[s]:
                return False
            if float((row[tops_i[s]] - tops_v[s]).abs().max()) > ROBUST_REL * scale(row):
                return False
    return True


def prompts_of(name, c):
    """The plain goldens' prompts, then EXTRA_LENGTHS prompts drawn until one is tie-safe
    (RETRIES at most): the long plain prompts rarely survive the jitter, these make sure some
    that cross the window and many compressed entries do. Yields (index, ids, retry)."""
    plain = json.load(open(os.path.join(ROOT, name, "golden.json")))
    for p in plain["prompts"]:
        yield p["index"], p["ids"], None
    g = torch.Generator().manual_seed(4100 + len(name))
    for k, n in enumerate(EXTRA_LENGTHS):
        for attempt in range(RETRIES):
            yield len(plain["prompts"]) + k, draw_prompt(c, g, n), attempt + 1 < RETRIES


def official_golden(name, spec):
    c = dict(spec["cfg"])
    w, _ = build(name, dict(spec, cfg=c))
    out, prompts = {}, []
    finite = lambda v: min(v, 1e9)  # no selection of that kind: JSON has no infinity
    done = set()
    for i, ids, retry in prompts_of(name, c):
        if i in done:
            continue
        logits, greedy, ti, tv, gaps, greedy_gap, (fragile, bf16_fragile) = run_prompt(c, w, ids)
        out[f"p{i}.argmax"] = (logits.argmax(-1).numpy().astype(np.int64), "I64")
        out[f"p{i}.last_logits"] = (logits[-1].numpy().astype(np.float32), "F32")
        out[f"p{i}.top_ids"] = (ti.numpy().astype(np.int64).reshape(-1), "I64")
        out[f"p{i}.top_logits"] = (tv.numpy().astype(np.float32).reshape(-1), "F32")
        margin = min(gaps.router, gaps.indexer, gaps.candidate, greedy_gap)
        robust = order_robust(c, w, ids, greedy, logits, ti, tv)
        # Unlike V4's, the count of fragile roundings is recorded but not a condition: every
        # prompt here has hundreds (32-blocks and a rounded wo_a input make many more than
        # V4's), and the jitter over every one of them in `order_robust` is the sharper test.
        safe = margin >= TIE_GAP and robust
        if retry and not safe:
            continue
        done.add(i)
        prompts.append(dict(index=i, len=len(ids), ids=ids, greedy=greedy, router_gap=finite(gaps.router),
                            indexer_gap=finite(gaps.indexer), candidate_gap=finite(gaps.candidate),
                            greedy_gap=greedy_gap, fragile_roundings=fragile, bf16_fragile_roundings=bf16_fragile,
                            order_robust=robust, tie_safe=safe))
        print(f"{name} p{i} len {len(ids)}: greedy {greedy[:8]}… margin {margin:.2e} fragile {fragile} "
              f"bf16 {bf16_fragile} robust {robust} tie_safe {safe}", flush=True)
    write_arrays(os.path.join(ROOT, name, "official_golden.safetensors"), out)
    meta = dict(config=name, numerics="official", served_as="vllm-0.33-sm100", greedy_steps=GREEDY_STEPS,
                top_logprobs=TOPK_LOGITS, tie_gap=TIE_GAP, prompts=prompts)
    with open(os.path.join(ROOT, name, "official_golden.json"), "w") as f:
        json.dump(meta, f, indent=1)


def main():
    torch.set_num_threads(os.cpu_count() or 1)
    only = sys.argv[1:]
    for name, spec in CONFIGS.items():
        if not only or name in only:
            official_golden(name, spec)


if __name__ == "__main__":
    main()
