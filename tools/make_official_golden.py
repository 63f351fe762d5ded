#!/usr/bin/env python3
"""DeepSeek-V4 as DeepSeek's own inference code computes it, on the CPU, and goldens from it.

Run by hand (outputs are committed next to the HF goldens, tests/fixtures/golden/<cfg>/):

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy
    /tmp/venv/bin/python tools/make_official_golden.py

HF transformers has none of the official quantisation, so this is our own reference for
`--numerics official`. It is a port, written for this project, of DeepSeek-V4's
`inference/model.py` (DeepSeek-V4-Flash/Pro release) and of what the kernels of its
`inference/kernel.py` compute (spec §2 and §5 of docs/model-spec.md describe both). Which
source each part follows:

  - `Model`, `Block`, `Attention`, `Compressor`, `Indexer`, `Gate`, `Expert`, `MoE`, the head:
    model.py, statement for statement (prefill at start_pos 0, then one token per call with
    the same state buffers: the window ring, `kv_state`/`score_state`, the entry caches),
    batch size 1, without the tensor-parallel collectives.
  - `linear`: model.py's `linear`: FP8/FP4-weight projections quantise their input with
    `act_quant(x, 128, ue8m0)` and multiply with `fp8_gemm`/`fp4_gemm`; BF16/F32 weights use
    a plain product. Which projections are FP8/FP4 follows model.py's `Linear` dtypes for an
    FP8 checkpoint, whatever the file at hand stores: wq_a, wq_b, wkv, wo_b, the indexer's
    wq_b, every expert and the shared expert (`wo_a` is dequantised and used in a plain
    einsum there; compressor, router, indexer weights_proj and head are BF16/F32).
  - `act_quant_sim`, `fp4_sim`: kernel.py's `act_quant`/`fp4_act_quant` as the spec states them
    (amax floors 1e-4 and 6·2^-126, power-of-two scale rounded up, clamp, round to nearest
    even onto e4m3 / e2m1, written back as `q·s`).
  - `hadamard`: `fast_hadamard_transform(x, scale=n^-0.5)` (Sylvester order).
  - `hc_split_sinkhorn`, `sparse_attn`: kernel.py's as spec §3.3 and §3.4 state them.

Deliberate differences from DeepSeek's code, also stated in deepinfer's `numerics.rs`:
  - Activations between the quantisation points are float32 here; DeepSeek's code holds them
    in bf16 because it runs on bf16 hardware, and the bf16 roundings are not part of the
    model (vLLM and SGLang place them differently). So every `.to(dtype)` of model.py is a
    no-op here, and the indexer scores (bf16 there) are float32. One bf16 rounding is kept:
    the KV vectors' RoPE dims, because the KV cache (model.py's `kv_cache` buffers, vLLM's
    584-byte record) stores them as bf16.
  - Quantisation blocks may be short at the end of a row (the tiny checkpoints' widths are
    not multiples of 128/64); such a block is quantised with its own amax. model.py asserts
    whole blocks; V4's real shapes always have them, so real models are unaffected.

For the MTP block (model.py's MTPBlock, its FP8 e_proj/h_proj included) it writes
official_mtp_golden.safetensors/json on the HF MTP golden's prompt, in the same format as
tools/make_mtp_golden.py (the target's streams, the block over the prompt, a chain of drafts).

For every prompt of the config's HF golden.json it writes official_golden.safetensors/json:
the logits of every prompt position (teacher-forced prefill), then GREEDY_STEPS greedy
tokens decoded one at a time (model.py's decode path) with each step's top logits, and the
smallest selection margins (router top-k, indexer top-k, greedy top-1) seen and the number
of FP8/FP4 roundings whose input lay within 1e-6 of a rounding boundary, so the test compares
tightly only where a different summation order cannot flip a choice or a rounding.
"""

import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "golden")
GREEDY_STEPS = 16
TOPK_LOGITS = 20
TIE_GAP = 1e-4
CONFIGS = ["tiny-a", "tiny-b", "tiny-c"]
ACT_BLOCK, KV_BLOCK, FP4_BLOCK = 128, 64, 32
# `--plain` skips every quantisation point: the port must then reproduce HF's float32 goldens
# (golden.safetensors), which checks the port itself before its goldens are trusted.
QUANTISE = True
# Roundings onto FP8/FP4 whose input lies within FRAGILE_REL (relative) of a rounding
# boundary: a different summation order upstream (ours is not torch's) can send such a value
# the other way, one FP8/FP4 step, and a long prompt has many. Counted per prompt; a prompt
# with more than FRAGILE_MAX is compared loosely, like one with a near-tied selection
# (measured: prompts with up to ~50 such roundings, up to 200 tokens here, agree with
# deepinfer to 3e-4; the 600- and 700-token ones, with 100+, drift by up to 3.4e-2 once a
# flipped rounding tips a router or indexer choice).
FRAGILE_REL = 1e-6
FRAGILE_MAX = 64
FRAGILE = [0]


def count_fragile(y, q, step):
    """`y` rounded to `q` on a grid of spacing `step` at y: distance to the nearest boundary."""
    d = ((y - q).abs() - step / 2).abs()
    FRAGILE[0] += int((d < FRAGILE_REL * y.abs()).sum())

# ---------------------------------------------------------------- checkpoint reading


def e4m3_table():
    out = np.zeros(256, dtype=np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 7
        if e == 15 and m == 7:
            out[b] = np.nan
        elif e == 0:
            out[b] = s * m / 8 * 2.0 ** -6
        else:
            out[b] = s * (1 + m / 8) * 2.0 ** (e - 7)
    return out


E4M3 = e4m3_table()
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def read_shards(d, only=None):
    raw = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors") or (only and f != only):
            continue
        blob = open(os.path.join(d, f), "rb").read()
        n = struct.unpack("<Q", blob[:8])[0]
        header = json.loads(blob[8:8 + n])
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            a, b = meta["data_offsets"]
            raw[name] = (meta["dtype"], meta["shape"], blob[8 + n + a:8 + n + b])
    return raw


def tensor(raw, name):
    """A stored tensor as float32 (weights dequantised with their block scales)."""
    dt, shape, data = raw[name]
    if dt == "F32":
        return torch.from_numpy(np.frombuffer(data, np.float32).reshape(shape).copy())
    if dt == "BF16":
        u = np.frombuffer(data, np.uint16).astype(np.uint32) << 16
        return torch.from_numpy(u.view(np.float32).reshape(shape).copy())
    if dt in ("I64", "I32"):
        return torch.from_numpy(np.frombuffer(data, {"I64": np.int64, "I32": np.int32}[dt]).reshape(shape).astype(np.int64))
    if dt == "F8_E4M3":
        w = E4M3[np.frombuffer(data, np.uint8)].reshape(shape)
        s = scales(raw, name)
        rows, cols = shape
        full = np.repeat(np.repeat(s, 128, 0), 128, 1)[:rows, :cols]
        return torch.from_numpy((w * full).astype(np.float32))
    if dt == "I8":  # FP4 e2m1, two per byte, low nibble first, one scale per 32 inputs
        b = np.frombuffer(data, np.uint8).reshape(shape)
        codes = np.stack([b & 0xF, b >> 4], axis=-1).reshape(shape[0], shape[1] * 2)
        s = np.repeat(scales(raw, name), 32, 1)
        return torch.from_numpy((E2M1[codes] * s).astype(np.float32))
    raise ValueError(f"{name}: dtype {dt}")


def scales(raw, weight_name):
    dt, shape, data = raw[weight_name.removesuffix(".weight") + ".scale"]
    assert dt == "F8_E8M0", dt
    b = np.frombuffer(data, np.uint8).astype(np.float64)
    return (2.0 ** (b - 127)).reshape(shape)


# ---------------------------------------------------------------- config


def load_config(d):
    f = json.load(open(os.path.join(d, "config.json")))

    def get(*keys, default=None):
        for k in keys:
            if k in f:
                return f[k]
        if default is None:
            raise KeyError(keys)
        return default

    rs = f.get("rope_scaling") or {}
    score = get("scoring_func", "score_func")
    # model.py renormalises the picked weights for every score function but softmax. A
    # config in HF's keys (the tiny fixtures' `official/` copies of tiny-a and tiny-c) says so
    # with `norm_topk_prob` (default true), and deepinfer's config reader follows it.
    renorm = f.get("norm_topk_prob", True) if "hidden_size" in f else score != "softmax"
    c = dict(
        vocab=get("vocab_size"), dim=get("hidden_size", "dim"), layers=get("num_hidden_layers", "n_layers"),
        heads=get("num_attention_heads", "n_heads"), head_dim=get("head_dim"),
        rd=get("qk_rope_head_dim", "rope_head_dim"), q_lora=get("q_lora_rank"),
        groups=get("o_groups"), o_lora=get("o_lora_rank"), window=get("sliding_window", "window_size"),
        ratios=get("compress_ratios"), index_heads=get("index_n_heads"), index_dim=get("index_head_dim"),
        index_topk=get("index_topk"), experts=get("n_routed_experts"), k=get("num_experts_per_tok", "n_activated_experts"),
        hash_layers=get("num_hash_layers", "n_hash_layers", default=0), score=score, renorm=renorm,
        route_scale=get("routed_scaling_factor", "route_scale"), swiglu=get("swiglu_limit", default=0.0),
        hc=get("hc_mult"), sinkhorn=get("hc_sinkhorn_iters"), hc_eps=get("hc_eps"),
        eps=get("rms_norm_eps", "norm_eps"), theta=get("rope_theta"), ctheta=get("compress_rope_theta"),
        factor=rs.get("factor", f.get("rope_factor", 1.0)),
        original=rs.get("original_max_position_embeddings", f.get("original_seq_len", 0)),
        beta_fast=rs.get("beta_fast", f.get("beta_fast", 32)), beta_slow=rs.get("beta_slow", f.get("beta_slow", 1)),
    )
    return c


# ---------------------------------------------------------------- kernels (kernel.py semantics)


def pow2_ceil(s):
    m, e = torch.frexp(s)  # s = m·2^e, m in [0.5, 1)
    return torch.where(m == 0.5, s, torch.ldexp(torch.ones_like(s), e))


def blocks(x, block, fn):
    """Applies `fn` to each `block`-wide slice of the last dim (the last may be short)."""
    parts = [fn(x[..., i:i + block]) for i in range(0, x.size(-1), block)]
    return torch.cat(parts, dim=-1)


def act_quant_sim(x, block):
    if not QUANTISE:
        return x

    def one(b):
        amax = b.abs().amax(-1, keepdim=True).clamp_min(1e-4)
        s = pow2_ceil(amax / 448.0)
        y = (b / s).clamp(-448.0, 448.0)
        q = y.to(torch.float8_e4m3fn).float()
        e = torch.floor(torch.log2(y.abs().clamp_min(2.0 ** -6)))
        count_fragile(y, q, torch.exp2(e - 3))
        return q * s
    return blocks(x, block, one)


FP4_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_rne(a):
    """Nearest e2m1 magnitude of a ≥ 0 (≤ 6), ties to the even code."""
    d = (a.unsqueeze(-1) - FP4_GRID).abs()
    tied = d == d.amin(-1, keepdim=True)
    idx = torch.arange(8)
    even = torch.where(tied & (idx % 2 == 0), idx, 99).amin(-1)
    any_ = torch.where(tied, idx, 99).amin(-1)
    return FP4_GRID[torch.where(even < 99, even, any_)]


def fp4_sim(x, block):
    if not QUANTISE:
        return x

    def one(b):
        amax = b.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0 ** -126)
        s = pow2_ceil(amax / 6.0)
        y = (b / s).clamp(-6.0, 6.0)
        q = torch.sign(y) * e2m1_rne(y.abs())
        a = y.abs()
        count_fragile(y, q, torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)))
        return q * s
    return blocks(x, block, one)


def hadamard(x):
    n = x.size(-1)
    h = torch.ones(1, 1)
    while h.size(0) < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (x @ h) * (n ** -0.5)


def bf16(x):
    """The KV cache's RoPE dims: model.py's kv_cache is bf16 (its other dims are FP8 values)."""
    return x.to(torch.bfloat16).float() if QUANTISE else x


def linear(x, w, quant):
    if quant:
        x = act_quant_sim(x, ACT_BLOCK)
    return x @ w.T


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps))


def hc_split_sinkhorn(mixes, scale, base, hc, iters, eps):
    pre = torch.sigmoid(mixes[..., :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(mixes[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = mixes[..., 2 * hc:].unflatten(-1, (hc, hc)) * scale[2] + base[2 * hc:].view(hc, hc)
    comb = comb.softmax(-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


def sparse_attn(q, kv, sink, idxs, scale):
    """q [s, h, d], kv [n, d], idxs [s, k] (−1 = none): softmax with a zero-value sink."""
    valid = idxs >= 0
    sel = kv[idxs.clamp_min(0)]  # [s, k, d]
    scores = torch.einsum("shd,skd->shk", q, sel) * scale
    scores = scores.masked_fill(~valid.unsqueeze(1), float("-inf"))
    m = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - m)
    den = e.sum(-1) + torch.exp(sink.view(1, -1) - m.squeeze(-1))
    return torch.einsum("shk,skd->shd", e / den.unsqueeze(-1), sel)


# ---------------------------------------------------------------- the model (model.py)


def freqs_cis(c, compressed, seqlen):
    rd = c["rd"]
    base = c["ctheta"] if compressed else c["theta"]
    original = c["original"] if compressed else 0
    freqs = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    if original > 0:
        def corr(n):
            return rd * math.log(original / (n * 2 * math.pi)) / (2 * math.log(base))
        lo = max(math.floor(corr(c["beta_fast"])), 0)
        hi = min(math.ceil(corr(c["beta_slow"])), rd - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(rd // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / c["factor"] * (1 - smooth) + freqs * smooth
    t = torch.arange(seqlen, dtype=torch.float32)
    return torch.polar(torch.ones(seqlen, rd // 2), torch.outer(t, freqs))


def rope(x, fc, inverse=False):
    """Rotates the trailing pairs of x (last dim even) by fc [s, rd/2]; x [s, ..., rd]."""
    xc = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)).contiguous())
    if inverse:
        fc = fc.conj()
    shape = [fc.size(0)] + [1] * (xc.dim() - 2) + [fc.size(1)]
    return torch.view_as_real(xc * fc.view(shape)).flatten(-2)


class Compressor:
    def __init__(self, c, raw, prefix, ratio, head_dim, rotate, fc, max_len):
        self.c, self.ratio, self.d, self.rotate, self.fc = c, ratio, head_dim, rotate, fc
        self.overlap = ratio == 4
        coff = 1 + self.overlap
        self.ape = tensor(raw, prefix + ".ape")
        self.wkv = tensor(raw, prefix + ".wkv.weight")
        self.wgate = tensor(raw, prefix + ".wgate.weight")
        self.norm = tensor(raw, prefix + ".norm.weight")
        self.kv_state = torch.zeros(coff * ratio, coff * head_dim)
        self.score_state = torch.full((coff * ratio, coff * head_dim), float("-inf"))
        self.cache = torch.zeros(max_len // ratio, head_dim)

    def overlap_transform(self, t, value):
        s, r, d = t.size(0), self.ratio, self.d
        out = t.new_full((s, 2 * r, d), value)
        out[:, r:] = t[:, :, d:]
        out[1:, :r] = t[:-1, :, :d]
        return out

    def __call__(self, x, start_pos):
        seqlen = x.size(0)
        ratio, overlap, d, rd = self.ratio, self.overlap, self.d, self.c["rd"]
        kv = x @ self.wkv.T  # float32 weights, no quantisation (model.py)
        score = x @ self.wgate.T
        if start_pos == 0:
            should = seqlen >= ratio
            rem = seqlen % ratio
            cutoff = seqlen - rem
            off = ratio if overlap else 0
            if overlap and cutoff >= ratio:
                self.kv_state[:ratio] = kv[cutoff - ratio:cutoff]
                self.score_state[:ratio] = score[cutoff - ratio:cutoff] + self.ape
            if rem > 0:
                self.kv_state[off:off + rem] = kv[cutoff:]
                self.score_state[off:off + rem] = score[cutoff:] + self.ape[:rem]
                kv, score = kv[:cutoff], score[:cutoff]
            kv = kv.unflatten(0, (-1, ratio))
            score = score.unflatten(0, (-1, ratio)) + self.ape
            if overlap:
                kv = self.overlap_transform(kv, 0.0)
                score = self.overlap_transform(score, float("-inf"))
            kv = (kv * score.softmax(dim=1)).sum(dim=1)
        else:
            should = (start_pos + 1) % ratio == 0
            score = score + self.ape[start_pos % ratio]
            if overlap:
                self.kv_state[ratio + start_pos % ratio] = kv[0]
                self.score_state[ratio + start_pos % ratio] = score[0]
                if should:
                    ks = torch.cat([self.kv_state[:ratio, :d], self.kv_state[ratio:, d:]], 0)
                    ss = torch.cat([self.score_state[:ratio, :d], self.score_state[ratio:, d:]], 0)
                    kv = (ks * ss.softmax(0)).sum(0, keepdim=True)
                    self.kv_state[:ratio] = self.kv_state[ratio:].clone()
                    self.score_state[:ratio] = self.score_state[ratio:].clone()
            else:
                self.kv_state[start_pos % ratio] = kv[0]
                self.score_state[start_pos % ratio] = score[0]
                if should:
                    kv = (self.kv_state * self.score_state.softmax(0)).sum(0, keepdim=True)
        if not should:
            return None
        kv = rms_norm(kv, self.norm, self.c["eps"])
        fc = self.fc[:cutoff:ratio] if start_pos == 0 else self.fc[start_pos + 1 - ratio].unsqueeze(0)
        kv = torch.cat([kv[:, :-rd], rope(kv[:, -rd:], fc)], -1)
        if self.rotate:
            kv = fp4_sim(hadamard(kv), FP4_BLOCK)
        else:
            kv = torch.cat([act_quant_sim(kv[:, :-rd], KV_BLOCK), bf16(kv[:, -rd:])], -1)
        if start_pos == 0:
            self.cache[:seqlen // ratio] = kv
        else:
            self.cache[start_pos // ratio] = kv[0]
        return kv


class Indexer:
    def __init__(self, c, raw, prefix, fc, max_len, gaps):
        self.c, self.fc, self.gaps = c, fc, gaps
        self.wq_b = tensor(raw, prefix + ".wq_b.weight")
        self.weights_proj = tensor(raw, prefix + ".weights_proj.weight")
        self.compressor = Compressor(c, raw, prefix + ".compressor", 4, c["index_dim"], True, fc, max_len)

    def __call__(self, x, qr, start_pos, offset):
        c = self.c
        seqlen, h, hd, rd = x.size(0), c["index_heads"], c["index_dim"], c["rd"]
        end = start_pos + seqlen
        fc = self.fc[start_pos:end]
        q = linear(qr, self.wq_b, True).unflatten(-1, (h, hd))
        q = torch.cat([q[..., :-rd], rope(q[..., -rd:], fc)], -1)
        q = fp4_sim(hadamard(q), FP4_BLOCK)
        self.compressor(x, start_pos)
        weights = (x @ self.weights_proj.T) * (hd ** -0.5 * h ** -0.5)
        keys = self.compressor.cache[:end // 4]
        score = (torch.einsum("shd,td->sht", q, keys).relu() * weights.unsqueeze(-1)).sum(1)
        visible = (torch.arange(start_pos, end) + 1) // 4
        score = score.masked_fill(torch.arange(end // 4).view(1, -1) >= visible.view(-1, 1), float("-inf"))
        k = min(c["index_topk"], end // 4)
        top = score.topk(k, dim=-1)
        for i in range(seqlen):  # the margin at each query that has more entries than picks
            if visible[i] > k:
                v = score[i].sort(descending=True).values
                self.gaps["indexer"] = min(self.gaps["indexer"], float(v[k - 1] - v[k]))
        idxs = top.indices
        return torch.where(idxs >= visible.view(-1, 1), -1, idxs + offset)


class Attention:
    def __init__(self, c, raw, prefix, layer, max_len, gaps):
        self.c, self.ratio = c, c["ratios"][layer]
        self.fc = freqs_cis(c, self.ratio > 0, max_len)
        w = lambda n: tensor(raw, f"{prefix}.{n}")
        self.sink = w("attn_sink")
        self.wq_a, self.q_norm, self.wq_b = w("wq_a.weight"), w("q_norm.weight"), w("wq_b.weight")
        self.wkv, self.kv_norm = w("wkv.weight"), w("kv_norm.weight")
        self.wo_a, self.wo_b = w("wo_a.weight"), w("wo_b.weight")
        self.compressor = self.indexer = None
        if self.ratio:
            self.compressor = Compressor(c, raw, prefix + ".compressor", self.ratio, c["head_dim"], False, self.fc, max_len)
            if self.ratio == 4:
                self.indexer = Indexer(c, raw, prefix + ".indexer", self.fc, max_len, gaps)
        self.ring = torch.zeros(c["window"], c["head_dim"])

    def window_idxs(self, seqlen, start_pos):
        win = self.c["window"]
        if start_pos >= win - 1:
            s = start_pos % win
            return torch.cat([torch.arange(s + 1, win), torch.arange(0, s + 1)]).unsqueeze(0)
        if start_pos > 0:
            return F.pad(torch.arange(start_pos + 1), (0, win - start_pos - 1), value=-1).unsqueeze(0)
        base = torch.arange(seqlen).unsqueeze(1)
        m = (base - win + 1).clamp(0) + torch.arange(min(seqlen, win))
        return torch.where(m > base, -1, m)

    def compress_idxs(self, seqlen, start_pos, offset):
        r = self.ratio
        if start_pos > 0:
            return (torch.arange(0, (start_pos + 1) // r) + offset).unsqueeze(0)
        m = torch.arange(seqlen // r).repeat(seqlen, 1)
        mask = m >= torch.arange(1, seqlen + 1).unsqueeze(1) // r
        return torch.where(mask, -1, m + offset)

    def __call__(self, x, start_pos):
        c = self.c
        seqlen, h, hd, rd, win, eps = x.size(0), c["heads"], c["head_dim"], c["rd"], c["window"], c["eps"]
        fc = self.fc[start_pos:start_pos + seqlen]
        qr = rms_norm(linear(x, self.wq_a, True), self.q_norm, eps)
        q = linear(qr, self.wq_b, True).unflatten(-1, (h, hd))
        q = q * torch.rsqrt(q.square().mean(-1, keepdim=True) + eps)
        q = torch.cat([q[..., :-rd], rope(q[..., -rd:], fc)], -1)
        kv = rms_norm(linear(x, self.wkv, True), self.kv_norm, eps)
        kv = torch.cat([act_quant_sim(kv[:, :-rd], KV_BLOCK), bf16(rope(kv[:, -rd:], fc))], -1)
        idxs = self.window_idxs(seqlen, start_pos)
        if self.ratio:
            offset = seqlen if start_pos == 0 else win
            if self.indexer is not None:
                cidx = self.indexer(x, qr, start_pos, offset)
            else:
                cidx = self.compress_idxs(seqlen, start_pos, offset)
            idxs = torch.cat([idxs.expand(seqlen, -1), cidx.expand(seqlen, -1)], -1)
        if start_pos == 0:
            if seqlen <= win:
                self.ring[:seqlen] = kv
            else:
                cut = seqlen % win
                self.ring[cut:win], self.ring[:cut] = kv[-win:].split([win - cut, cut], 0)
            all_kv = kv
            if self.ratio:
                comp = self.compressor(x, start_pos)
                if comp is not None:
                    all_kv = torch.cat([kv, comp], 0)
            o = sparse_attn(q, all_kv, self.sink, idxs.expand(seqlen, -1), hd ** -0.5)
        else:
            self.ring[start_pos % win] = kv[0]
            all_kv = self.ring
            if self.ratio:
                self.compressor(x, start_pos)
                all_kv = torch.cat([self.ring, self.compressor.cache], 0)
            o = sparse_attn(q, all_kv, self.sink, idxs.expand(seqlen, -1), hd ** -0.5)
        o = torch.cat([o[..., :-rd], rope(o[..., -rd:], fc, inverse=True)], -1)
        g = c["groups"]
        o = o.reshape(seqlen, g, -1)
        wo_a = self.wo_a.view(g, c["o_lora"], -1)
        o = torch.einsum("sgd,grd->sgr", o, wo_a)  # dequantised weight, no activation quant
        return linear(o.flatten(1), self.wo_b, True)


class MoE:
    def __init__(self, c, raw, prefix, layer, gaps):
        self.c, self.gaps = c, gaps
        self.hash = layer < c["hash_layers"]
        self.gate = tensor(raw, prefix + ".gate.weight")
        if self.hash:
            self.tid2eid = tensor(raw, prefix + ".gate.tid2eid")
        else:
            self.bias = tensor(raw, prefix + ".gate.bias")

        def expert(p):
            return {n: (tensor(raw, f"{p}.{n}.weight"), True) for n in ["w1", "w2", "w3"]}
        self.experts = [expert(f"{prefix}.experts.{e}") for e in range(c["experts"])]
        self.shared = expert(prefix + ".shared_experts")

    def run_expert(self, e, x, weights=None):
        lim = self.c["swiglu"]
        gate = linear(x, *e["w1"])
        up = linear(x, *e["w3"])
        if lim > 0:
            up = up.clamp(-lim, lim)
            gate = gate.clamp(max=lim)
        h = F.silu(gate) * up
        if weights is not None:
            h = weights * h
        return linear(h, *e["w2"])

    def __call__(self, x, ids):
        c = self.c
        scores = x @ self.gate.T
        if c["score"] == "softmax":
            scores = scores.softmax(-1)
        elif c["score"] == "sigmoid":
            scores = scores.sigmoid()
        else:
            scores = F.softplus(scores).sqrt()
        original = scores
        if self.hash:
            idx = self.tid2eid[ids]
        else:
            biased = scores + self.bias
            idx = biased.topk(c["k"], -1).indices
            if c["k"] < c["experts"]:
                v = biased.sort(-1, descending=True).values
                self.gaps["router"] = min(self.gaps["router"], float((v[:, c["k"] - 1] - v[:, c["k"]]).min()))
        w = original.gather(1, idx)
        if c["renorm"]:
            w = w / w.sum(-1, keepdim=True)
        w = w * c["route_scale"]
        y = torch.zeros_like(x)
        for e in range(c["experts"]):
            rows, slot = torch.where(idx == e)
            if len(rows):
                y[rows] += self.run_expert(self.experts[e], x[rows], w[rows, slot, None])
        return y + self.run_expert(self.shared, x)


class Block:
    def __init__(self, c, raw, layer, max_len, gaps, prefix=None):
        p = prefix or f"layers.{layer}"
        self.c = c
        self.attn = Attention(c, raw, p + ".attn", layer, max_len, gaps)
        self.ffn = MoE(c, raw, p + ".ffn", layer, gaps)
        self.attn_norm, self.ffn_norm = tensor(raw, p + ".attn_norm.weight"), tensor(raw, p + ".ffn_norm.weight")
        self.hc = {s: [tensor(raw, f"{p}.hc_{s}_{n}") for n in ["fn", "scale", "base"]] for s in ["attn", "ffn"]}

    def hc_pre(self, x, fn, scale, base):
        c = self.c
        flat = x.flatten(1)
        mixes = (flat @ fn.T) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + c["eps"])
        pre, post, comb = hc_split_sinkhorn(mixes, scale, base, c["hc"], c["sinkhorn"], c["hc_eps"])
        return (pre.unsqueeze(-1) * x).sum(1), post, comb

    @staticmethod
    def hc_post(f, residual, post, comb):
        return post.unsqueeze(-1) * f.unsqueeze(1) + (comb.unsqueeze(-1) * residual.unsqueeze(2)).sum(1)

    def __call__(self, x, start_pos, ids):
        r = x
        a, post, comb = self.hc_pre(x, *self.hc["attn"])
        a = self.attn(rms_norm(a, self.attn_norm, self.c["eps"]), start_pos)
        x = self.hc_post(a, r, post, comb)
        r = x
        f, post, comb = self.hc_pre(x, *self.hc["ffn"])
        f = self.ffn(rms_norm(f, self.ffn_norm, self.c["eps"]), ids)
        return self.hc_post(f, r, post, comb)


def head(h, hc_head, norm, weight, c):
    """model.py's ParallelHead (hc_head, norm, f32 logits), at every position."""
    fn, scale, base = hc_head
    flat = h.flatten(1)
    mixes = (flat @ fn.T) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + c["eps"])
    pre = torch.sigmoid(mixes * scale + base) + c["hc_eps"]
    y = (pre.unsqueeze(-1) * h).sum(1)
    return rms_norm(y, norm, c["eps"]) @ weight.T


class Model:
    def __init__(self, d, max_len):
        self.c = c = load_config(d)
        self.raw = raw = read_shards(d)
        self.gaps = {"router": float("inf"), "indexer": float("inf")}
        self.embed = tensor(raw, "embed.weight")
        self.blocks = [Block(c, raw, i, max_len, self.gaps) for i in range(c["layers"])]
        self.norm, self.head = tensor(raw, "norm.weight"), tensor(raw, "head.weight")
        self.hc_head = [tensor(raw, f"hc_head_{n}") for n in ["fn", "scale", "base"]]

    def streams(self, ids, start_pos):
        """The final residual streams `[s, hc, D]` (what the MTP block reads)."""
        h = self.embed[ids].unsqueeze(1).repeat(1, self.c["hc"], 1)
        for b in self.blocks:
            h = b(h, start_pos, ids)
        return h

    def __call__(self, ids, start_pos):
        # Every position's logits (model.py computes the last one only).
        return head(self.streams(ids, start_pos), self.hc_head, self.norm, self.head, self.c)


class Mtp:
    """model.py's MTPBlock: e = enorm(embed(next token)), x = hnorm(h) per stream,
    x = e_proj(e) + h_proj(x) (both FP8 projections: quantised inputs), then a Block at layer
    id n_layers (compress_ratios[n_layers] = 0: sliding window; a scored router), and the
    shared embedding and head behind the block's own hc_head and norm."""

    def __init__(self, model, max_len):
        c, raw, p = model.c, model.raw, "mtp.0"
        self.model, self.c = model, c
        self.block = Block(c, raw, c["layers"], max_len, model.gaps, prefix=p)
        self.e_proj, self.h_proj = tensor(raw, p + ".e_proj.weight"), tensor(raw, p + ".h_proj.weight")
        self.enorm, self.hnorm = tensor(raw, p + ".enorm.weight"), tensor(raw, p + ".hnorm.weight")
        self.norm = tensor(raw, p + ".norm.weight")
        self.hc_head = [tensor(raw, f"{p}.hc_head_{n}") for n in ["fn", "scale", "base"]]

    def __call__(self, h, start_pos, ids):
        eps = self.c["eps"]
        e = rms_norm(self.model.embed[ids], self.enorm, eps)
        x = linear(e, self.e_proj, True).unsqueeze(1) + linear(rms_norm(h, self.hnorm, eps), self.h_proj, True)
        x = self.block(x, start_pos, ids)
        return x, head(x, self.hc_head, self.norm, self.model.head, self.c)


# ---------------------------------------------------------------- goldens


def top2_gap(logits):
    v = logits.topk(2, -1).values
    return float((v[..., 0] - v[..., 1]).min())


def run_prompt(d, ids):
    FRAGILE[0] = 0
    model = Model(d, len(ids) + GREEDY_STEPS + 1)
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
    return logits, greedy, torch.stack(tops_i), torch.stack(tops_v), model.gaps, greedy_gap


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (arr, dt) in sorted(tensors.items()):
        b = arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def check_plain(cfg, d, hf):
    """The port without quantisation against HF's float32 logits (the last position)."""
    want = read_shards(os.path.join(ROOT, cfg), only="golden.safetensors")
    for p in hf["prompts"]:
        model = Model(d, len(p["ids"]) + 1)
        with torch.no_grad():
            got = model(torch.tensor(p["ids"]), 0)[-1]
        ref = tensor(want, f"p{p['index']}.last_logits")
        diff = float((got - ref).abs().max() / ref.abs().max().clamp_min(1.0))
        print(f"{cfg} p{p['index']} plain port vs HF: max relative diff {diff:.2e}")
        assert diff < 1e-4, "the port disagrees with HF without quantisation"
    hf_mtp = read_shards(os.path.join(ROOT, cfg), only="mtp_golden.safetensors")
    ids = [int(v) for v in tensor(hf_mtp, "prompt_ids")]
    model = Model(d, len(ids) + 1)
    with torch.no_grad():
        h = model.streams(torch.tensor(ids), 0)
        nxt = int(tensor(hf_mtp, "next_token")[0])
        _, logits = Mtp(model, len(ids) + 1)(h, 0, torch.tensor(ids[1:] + [nxt]))
    ref = tensor(hf_mtp, "mtp_logits")
    diff = float((logits - ref).abs().max() / ref.abs().max().clamp_min(1.0))
    print(f"{cfg} MTP block, plain port vs HF: max relative diff {diff:.2e}")
    assert diff < 1e-4, "the MTP port disagrees with HF without quantisation"


MTP_CHAIN = 4


def mtp_golden(cfg, d):
    """The MTP block on the HF MTP golden's prompt (see make_mtp_golden.py's FORMAT, whose
    names this keeps): the target's streams, the block over the whole prompt, a chain."""
    FRAGILE[0] = 0
    ids = [int(v) for v in tensor(read_shards(os.path.join(ROOT, cfg), only="mtp_golden.safetensors"), "prompt_ids")]
    t = len(ids)
    model = Model(d, t + MTP_CHAIN + 1)
    mtp = Mtp(model, t + MTP_CHAIN + 1)
    margin = lambda l: float(l.topk(2).values[0] - l.topk(2).values[1])
    with torch.no_grad():
        h = model.streams(torch.tensor(ids), 0)
        target = head(h[-1:], model.hc_head, model.norm, model.head, model.c)[0]
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
    write_safetensors(os.path.join(ROOT, cfg, "official_mtp_golden.safetensors"), tensors)
    gaps = model.gaps
    safe = (min(gaps["router"], gaps["indexer"]) >= TIE_GAP and FRAGILE[0] <= FRAGILE_MAX
            and margin(target) >= TIE_GAP)
    meta = dict(config=cfg, numerics="official", prompt_len=t, next_token=nxt, chain_tokens=chain,
                chain_margins=margins, mtp_argmax=[int(l.argmax()) for l in logits],
                mtp_argmax_margins=arg_margins, router_gap=min(gaps["router"], 1e9),
                indexer_gap=min(gaps["indexer"], 1e9), fragile_roundings=FRAGILE[0], tie_safe=safe)
    with open(os.path.join(ROOT, cfg, "official_mtp_golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{cfg} mtp: prompt {t}, chain {chain}, fragile {FRAGILE[0]}, tie_safe {safe}", flush=True)


def main():
    global QUANTISE
    torch.set_num_threads(os.cpu_count() or 1)
    args = sys.argv[1:]
    if "--plain" in args:
        QUANTISE = False
        args.remove("--plain")
    for cfg in args or CONFIGS:
        if not QUANTISE:
            d = os.path.join(ROOT, cfg, "official")
            check_plain(cfg, d, json.load(open(os.path.join(ROOT, cfg, "golden.json"))))
            continue
        d = os.path.join(ROOT, cfg, "official")
        hf = json.load(open(os.path.join(ROOT, cfg, "golden.json")))
        out, prompts = {}, []
        for p in hf["prompts"]:
            ids = p["ids"]
            logits, greedy, ti, tv, gaps, greedy_gap = run_prompt(d, ids)
            i = p["index"]
            out[f"p{i}.argmax"] = (logits.argmax(-1).numpy().astype(np.int64), "I64")
            out[f"p{i}.last_logits"] = (logits[-1].numpy().astype(np.float32), "F32")
            out[f"p{i}.top_ids"] = (ti.numpy().astype(np.int64).reshape(-1), "I64")
            out[f"p{i}.top_logits"] = (tv.numpy().astype(np.float32).reshape(-1), "F32")
            fragile = FRAGILE[0]
            safe = min(gaps["router"], gaps["indexer"], greedy_gap) >= TIE_GAP and fragile <= FRAGILE_MAX
            finite = lambda v: min(v, 1e9)  # no selection of that kind: JSON has no infinity
            prompts.append(dict(index=i, len=len(ids), ids=ids, greedy=greedy, router_gap=finite(gaps["router"]),
                                indexer_gap=finite(gaps["indexer"]), greedy_gap=greedy_gap, fragile_roundings=fragile,
                                tie_safe=safe))
            print(f"{cfg} p{i} len {len(ids)}: greedy {greedy[:8]}… gaps router {gaps['router']:.2e} "
                  f"indexer {gaps['indexer']:.2e} greedy {greedy_gap:.2e} fragile {fragile} tie_safe {safe}", flush=True)
        write_safetensors(os.path.join(ROOT, cfg, "official_golden.safetensors"), out)
        meta = dict(config=cfg, numerics="official", greedy_steps=GREEDY_STEPS, top_logprobs=TOPK_LOGITS,
                    tie_gap=TIE_GAP, prompts=prompts)
        with open(os.path.join(ROOT, cfg, "official_golden.json"), "w") as f:
            json.dump(meta, f, indent=1)
        mtp_golden(cfg, d)


if __name__ == "__main__":
    main()
