#!/usr/bin/env python3
"""Decoder goldens with images for the tiny V4.1 vision checkpoint: the text model of
tests/fixtures/vision/tiny-v41/model (tiny-v41-b's shards, hidden 96, vocab 300, image token
299 inside the vocabulary) run on prompts whose image spans carry the vision tower's span
embeddings.

Run by hand, after make_vision_golden.py (outputs are committed under
tests/fixtures/vision/tiny-v41/):

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy pillow tokenizers
    /tmp/venv/bin/python tools/make_vision_golden.py
    /tmp/venv/bin/python tools/make_vision_decoder_golden.py

The text model is golden/v41.py's forward on tiny-v41-b (redrawn by `build`, checked byte for
byte against the committed model.safetensors); each image span is `span_len` positions that
all hold the image token id, and its input embeddings are replaced by the tower's span
(`V41.forward(..., embeds=(rows, values))`, vLLM's inputs_embeds path: see that docstring for
the vLLM lines). The spans are the tower re-run in float32 from the committed
model/vision.safetensors on vision_golden.safetensors' image{k}.rgb, and must equal
vision_golden.safetensors' image{k}.span exactly. vLLM casts the merged rows to the model
dtype (bf16); here they stay float32, as the tower's goldens do.

Prompts (text ids drawn uniformly from [0, image_token_id), so the image id appears only in
spans; a prompt that is not tie-safe is redrawn from the same generator, up to RETRIES times):
  a: 6 text ids, image 1 (75x61), 5 text ids;
  b: 4 text ids, image 2 (300x220), 3 text ids, image 0 (40x30), 4 text ids;
  c: image 3 (600x30) at position 0, 6 text ids.
Image k is image{k} of vision_golden.{json,safetensors}.

decoder_golden.json: config, base, image_token_id, greedy_steps, tie_gap, and per prompt:
  name, index, len, ids (span positions hold the image id), images [{image: k, offset: first
  span position, len: span_len}], greedy (GREEDY_STEPS tokens, full recompute per step with
  the same span overrides; generated tokens go in as text, embedded from the table), seed,
  attempt (0-based redraw that was kept), the smallest router / indexer / candidate margins
  over the prompt and every greedy recompute, prompt_gap (smallest top-2 logit gap over every
  prompt position), greedy_gap (smallest top-2 gap of the GREEDY_STEPS picks), greedy_text
  (no greedy pick is the image id) and tie_safe (every margin and both gaps above TIE_GAP, as
  make_v41_golden.py's check, with the prompt positions' argmax added because every position's
  logits are recorded).
decoder_golden.safetensors, per prompt p{i}: ids i64 [T], logits f32 [T, vocab] (every prompt
position), greedy i64 [GREEDY_STEPS].
"""

import json
import math
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden import vision as V  # noqa: E402
from golden.paths import GOLDEN, ROOT  # noqa: E402
from golden.read import read_safetensors_raw  # noqa: E402
from golden.storage import dump_json, finite, raw, write_safetensors  # noqa: E402
from golden.v41 import CONFIGS, V41, build  # noqa: E402

NAME = "tiny-v41"
BASE = "tiny-v41-b"
OUT = os.path.join(ROOT, "tests", "fixtures", "vision", NAME)
GREEDY_STEPS = 16
TIE_GAP = 1e-4
RETRIES = 6
SEED = 7300

# ("text", n) or ("image", k): the prompt's segments in order.
PROMPTS = {
    "a": [("text", 6), ("image", 1), ("text", 5)],
    "b": [("text", 4), ("image", 2), ("text", 3), ("image", 0), ("text", 4)],
    "c": [("image", 3), ("text", 6)],
}


def tensor_of(dtype, shape, data):
    if dtype == "F32":
        return torch.from_numpy(np.frombuffer(data, dtype=np.float32).copy()).view(shape)
    if dtype == "BF16":
        t = torch.from_numpy(np.frombuffer(data, dtype=np.int16).copy()).view(torch.bfloat16)
        return t.to(torch.float32).view(shape)
    if dtype == "U8":
        return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy()).view(shape)
    if dtype == "I64":
        return torch.from_numpy(np.frombuffer(data, dtype=np.int64).copy()).view(shape)
    raise ValueError(dtype)


def spans():
    """image k -> (span f32 [span_len, hidden], span_len): the tower re-run on the committed
    weights and sources, checked against the committed spans."""
    model_dir = os.path.join(OUT, "model")
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    vc = V.read_config(cfg, "v41")
    w = {k: tensor_of(*v) for k, v in read_safetensors_raw(os.path.join(model_dir, "vision.safetensors")).items()}
    golden = read_safetensors_raw(os.path.join(OUT, "vision_golden.safetensors"))
    with open(os.path.join(OUT, "vision_golden.json")) as f:
        meta = json.load(f)
    out = {}
    for k, entry in enumerate(meta["images"]):
        rgb = tensor_of(*golden[f"image{k}.rgb"]).numpy()
        r = V.encode(vc, w, rgb)
        stored = golden[f"image{k}.span"]
        assert raw(r["span"], "F32") == (stored[0], stored[1], stored[2]), f"image{k}: span differs from the golden"
        assert r["span"].shape[0] == entry["span_len"]
        out[k] = r["span"]
    return out


def check_checkpoint(spec):
    """The redrawn weights are the committed tiny-v41-b shard, byte for byte."""
    w, files = build(BASE, spec)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        write_safetensors(path, files)
        with open(path, "rb") as f:
            mine = f.read()
    with open(os.path.join(OUT, "model", "model.safetensors"), "rb") as f:
        assert f.read() == mine, "tiny-v41-b's redrawn weights differ from the linked shard"
    return w


def layout(segments, text, image_id, span):
    """ids, the images' {image, offset, len} and the override (rows, values)."""
    ids, images, rows, values, ti = [], [], [], [], 0
    for kind, v in segments:
        if kind == "text":
            ids += text[ti:ti + v]
            ti += v
        else:
            n = span[v].shape[0]
            images.append({"image": v, "offset": len(ids), "len": n})
            rows += range(len(ids), len(ids) + n)
            values.append(span[v])
            ids += [image_id] * n
    assert ti == len(text)
    return ids, images, (torch.tensor(rows, dtype=torch.int64), torch.cat(values))


def top2(v):
    t = v.topk(2).values
    return float(t[0] - t[1])


@torch.no_grad()
def run_prompt(m, ids, embeds):
    logits, _, gaps = m.forward(ids, embeds=embeds)
    prompt_gap = min(top2(row) for row in logits)
    seq, greedy, greedy_gap, last = list(ids), [], math.inf, logits[-1]
    for step in range(GREEDY_STEPS):
        greedy_gap = min(greedy_gap, top2(last))
        greedy.append(int(last.argmax()))
        seq.append(greedy[-1])
        if step + 1 < GREEDY_STEPS:
            lg, _, g2 = m.forward(seq, embeds=embeds)
            last = lg[-1]
            gaps.router = min(gaps.router, g2.router)
            gaps.indexer = min(gaps.indexer, g2.indexer)
            gaps.candidate = min(gaps.candidate, g2.candidate)
    return dict(logits=logits, greedy=greedy, gaps=gaps, prompt_gap=prompt_gap, greedy_gap=greedy_gap)


def main():
    spec = CONFIGS[BASE]
    c = dict(spec["cfg"])
    spec = dict(spec, cfg=c)
    m = V41(c, check_checkpoint(spec))
    image_id = c["image_token_id"]
    assert image_id == c["vocab_size"] - 1
    span = spans()

    # The override with the table's own rows is the plain forward.
    ids = [5, image_id, 17, image_id]
    rows = torch.tensor([1, 3])
    a = m.forward(ids)[0]
    b = m.forward(ids, embeds=(rows, m.w["embed"][torch.tensor(ids)][rows]))[0]
    assert torch.equal(a, b)

    golden, meta = {}, {"config": NAME, "base": BASE, "image_token_id": image_id,
                        "greedy_steps": GREEDY_STEPS, "tie_gap": TIE_GAP, "prompts": []}
    for pi, (name, segments) in enumerate(PROMPTS.items()):
        seed = SEED + pi
        g = torch.Generator().manual_seed(seed)
        n_text = sum(v for kind, v in segments if kind == "text")
        for attempt in range(RETRIES):
            text = torch.randint(0, image_id, (n_text,), generator=g).tolist()
            ids, images, embeds = layout(segments, text, image_id, span)
            r = run_prompt(m, ids, embeds)
            gp = r["gaps"]
            greedy_text = image_id not in r["greedy"]
            tie_safe = min(gp.router, gp.indexer, gp.candidate, r["prompt_gap"], r["greedy_gap"]) > TIE_GAP
            if tie_safe and greedy_text:
                break
        meta["prompts"].append({
            "name": name, "index": pi, "len": len(ids), "ids": ids, "images": images,
            "greedy": r["greedy"], "seed": seed, "attempt": attempt,
            "router_gap": finite(gp.router), "indexer_gap": finite(gp.indexer),
            "candidate_gap": finite(gp.candidate), "prompt_gap": r["prompt_gap"],
            "greedy_gap": r["greedy_gap"], "greedy_text": greedy_text, "tie_safe": tie_safe,
        })
        golden[f"p{pi}.ids"] = raw(torch.tensor(ids), "I64")
        golden[f"p{pi}.logits"] = raw(r["logits"], "F32")
        golden[f"p{pi}.greedy"] = raw(torch.tensor(r["greedy"]), "I64")
        print(f"{NAME} prompt {name} len {len(ids)} images "
              f"{[(im['image'], im['offset'], im['len']) for im in images]} attempt {attempt}: "
              f"router {gp.router:.3g} indexer {gp.indexer:.3g} candidate {gp.candidate:.3g} "
              f"prompt {r['prompt_gap']:.3g} greedy {r['greedy_gap']:.3g} "
              f"greedy_text {greedy_text} tie_safe {tie_safe}")
    write_safetensors(os.path.join(OUT, "decoder_golden.safetensors"), golden)
    dump_json(meta, os.path.join(OUT, "decoder_golden.json"))


if __name__ == "__main__":
    main()
