#!/usr/bin/env python3
"""Decoder goldens with images for DeepSeek-V4-Flash-Vision-Exp (the V4 family with a vision
tower, flat `vision_*` config keys), on a tiny checkpoint written here:
tests/fixtures/vision/tiny-v4-exp/. The V4.1 analogue is make_vision_decoder_golden.py; this
writes the same golden format.

Run by hand (outputs are committed), after make_vision_golden.py (whose tiny-v4 tower and
vision goldens this reuses):

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy pillow
    /tmp/venv/bin/python tools/make_vision_v4_decoder_golden.py

What each part follows:
  - The decoder: golden/v4_vision_decoder.py (`VisionModel`): golden/official_v4.py's port of
    DeepSeek's V4 inference/model.py with quantisation off (float32 between the stored
    values, as make_dspark_v4_golden.py runs it), plus what vLLM 0.33's V4 vision variant
    changes: the span's input embeddings, `gate.bias_vl` routing of the sentinel ids on every
    MoE layer (hash layers included), the prefill sliding window widened inside image ranges.
    That module's docstring cites the vLLM lines for each.
  - The tower and the span layout: golden/vision.py (make_vision_golden.py's goldens). The
    tower is tiny-v4's (model/vision.safetensors is a link to it: the decoder's hidden size,
    64, is tiny-c's, so the same tower fits); it is re-run in float32 on tiny-v4's
    vision_golden image{k}.rgb and must give its image{k}.span exactly. The block at prompt
    offset o is vision.v4_block(h, w, o): 3 - o % 4 IMAGE_PAD slots, then the pad-free block
    (vLLM's mm_preprocess.py 195-225 and 468-529). Ids: B + role (roles IMAGE_START 0,
    IMAGE_PAD 1, IMAGE 2, IMAGE_NEW_LINE 3, IMAGE_END 4; mm_preprocess.py 52-68, 455-458),
    B = the config's `image_sentinel_base_id` (this fixture's test seam; vLLM's constant
    129257 when absent).
  - Scheduling: vLLM prefills an image's whole placeholder in one step (the V4 vision config
    is an mm-prefix LM, transformers_utils/model_arch_config_convertor.py 583-590, which makes
    platforms/cuda.py 334-345 force disable_chunked_mm_input; v1/core/sched/scheduler.py
    2096-2113 then stops a chunk before an item it cannot cover whole; engine/arg_utils.py
    3200-3218 raises max_num_batched_tokens to fit one item). Here the whole prompt is one
    prefill, then greedy decoding one token per call on model.py's state buffers (decode
    rows keep the plain window, sparse_swa.py 686-688).

The checkpoint (model/): config.json is a V4 config in the keys the tiny V4 fixtures ship
(tests/fixtures/golden/tiny-*/official/config.json) plus tiny-v4's `vision_*` keys and
`image_sentinel_base_id`; model.safetensors is drawn here in DeepSeek's layout and storage
formats (golden/storage.py's Store, FP8 128x128 blocks, FP4 experts, as tools/make_golden.py
rounds them), with `ffn.gate.bias_vl` (F32) on every layer and, as vLLM says vision
checkpoints ship (nvidia/model.py 301-310), a `gate.bias` on the hash layers too (unused).
No MTP block (num_nextn_predict_layers 0). Shape: 4 layers, compress_ratios [0, 4, 8, 4]
(SWA, CSA with the indexer, HCA, CSA), layers 0-1 hash-routed, sqrtsoftplus scoring (the one
vLLM's CUDA routing runs hash tables and bias_vl with), 6 experts pick 2, window 4,
vocab 128, B = 120 (ids 120-124; 125-127 are ordinary ids above the block, and every prompt
holds one), vision_max_n_token 32 (= max_image_tokens).

Prompts (text ids drawn uniformly from [2, vocab) minus the sentinel block, the second one
set to B + 5 + the prompt's index, an ordinary id just above the block; a prompt that is not
tie-safe is redrawn from the same generator, up to RETRIES times):
  a: 5 text ids, image 1 (75x61) at 5 (pad 2), 6 text ids;
  b: 6 text ids, image 2 (300x220) at 6 (pad 1), 3 text ids, image 0 (40x30) at 36 (pad 3),
     5 text ids;
  c: 3 text ids, image 6 (400x127) at 3 (no pad), 4 text ids, image 3 (600x30) at 25
     (pad 2), 4 text ids.
Image k is image{k} of tiny-v4's vision_golden.{json,safetensors}.

decoder_golden.json: as make_vision_decoder_golden.py's (config, base, image_token_id: here
B + IMAGE, the id of the aligner slots; greedy_steps, tie_gap, prompts with name, index, len,
ids, images [{image, offset, len}], greedy, seed, attempt, router_gap, indexer_gap,
candidate_gap (null: V4 has none), prompt_gap, greedy_gap, greedy_text (no greedy pick is a
sentinel id), tie_safe), plus: image_sentinel_base_id, window, max_image_tokens, tie_relative
(the margins compared with tie_gap are relative: a selection's margin over the largest |value|
of its row, for the routers, the indexer, every prompt position's logits and the greedy
picks), per prompt router_rel / indexer_rel / prompt_rel / greedy_rel, per image `pad` (the
leading compressor pad; offset and len include it) and `range` ([s, e], inclusive: the slots
whose prefill window widens, IMAGE_START to IMAGE_END), and bias_vl_picks (per kind of MoE
layer: image rows routed, and how many of them picked other experts than text routing would).
decoder_golden.safetensors, per prompt p{i}: ids i64 [T], logits f32 [T, vocab] (every prompt
position), greedy i64 [GREEDY_STEPS].

Checks run before anything is written: the vision model equals the plain port bit for bit on
text (no sentinel ids), the widened windows equal a second statement of the rule, each
prompt's greedy decode equals a full prefill of prompt + picks, the widening and bias_vl
change the results.
"""

import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden import vision as V  # noqa: E402
from golden.official_v4 import Model  # noqa: E402
from golden.paths import ROOT  # noqa: E402
from golden.quant_sim import Numerics  # noqa: E402
from golden.read import read_safetensors_raw, tensor  # noqa: E402
from golden.storage import Store, dump_json, finite, raw, write_safetensors  # noqa: E402
from golden.v4_vision_decoder import IMAGE, N_ROLES, VisionModel, image_range, prefill_window  # noqa: E402

NAME = "tiny-v4-exp"
TOWER = "tiny-v4"  # the tower, its config keys and its vision goldens
VISION = os.path.join(ROOT, "tests", "fixtures", "vision")
OUT = os.path.join(VISION, NAME)
MODEL = os.path.join(OUT, "model")
GREEDY_STEPS = 16
TIE_GAP = 1e-3  # relative (see the docstring)
RETRIES = 200
SEED = 7400
WEIGHT_SEED = 4041
SENTINEL_BASE = 120
FP8_BLOCK = 128
PLAIN = Numerics(quantise=False)

CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "vocab_size": 128,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "head_dim": 64,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 32,
    "o_groups": 2,
    "o_lora_rank": 32,
    "sliding_window": 4,
    "compress_ratios": [0, 4, 8, 4],
    "compress_rope_theta": 160000.0,
    "rope_theta": 10000.0,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 4.0, "original_max_position_embeddings": 128,
                     "partial_rotary_factor": 0.25, "rope_theta": 10000.0, "rope_type": "yarn", "type": "yarn"},
    "index_n_heads": 16,
    "index_head_dim": 32,
    "index_topk": 3,
    "n_routed_experts": 6,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 32,
    "num_hash_layers": 2,
    "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 0.7,
    "hc_mult": 2,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "num_nextn_predict_layers": 0,
    "torch_dtype": "bfloat16",
    "expert_dtype": "fp4",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [FP8_BLOCK, FP8_BLOCK]},
    "image_sentinel_base_id": SENTINEL_BASE,
}

# ("text", n) or ("image", k): the prompt's segments in order.
PROMPTS = {
    "a": [("text", 5), ("image", 1), ("text", 6)],
    "b": [("text", 6), ("image", 2), ("text", 3), ("image", 0), ("text", 5)],
    "c": [("text", 3), ("image", 6), ("text", 4), ("image", 3), ("text", 4)],
}

# ---------------------------------------------------------------- the checkpoint


def draw_checkpoint(c):
    """The decoder's tensors in DeepSeek's names and formats, in drawing order (which fixes
    the bytes); distributions as golden/hf_v4.py's build_model draws the tiny V4 models,
    bias_vl N(0, 0.5), wide enough to move image rows' picks off the text bias's, and the
    sentinel ids' head rows a tenth of the others (published checkpoints never emit these
    reserved ids; drawn like the rest, greedy decoding of this random model falls into loops
    through them)."""
    s = Store(WEIGHT_SEED, FP8_BLOCK)
    D, V_, hc = c["hidden_size"], c["vocab_size"], c["hc_mult"]
    H, hd, ql = c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
    g, ol, inter = c["o_groups"], c["o_lora_rank"], c["moe_intermediate_size"]
    E, k = c["n_routed_experts"], c["num_experts_per_tok"]
    ih, ihd = c["index_n_heads"], c["index_head_dim"]
    mix = (2 + hc) * hc

    def norm(name, n):
        s.bf16(name, s.draw((n,), 0.1, 1.0))

    def hc_params(p, rows, scales):
        s.f32(f"{p}_fn", s.draw((rows, hc * D), 0.05))
        s.f32(f"{p}_base", s.draw((rows,), 0.3))
        s.f32(f"{p}_scale", torch.rand(scales, generator=s.g) + 0.5)

    def compressor(p, ratio, dim):
        coff = 2 if ratio == 4 else 1
        s.bf16(f"{p}.wkv.weight", s.draw((coff * dim, D), 0.05))
        s.bf16(f"{p}.wgate.weight", s.draw((coff * dim, D), 0.05))
        s.f32(f"{p}.ape", s.draw((ratio, coff * dim), 0.5))
        norm(f"{p}.norm.weight", dim)

    s.bf16("embed.weight", s.draw((V_, D), 1.0))
    norm("norm.weight", D)
    head = s.draw((V_, D), 0.1)
    B = c["image_sentinel_base_id"]
    head[B:B + N_ROLES] *= 0.1  # reserved ids: the head never favours them
    s.bf16("head.weight", head)
    hc_params("hc_head", hc, 1)
    for l, ratio in enumerate(c["compress_ratios"]):
        p = f"layers.{l}"
        hc_params(f"{p}.hc_attn", mix, 3)
        hc_params(f"{p}.hc_ffn", mix, 3)
        norm(f"{p}.attn_norm.weight", D)
        norm(f"{p}.ffn_norm.weight", D)
        a = f"{p}.attn"
        s.fp8(f"{a}.wq_a.weight", s.draw((ql, D), 0.05))
        norm(f"{a}.q_norm.weight", ql)
        s.fp8(f"{a}.wq_b.weight", s.draw((H * hd, ql), 0.05))
        s.fp8(f"{a}.wkv.weight", s.draw((hd, D), 0.05))
        norm(f"{a}.kv_norm.weight", hd)
        s.fp8(f"{a}.wo_a.weight", s.draw((g * ol, H * hd // g), 0.05))
        s.fp8(f"{a}.wo_b.weight", s.draw((D, g * ol), 0.05))
        s.f32(f"{a}.attn_sink", s.draw((H,), 1.0))
        if ratio:
            compressor(f"{a}.compressor", ratio, hd)
        if ratio == 4:
            s.fp8(f"{a}.indexer.wq_b.weight", s.draw((ih * ihd, ql), 0.1))
            s.bf16(f"{a}.indexer.weights_proj.weight", s.draw((ih, D), 0.3))
            compressor(f"{a}.indexer.compressor", 4, ihd)
        f = f"{p}.ffn"
        s.bf16(f"{f}.gate.weight", s.draw((E, D), 0.15))
        s.f32(f"{f}.gate.bias", s.draw((E,), 0.1))  # hash layers: shipped, unused
        if l < c["num_hash_layers"]:
            rows = [torch.randperm(E, generator=s.g)[:k] for _ in range(V_)]
            s.files[f"{f}.gate.tid2eid"] = raw(torch.stack(rows), "I64")
        s.f32(f"{f}.gate.bias_vl", s.draw((E,), 0.5))
        for e in range(E):
            for w, shape in (("w1", (inter, D)), ("w3", (inter, D)), ("w2", (D, inter))):
                s.fp4(f"{f}.experts.{e}.{w}.weight", s.draw(shape, 0.06))
        for w, shape in (("w1", (inter, D)), ("w3", (inter, D)), ("w2", (D, inter))):
            s.fp8(f"{f}.shared_experts.{w}.weight", s.draw(shape, 0.06))
    return s.files


def write_checkpoint():
    """config.json, model.safetensors and a copy of tiny-v4's tower; returns the config."""
    with open(os.path.join(VISION, TOWER, "model", "config.json")) as f:
        tower_cfg = json.load(f)
    cfg = dict(CONFIG)
    cfg.update({k: v for k, v in tower_cfg.items() if k.startswith("vision_")})
    assert tower_cfg["hidden_size"] == cfg["hidden_size"], "the tower's aligner writes the decoder's width"
    B, vocab = cfg["image_sentinel_base_id"], cfg["vocab_size"]
    assert 2 <= B and B + N_ROLES <= vocab
    os.makedirs(MODEL, exist_ok=True)
    with open(os.path.join(MODEL, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    write_safetensors(os.path.join(MODEL, "model.safetensors"), draw_checkpoint(cfg))
    shutil.copyfile(os.path.join(VISION, TOWER, "model", "vision.safetensors"),
                    os.path.join(MODEL, "vision.safetensors"))
    return cfg


# ---------------------------------------------------------------- the tower


def images(cfg):
    """image k -> (plan, aligner rows): the tower re-run in float32 on tiny-v4's sources,
    its pad-free spans checked against tiny-v4's goldens byte for byte."""
    vc = V.read_config(cfg, "v4")
    rawv = read_safetensors_raw(os.path.join(MODEL, "vision.safetensors"))
    w = {k: tensor(rawv, k) for k in rawv}
    golden = read_safetensors_raw(os.path.join(VISION, TOWER, "vision_golden.safetensors"))
    with open(os.path.join(VISION, TOWER, "vision_golden.json")) as f:
        meta = json.load(f)
    out = {}
    for k, entry in enumerate(meta["images"]):
        dt, shape, data = golden[f"image{k}.rgb"]
        assert dt == "U8"
        rgb = np.frombuffer(data, dtype=np.uint8).reshape(shape)
        r = V.encode(vc, w, rgb)
        stored = golden[f"image{k}.span"]
        assert raw(r["span"], "F32") == (stored[0], stored[1], stored[2]), f"image{k}: span differs from the golden"
        assert r["span"].shape[0] == entry["span_len"]
        out[k] = (r["plan"], r["aligner"], w)
    return out


def layout(segments, text, B, imgs):
    """ids, the images' entries, the IMAGE rows (positions, values), the image ranges, and
    the expected embeddings of every span slot (golden/vision.py's span_v4 at the offset)."""
    ids, entries, rows, values, ranges, spans, ti = [], [], [], [], [], [], 0
    for kind, v in segments:
        if kind == "text":
            ids += text[ti:ti + v]
            ti += v
            continue
        pl, aligner, w = imgs[v]
        o = len(ids)
        types, perm = V.v4_block(pl["n_llm_h"], pl["n_llm_w"], o)
        emb, t2, p2 = V.span_v4(w, aligner, pl["n_llm_h"], pl["n_llm_w"], start_pos=o)
        assert torch.equal(t2, types) and torch.equal(p2, perm)
        n, pad = len(types), V.COMPRESS_PAD_TO - 1 - o % V.COMPRESS_PAD_TO
        assert n == pl["span_len"] + pad and int(types[pad]) == V.V4_START and int(types[-1]) == V.V4_END
        rng = image_range(o, n)
        assert rng == (o + pad, o + n - 1)
        entries.append({"image": v, "offset": o, "len": n, "pad": pad, "range": list(rng)})
        slots = torch.nonzero(types == IMAGE).flatten()
        rows += (o + slots).tolist()
        values.append(aligner[perm])
        ranges.append(rng)
        spans.append((o, emb))
        ids += (B + types).tolist()
    assert ti == len(text)
    return ids, entries, (torch.tensor(rows), torch.cat(values)), ranges, spans


# ---------------------------------------------------------------- runs


def top2(row):
    v = row.topk(2).values
    gap = float(v[0] - v[1])
    return gap, gap / max(float(row.abs().max()), 1e-30)


def new_model(cfg, n, vision=True):
    return VisionModel(MODEL, n, PLAIN, cfg["image_sentinel_base_id"], cfg["vision_max_n_token"], vision=vision)


@torch.no_grad()
def run_prompt(cfg, ids, image_rows, ranges):
    """Prefill of the whole prompt, then GREEDY_STEPS - 1 decode steps; every prompt row's
    logits, the picks, each pick's row, the margins and the bias_vl pick counts."""
    m = new_model(cfg, len(ids) + GREEDY_STEPS + 1)
    logits = m(torch.tensor(ids), 0, image_rows, ranges)
    prompt = [top2(r) for r in logits]
    last, steps, greedy = logits[-1], [logits[-1]], []
    for step in range(GREEDY_STEPS):
        greedy.append(int(last.argmax()))
        if step + 1 < GREEDY_STEPS:
            last = m(torch.tensor([greedy[-1]]), len(ids) + step)[0]
            steps.append(last)
    pick = [top2(r) for r in steps]
    return dict(logits=logits, greedy=greedy, steps=torch.stack(steps), gaps=dict(m.gaps), picks=m.picks,
                prompt_gap=min(p[0] for p in prompt), prompt_rel=min(p[1] for p in prompt),
                greedy_gap=min(p[0] for p in pick), greedy_rel=min(p[1] for p in pick))


def rel_diff(a, b):
    return float(((a - b).abs().amax(-1) / b.abs().amax(-1)).max())


@torch.no_grad()
def check_text_parity(cfg):
    """No sentinel id in the prompt: the vision model is the plain port, bit for bit, in
    prefill and decode (and so is the vision model with everything off)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, cfg["image_sentinel_base_id"], (23,), generator=g)
    outs = []
    for m in (Model(MODEL, 30, PLAIN), new_model(cfg, 30), new_model(cfg, 30, vision=False)):
        a = m(ids, 0)
        b = m(torch.tensor([int(a[-1].argmax())]), len(ids))
        outs.append((a, b))
    for a, b in outs[1:]:
        assert torch.equal(a, outs[0][0]) and torch.equal(b, outs[0][1]), "the vision model differs on text"


def check_windows(ranges, n, W, M):
    """The widened windows against a second statement of the rule: a query at t inside
    [s, e] sees the union of its causal window [t-W+1, t] and the image positions within
    M-1 to its left and M to its right: [max(s, t-M+1), min(e, t+M)]."""
    for t in range(n):
        lo, hi = max(t - W + 1, 0), t
        for s, e in ranges:
            if s <= t <= e:
                lo, hi = min(lo, max(s, t - M + 1)), max(hi, min(e, t + M))
        assert prefill_window(t, ranges, W, M) == (lo, hi), (t, ranges)


@torch.no_grad()
def check_decode(cfg, ids, image_rows, ranges, r):
    """The greedy steps again as one prefill of prompt + picks (the widened ranges are the
    prompt's; the picks are text): same picks, logits within float32 order effects."""
    seq = ids + r["greedy"][:-1]
    full = new_model(cfg, len(seq) + 1)(torch.tensor(seq), 0, image_rows, ranges)
    d = rel_diff(full[len(ids) - 1:], r["steps"])
    assert d < 1e-5 and full[len(ids) - 1:].argmax(-1).tolist() == r["greedy"], d
    return d


@torch.no_grad()
def widening_effect(cfg, ids, image_rows, ranges, logits):
    """How far the prompt's logits move with the window left plain."""
    plain = new_model(cfg, len(ids) + 1)(torch.tensor(ids), 0, image_rows, ())
    return rel_diff(plain, logits)


@torch.no_grad()
def check_embeddings(cfg, ids, image_rows, spans):
    """The composed input rows (id-keyed table, aligner rows at the IMAGE slots) equal
    golden/vision.py's span embeddings at every span slot, leading pad included."""
    x = new_model(cfg, len(ids) + 1).inputs(torch.tensor(ids), image_rows)
    for o, emb in spans:
        assert torch.equal(x[o:o + len(emb)], emb), f"span at {o}"


# ---------------------------------------------------------------- output


def main():
    torch.set_num_threads(1)
    cfg = write_checkpoint()
    B, vocab, W, M = cfg["image_sentinel_base_id"], cfg["vocab_size"], cfg["sliding_window"], cfg["vision_max_n_token"]
    imgs = images(cfg)
    check_text_parity(cfg)
    allowed = torch.tensor([i for i in range(2, vocab) if not B <= i < B + N_ROLES])

    golden = {}
    meta = {"config": NAME, "base": None, "image_token_id": B + IMAGE, "image_sentinel_base_id": B,
            "window": W, "max_image_tokens": M, "greedy_steps": GREEDY_STEPS, "tie_gap": TIE_GAP,
            "tie_relative": True, "prompts": []}
    picks = {"hash": [0, 0], "scored": [0, 0]}
    for pi, (name, segments) in enumerate(PROMPTS.items()):
        seed = SEED + pi
        g = torch.Generator().manual_seed(seed)
        n_text = sum(v for kind, v in segments if kind == "text")
        for attempt in range(RETRIES):
            text = allowed[torch.randint(0, len(allowed), (n_text,), generator=g)].tolist()
            text[1] = B + N_ROLES + pi  # an id just above the sentinel block: text, not image
            ids, entries, image_rows, ranges, spans = layout(segments, text, B, imgs)
            r = run_prompt(cfg, ids, image_rows, ranges)
            gp = r["gaps"]
            greedy_text = not any(B <= t < B + N_ROLES for t in r["greedy"])
            tie_safe = min(gp["router_rel"], gp["indexer_rel"], r["prompt_rel"], r["greedy_rel"]) > TIE_GAP
            if tie_safe and greedy_text:
                break
        check_windows(ranges, len(ids), W, M)
        check_embeddings(cfg, ids, image_rows, spans)
        dd = check_decode(cfg, ids, image_rows, ranges, r)
        widen = widening_effect(cfg, ids, image_rows, ranges, r["logits"])
        assert widen > 1e-2, "the widened window changes nothing"
        for kind in picks:
            picks[kind][0] += r["picks"][kind][0]
            picks[kind][1] += r["picks"][kind][1]
        meta["prompts"].append({
            "name": name, "index": pi, "len": len(ids), "ids": ids, "images": entries,
            "greedy": r["greedy"], "seed": seed, "attempt": attempt,
            "router_gap": finite(gp["router"]), "indexer_gap": finite(gp["indexer"]), "candidate_gap": None,
            "prompt_gap": r["prompt_gap"], "greedy_gap": r["greedy_gap"],
            "router_rel": finite(gp["router_rel"]), "indexer_rel": finite(gp["indexer_rel"]),
            "prompt_rel": r["prompt_rel"], "greedy_rel": r["greedy_rel"],
            "greedy_text": greedy_text, "tie_safe": tie_safe,
        })
        golden[f"p{pi}.ids"] = raw(torch.tensor(ids), "I64")
        golden[f"p{pi}.logits"] = raw(r["logits"], "F32")
        golden[f"p{pi}.greedy"] = raw(torch.tensor(r["greedy"]), "I64")
        print(f"{NAME} prompt {name} len {len(ids)} images "
              f"{[(e['image'], e['offset'], e['len'], e['pad']) for e in entries]} attempt {attempt}: "
              f"rel margins router {gp['router_rel']:.3g} indexer {gp['indexer_rel']:.3g} "
              f"prompt {r['prompt_rel']:.3g} greedy {r['greedy_rel']:.3g} (abs greedy {r['greedy_gap']:.3g}) "
              f"greedy_text {greedy_text} tie_safe {tie_safe}; decode vs prefill {dd:.1e}, "
              f"plain window moves logits {widen:.2g}", flush=True)
    assert all(changed > 0 for _, changed in picks.values()), picks
    meta["bias_vl_picks"] = picks
    print(f"image rows routed / picking other experts than text routing: {picks}")
    write_safetensors(os.path.join(OUT, "decoder_golden.safetensors"), golden)
    dump_json(meta, os.path.join(OUT, "decoder_golden.json"))


if __name__ == "__main__":
    main()
