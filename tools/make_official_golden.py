#!/usr/bin/env python3
"""DeepSeek-V4 as DeepSeek's own inference code computes it, on the CPU, and goldens from it.

Run by hand (outputs are committed next to the HF goldens, tests/fixtures/golden/<cfg>/):

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy
    /tmp/venv/bin/python tools/make_official_golden.py

HF transformers has none of the official quantisation, so this is our own reference for
`--numerics official`: golden/official_v4.py, a port, written for this project, of
DeepSeek-V4's `inference/model.py` (DeepSeek-V4-Flash/Pro release) with what the kernels of
its `inference/kernel.py` compute simulated by golden/quant_sim.py (docs/MODEL.md §2 and §5
describe both). Those modules' docstrings say which source each part
follows and where the port deliberately differs (float32 activations between the
quantisation points, except the bf16 inputs of the BF16/F32-weight products: compressor
wkv/wgate, indexer weights_proj, router gate, wo_a, head; short quantisation blocks at
ragged row ends).

For the MTP block (model.py's MTPBlock, its FP8 e_proj/h_proj included) it writes
official_mtp_golden.safetensors/json on the HF MTP golden's prompt, in the same format as
tools/make_mtp_golden.py (the target's streams, the block over the prompt, a chain of drafts).

For every prompt of the config's HF golden.json it writes official_golden.safetensors/json:
the logits of every prompt position (teacher-forced prefill), then GREEDY_STEPS greedy
tokens decoded one at a time (model.py's decode path) with each step's top logits, and the
smallest selection margins (router top-k, indexer top-k, greedy top-1) seen, the number
of FP8/FP4 roundings whose input lay within 1e-6 of a rounding boundary, and whether the
results survive every bf16 input moved by an f32 ulp or two (`order_robust`), so the test
compares tightly only where a different summation order cannot flip a choice or a rounding
(`tie_safe`). On tiny-a and tiny-b no prompt survives that (one bf16 rounding gone the other
way tips an FP8 rounding downstream); on tiny-c every one does.
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden.official_v4 import Model, Mtp, check_plain, head  # noqa: E402
from golden.paths import GOLDEN as ROOT  # noqa: E402
from golden.quant_sim import FRAGILE_MAX, Numerics  # noqa: E402
from golden.read import read_shards, tensor  # noqa: E402
from golden.storage import write_arrays  # noqa: E402

GREEDY_STEPS = 16
TOPK_LOGITS = 20
TIE_GAP = 1e-4
ROBUST_REL = 1e-3
MTP_ROBUST_REL = 1e-2  # tests/mtp.rs's bound on the block's logits
CONFIGS = ["tiny-a", "tiny-b", "tiny-c"]
MTP_CHAIN = 4


def top2_gap(logits):
    v = logits.topk(2, -1).values
    return float((v[..., 0] - v[..., 1]).min())


def run_prompt(d, ids):
    """Teacher-forced prefill of `ids`, then GREEDY_STEPS - 1 decode steps one token a call
    (model.py's decode path), on a fresh quantising model; returns the prefill logits, the
    greedy tokens, each step's top logits, the selection gaps, the greedy margin and the
    numbers of fragile FP8/FP4 and bf16 roundings."""
    nm = Numerics(quantise=True)
    model = Model(d, len(ids) + GREEDY_STEPS + 1, nm)
    with torch.no_grad():
        logits = model(torch.tensor(ids), 0)
        greedy_gap = top2_gap(logits)
        tok = int(logits[-1].argmax())
        greedy, tops_i, tops_v = [tok], [], []
        t = logits[-1].topk(TOPK_LOGITS)
        tops_i.append(t.indices), tops_v.append(t.values)
        pos = len(ids)
        for _ in range(GREEDY_STEPS - 1):
            step = model(torch.tensor([tok]), pos)[0]
            greedy_gap = min(greedy_gap, top2_gap(step))
            t = step.topk(TOPK_LOGITS)
            tops_i.append(t.indices), tops_v.append(t.values)
            tok = int(step.argmax())
            greedy.append(tok)
            pos += 1
    fragile = (nm.fragile, nm.bf16_fragile)
    return logits, greedy, torch.stack(tops_i), torch.stack(tops_v), model.gaps, greedy_gap, fragile


def mtp_robust(d, ids, nxt, logits):
    """Whether the MTP block's logits over the prompt survive another summation order (see
    order_robust): within MTP_ROBUST_REL (relative to the largest) of `logits` with every
    bf16 input moved by up to two f32 ulps, four draws."""
    t = len(ids)
    for seed in range(4):
        nm = Numerics(quantise=True, jitter=torch.Generator().manual_seed(seed))
        model = Model(d, t + 1, nm)
        with torch.no_grad():
            _, got = Mtp(model, t + 1)(model.streams(torch.tensor(ids), 0), 0, torch.tensor(ids[1:] + [nxt]))
        if float((got - logits).abs().max()) > MTP_ROBUST_REL * float(logits.abs().max()):
            return False
    return True


def mtp_golden(cfg, d):
    """The MTP block on the HF MTP golden's prompt (see make_mtp_golden.py's FORMAT, whose
    names this keeps): the target's streams, the block over the whole prompt, a chain."""
    nm = Numerics(quantise=True)
    ids = [int(v) for v in tensor(read_shards(os.path.join(ROOT, cfg), only="mtp_golden.safetensors"), "prompt_ids")]
    t = len(ids)
    model = Model(d, t + MTP_CHAIN + 1, nm)
    mtp = Mtp(model, t + MTP_CHAIN + 1)
    margin = lambda l: float(l.topk(2).values[0] - l.topk(2).values[1])
    with torch.no_grad():
        h = model.streams(torch.tensor(ids), 0)
        target = head(h[-1:], model.hc_head, model.norm, model.head, model.c, nm)[0]
        nxt = int(target.argmax())
        out, logits = mtp(h, 0, torch.tensor(ids[1:] + [nxt]))
        chain, chain_logits, margins = [int(logits[-1].argmax())], [], [margin(logits[-1])]
        hh = out[-1:]
        for i in range(MTP_CHAIN - 1):
            hh, l = mtp(hh, t + i, torch.tensor([chain[-1]]))
            chain_logits.append(l[0])
            margins.append(margin(l[0]))
            chain.append(int(l[0].argmax()))
    arg_margins = [margin(l) for l in logits]
    tensors = {
        "prompt_ids": (np.array(ids, dtype=np.int64), "I64"),
        "next_token": (np.array([nxt], dtype=np.int64), "I64"),
        "hidden": (h.numpy().astype(np.float32), "F32"),
        "mtp_logits": (logits.numpy().astype(np.float32), "F32"),
        "mtp_hidden": (out.numpy().astype(np.float32), "F32"),
        "chain_tokens": (np.array(chain, dtype=np.int64), "I64"),
        "chain_logits": (torch.stack(chain_logits).numpy().astype(np.float32), "F32"),
    }
    write_arrays(os.path.join(ROOT, cfg, "official_mtp_golden.safetensors"), tensors)
    gaps = model.gaps
    safe = (min(gaps["router"], gaps["indexer"]) >= TIE_GAP and nm.fragile <= FRAGILE_MAX
            and margin(target) >= TIE_GAP and mtp_robust(d, ids, nxt, logits))
    meta = dict(config=cfg, numerics="official", prompt_len=t, next_token=nxt, chain_tokens=chain,
                chain_margins=margins, mtp_argmax=[int(l.argmax()) for l in logits],
                mtp_argmax_margins=arg_margins, router_gap=min(gaps["router"], 1e9),
                indexer_gap=min(gaps["indexer"], 1e9), fragile_roundings=nm.fragile, tie_safe=safe)
    with open(os.path.join(ROOT, cfg, "official_mtp_golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{cfg} mtp: prompt {t}, chain {chain}, fragile {nm.fragile}, tie_safe {safe}", flush=True)


def order_robust(d, ids, greedy, logits, tops_i, tops_v):
    """Whether the prompt's results survive another summation order: with every bf16 input
    moved by up to two f32 ulps first (four draws), as our kernels' sums may leave it, the
    prompt and its greedy tokens prefilled in one call give the same argmax at every prompt
    position and step, and logits within ROBUST_REL (relative to the row's largest) of the
    golden's. One bf16 rounding gone the other way can tip an FP8 rounding downstream and
    move the logits by a few percent."""
    seq, n = ids + greedy[:-1], len(ids)
    scale = lambda row: max(1.0, float(row.abs().max()))
    for seed in range(4):
        nm = Numerics(quantise=True, jitter=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            got = Model(d, len(seq) + 1, nm)(torch.tensor(seq), 0)
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


def official_golden(cfg, d):
    """official_golden.safetensors/json: every prompt of the config's HF golden.json."""
    hf = json.load(open(os.path.join(ROOT, cfg, "golden.json")))
    out, prompts = {}, []
    for p in hf["prompts"]:
        ids = p["ids"]
        logits, greedy, ti, tv, gaps, greedy_gap, (fragile, bf16_fragile) = run_prompt(d, ids)
        i = p["index"]
        out[f"p{i}.argmax"] = (logits.argmax(-1).numpy().astype(np.int64), "I64")
        out[f"p{i}.last_logits"] = (logits[-1].numpy().astype(np.float32), "F32")
        out[f"p{i}.top_ids"] = (ti.numpy().astype(np.int64).reshape(-1), "I64")
        out[f"p{i}.top_logits"] = (tv.numpy().astype(np.float32).reshape(-1), "F32")
        safe = min(gaps["router"], gaps["indexer"], greedy_gap) >= TIE_GAP and fragile <= FRAGILE_MAX
        finite = lambda v: min(v, 1e9)  # no selection of that kind: JSON has no infinity
        robust = order_robust(d, ids, greedy, logits, ti, tv)
        safe = safe and robust
        prompts.append(dict(index=i, len=len(ids), ids=ids, greedy=greedy, router_gap=finite(gaps["router"]),
                            indexer_gap=finite(gaps["indexer"]), greedy_gap=greedy_gap, fragile_roundings=fragile,
                            bf16_fragile_roundings=bf16_fragile, order_robust=robust, tie_safe=safe))
        print(f"{cfg} p{i} len {len(ids)}: greedy {greedy[:8]}… gaps router {gaps['router']:.2e} "
              f"indexer {gaps['indexer']:.2e} greedy {greedy_gap:.2e} fragile {fragile} bf16 {bf16_fragile} "
              f"robust {robust} tie_safe {safe}", flush=True)
    write_arrays(os.path.join(ROOT, cfg, "official_golden.safetensors"), out)
    meta = dict(config=cfg, numerics="official", greedy_steps=GREEDY_STEPS, top_logprobs=TOPK_LOGITS,
                tie_gap=TIE_GAP, prompts=prompts)
    with open(os.path.join(ROOT, cfg, "official_golden.json"), "w") as f:
        json.dump(meta, f, indent=1)


def main():
    torch.set_num_threads(os.cpu_count() or 1)
    args = sys.argv[1:]
    # `--plain` skips every quantisation point: the port must then reproduce HF's float32
    # goldens (golden.safetensors), which checks the port itself before its goldens are trusted.
    plain = "--plain" in args
    if plain:
        args.remove("--plain")
    for cfg in args or CONFIGS:
        d = os.path.join(ROOT, cfg, "official")
        if plain:
            check_plain(cfg, d, json.load(open(os.path.join(ROOT, cfg, "golden.json"))))
            continue
        official_golden(cfg, d)
        mtp_golden(cfg, d)


if __name__ == "__main__":
    main()
