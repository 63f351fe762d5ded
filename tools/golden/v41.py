"""DeepSeek-V4.1 on the CPU, in float32: the tiny V4.1 configs, their random weights in
DeepSeek's layout, and the forward (no reference runs V4.1 on a CPU: vLLM's and SGLang's paths
need GPU kernels, HF has no V4.1). make_v41_golden.py records its goldens; make_dspark_golden.py
drafts on it.

Which source each part follows (vLLM 0.33.0 sdist, `vllm/models/deepseek_v41/`; docs/MODEL.md §8):

  - Shifted mHC (`nvidia/model.py` DeepseekV4DecoderLayer.forward and
    `model_executor/kernels/mhc/torch.py` mhc_pre_delayed_torch / mhc_post_torch): each
    sublayer computes (pre, post, comb) from its own input streams but collapses them with the
    previous sublayer's `pre`; layer 0's attention takes stream 0; the final collapse uses the
    last FFN's `pre`, then `norm` and `head`; no `hc_head`. The collapsed input is RMS-normed
    with the sublayer's norm weight (the `norm_weight` the fused kernel takes).
  - Attention (`attention.py`): q = wq_b(q_norm(wq_a x)) with no per-head RMS (docs/MODEL.md §8.2; the
    fused kernel is called with apply_q_norm=False), kv = kv_norm(wkv x), GPT-J-interleaved
    RoPE on the trailing `qk_rope_head_dim` dims (the compress table, θ=compress_rope_theta
    with YaRN, on every layer whose ratio > 0), sink attention over the window (own token
    included) plus the selected compressed entries, inverse RoPE on the output, grouped wo_a,
    wo_b — as V4.
  - Compressor (`compressor.py`, `common/ops/fused_compress_quant_cache.py`): only kv-source
    layers own one. Ratio 1: latent = norm(wkv x) per token. Ratio 2: non-overlapping pairs,
    per-channel softmax over wgate x weighting wkv x, then norm; no `ape` (vLLM's V4.1
    compressor has none). An entry is RoPE'd at its group's first position. Every compressed
    layer reads the entries of the latest kv source at or below it.
  - Indexer (`attention.py` DeepseekV4Indexer): only index sources score. Keys =
    k_norm(wk(latent)) from the kv source's pre-RoPE latent, RoPE'd like the entries, owned by
    the kv source (non-owning index sources read them). Score = Σ_h w_h·relu(q_h·k) with
    w = weights_proj(x)·index_head_dim^-½·index_n_heads^-½, q = wq_b(qr) RoPE'd at the token.
    Non-source layers reuse the latest index source's picks.
  - Two-level indexer (`model_executor/kernels/attention/dsa/candidate_blocks.py`): the
    candidate source also publishes, per query, the top `candidate_topk_blocks` blocks of
    `candidate_block_size` entries (block score = max entry score, the newest block pinned to
    +inf); later index sources mask their scores to those blocks before their own top-k.
    Where a query sees no more entries than top-k, every entry is picked (the short-context
    path, `_fill_short_context_topk_indices`), candidates or not.
  - Engram (`common/engram.py` Engram.forward and `_fused_engram_post_wkv_kernel`; hashing in
    golden/engram.py): applied to the streams before the layer's attention mHC;
    kv = wkv(concat of the hashed table rows), one key per stream plus a shared value; gate
    g = sigmoid(signed sqrt(max(|z|, 1e-6))), z = Σ X·q_w·k_w·key · rms⁻¹(X)·rms⁻¹(key)/√D;
    X[c] += g·value.
  - MoE: V4's scored router (sqrtsoftplus, `gate.bias` added for the choice only, picked
    weights renormalised and scaled), SwiGLU with clamp, shared expert; no hash layers.

Where vLLM and the spec disagree nothing here had to choose: the spec's §8 restates vLLM's
V4.1 port. Image positions are the image token's (vLLM's `image_sentinel_mask` is
`token_ids == image_token_id`): they route with `gate.bias_vl`, are dead for the Engram
hashing and get a shut Engram gate. `tiny-v41-b` puts its image token inside the vocabulary
and into every prompt; `tiny-v41-a` keeps V4.1's id, outside its vocabulary (gating off).
`V41.forward`'s `embeds` replaces chosen positions' input embeddings (an image span's, vLLM's
inputs_embeds path; its docstring cites the lines); the ids still do the above.
"""

import functools
import json
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

from golden import engram as v41_engram
from golden.paths import TOKENIZER
from golden.primitives import freqs_cis, hc_mixes, hc_post, hc_split_sinkhorn, rms_norm, rope_tail, sparse_attn
from golden.quant_sim import V41Numerics
from golden.storage import Store

CONFIGS = {
    # Spec §10.3's shape: ratios [0,2,2,1,1], kv sources [1,3], index sources [1,3,4],
    # candidate source 3, Engram at layers 1 and 3 (2 heads × 32 dims, n-grams up to 4),
    # window 6, hc 2. Candidate blocks of 2 entries, 4 of them, so that layer 4 chooses its 4
    # picks among 7-8 candidate entries (with blocks of 1 and top 2 it would have no choice).
    "tiny-v41-a": dict(
        seed=41,
        cfg=dict(
            vocab_size=512, hidden_size=128, num_hidden_layers=5, num_attention_heads=4,
            head_dim=64, qk_rope_head_dim=32, q_lora_rank=64, o_groups=2, o_lora_rank=32,
            sliding_window=6, compress_ratios=[0, 2, 2, 1, 1],
            kv_source_layer_ids=[1, 3], index_source_layer_ids=[1, 3, 4],
            candidate_source_layer_id=3, candidate_topk_blocks=4, candidate_block_size=2,
            index_n_heads=8, index_head_dim=64, index_topk=4,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=64,
            scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, swiglu_limit=0.6,
            hc_mult=2, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
            rope_theta=10000.0, compress_rope_theta=160000.0,
            rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                          "beta_fast": 32, "beta_slow": 1},
            max_position_embeddings=4096,
            engram_layer_ids=[1, 3], engram_max_ngram_size=4, engram_vocab_size=1000,
            engram_n_heads=2, engram_head_dim=32, engram_pad_token_id=2,
        ),
        prompt_lengths=[3, 37, 130, 400],
        intermediates_prompt=1,
    ),
    # Sizes off the 32-grid (q_lora 48, o_lora 40, index dim 48·… ragged FP8 blocks), hc 4,
    # sigmoid scoring with 3 of 6 experts, a ratio-2 kv source followed by a ratio-1 one, the
    # candidate source right after it, Engram on one layer with 3 heads.
    "tiny-v41-b": dict(
        seed=42,
        cfg=dict(
            vocab_size=300, hidden_size=96, num_hidden_layers=4, num_attention_heads=3,
            head_dim=64, qk_rope_head_dim=16, q_lora_rank=48, o_groups=1, o_lora_rank=40,
            sliding_window=8, compress_ratios=[0, 2, 1, 1],
            kv_source_layer_ids=[1, 2], index_source_layer_ids=[1, 2, 3],
            candidate_source_layer_id=2, candidate_topk_blocks=3, candidate_block_size=4,
            index_n_heads=16, index_head_dim=32, index_topk=6,
            n_routed_experts=6, num_experts_per_tok=3, n_shared_experts=1, moe_intermediate_size=32,
            scoring_func="sigmoid", routed_scaling_factor=2.5, swiglu_limit=0.8,
            hc_mult=4, hc_sinkhorn_iters=7, hc_eps=1e-6, rms_norm_eps=1e-6,
            rope_theta=10000.0, compress_rope_theta=160000.0,
            rope_scaling={"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                          "beta_fast": 32, "beta_slow": 1},
            max_position_embeddings=4096,
            engram_layer_ids=[2], engram_max_ngram_size=3, engram_vocab_size=500,
            engram_n_heads=3, engram_head_dim=32, engram_pad_token_id=2,
            image_token_id=299,
        ),
        prompt_lengths=[1, 29, 100, 300],
        intermediates_prompt=1,
    ),
}

FP8_BLOCK = 32  # V4.1's FP8 weights carry 32x32 scale blocks


def store(seed):
    """A Store that rounds onto V4.1's formats (golden/storage.py)."""
    return Store(seed, FP8_BLOCK)


# ---------------------------------------------------------------- topology (attention.py)

def latest(sources, layer):
    return max(s for s in sources if s <= layer)


class Topology:
    def __init__(self, c):
        self.c = c
        self.ratios = c["compress_ratios"][: c["num_hidden_layers"]]

    def kv_source(self, l):
        return latest(self.c["kv_source_layer_ids"], l) if self.ratios[l] else None

    def index_source(self, l):
        return latest(self.c["index_source_layer_ids"], l) if self.ratios[l] else None


# ---------------------------------------------------------------- weights

def draw_layer(s, p, c, n_experts, between=None, bias_vl=True):
    """One decoder layer's weights under prefix `p`, in the order they are drawn (which fixes
    the committed bytes): mHC, norms, attention, `between(lw, attn_prefix)` (a main layer's
    compressor and indexer), router, routed and shared experts. A drafter's stage
    (make_dspark_golden.py, make_dspark_v4_golden.py) is the same minus `between`; V4 has no
    `gate.bias_vl`."""
    D, hc = c["hidden_size"], c["hc_mult"]
    H, hd, ql = c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
    g, ol, inter = c["o_groups"], c["o_lora_rank"], c["moe_intermediate_size"]
    mix = (2 + hc) * hc
    lw = {}
    for sub in ("attn", "ffn"):
        lw[f"hc_{sub}"] = (
            s.f32(f"{p}.hc_{sub}_fn", s.draw((mix, hc * D), 0.05)),
            s.f32(f"{p}.hc_{sub}_scale", torch.rand(3, generator=s.g) + 0.5),
            s.f32(f"{p}.hc_{sub}_base", s.draw((mix,), 0.3)),
        )
    lw["attn_norm"] = s.bf16(f"{p}.attn_norm.weight", s.draw((D,), 0.1, 1.0))
    lw["ffn_norm"] = s.bf16(f"{p}.ffn_norm.weight", s.draw((D,), 0.1, 1.0))
    a = f"{p}.attn"
    lw["wq_a"] = s.fp8(f"{a}.wq_a.weight", s.draw((ql, D), 0.05))
    lw["q_norm"] = s.bf16(f"{a}.q_norm.weight", s.draw((ql,), 0.1, 1.0))
    lw["wq_b"] = s.fp8(f"{a}.wq_b.weight", s.draw((H * hd, ql), 0.05))
    lw["wkv"] = s.fp8(f"{a}.wkv.weight", s.draw((hd, D), 0.05))
    lw["kv_norm"] = s.bf16(f"{a}.kv_norm.weight", s.draw((hd,), 0.1, 1.0))
    lw["wo_a"] = s.fp8(f"{a}.wo_a.weight", s.draw((g * ol, H * hd // g), 0.05))
    lw["wo_b"] = s.fp8(f"{a}.wo_b.weight", s.draw((D, g * ol), 0.05))
    lw["sink"] = s.f32(f"{a}.attn_sink", s.draw((H,), 1.0))
    if between:
        between(lw, a)
    f = f"{p}.ffn"
    lw["gate"] = s.bf16(f"{f}.gate.weight", s.draw((n_experts, D), 0.15))
    lw["bias"] = s.f32(f"{f}.gate.bias", s.draw((n_experts,), 0.1))
    if bias_vl:
        lw["bias_vl"] = s.f32(f"{f}.gate.bias_vl", s.draw((n_experts,), 0.1))
    lw["experts"] = [{
        "w1": s.fp4(f"{f}.experts.{e}.w1.weight", s.draw((inter, D), 0.06)),
        "w3": s.fp4(f"{f}.experts.{e}.w3.weight", s.draw((inter, D), 0.06)),
        "w2": s.fp4(f"{f}.experts.{e}.w2.weight", s.draw((D, inter), 0.06)),
    } for e in range(n_experts)]
    sp = f"{f}.shared_experts"
    lw["shared"] = {
        "w1": s.fp8(f"{sp}.w1.weight", s.draw((inter, D), 0.06)),
        "w3": s.fp8(f"{sp}.w3.weight", s.draw((inter, D), 0.06)),
        "w2": s.fp8(f"{sp}.w2.weight", s.draw((D, inter), 0.06)),
    }
    return lw


def draw_sources(s, lw, a, c, topo, l):
    """Layer `l`'s compressor (a kv source) and indexer (an index source)."""
    D, hd, ql = c["hidden_size"], c["head_dim"], c["q_lora_rank"]
    ih, ihd = c["index_n_heads"], c["index_head_dim"]
    ratio = topo.ratios[l]
    if ratio and topo.kv_source(l) == l:
        lw["c_wkv"] = s.bf16(f"{a}.compressor.wkv.weight", s.draw((hd, D), 0.05))
        if ratio > 1:
            lw["c_wgate"] = s.bf16(f"{a}.compressor.wgate.weight", s.draw((hd, D), 0.05))
        lw["c_norm"] = s.bf16(f"{a}.compressor.norm.weight", s.draw((hd,), 0.1, 1.0))
    if ratio and topo.index_source(l) == l:
        lw["i_wq_b"] = s.fp8(f"{a}.indexer.wq_b.weight", s.draw((ih * ihd, ql), 0.1))
        lw["i_weights"] = s.bf16(f"{a}.indexer.weights_proj.weight", s.draw((ih, D), 0.3))
        if topo.kv_source(l) == l:
            lw["i_wk"] = s.bf16(f"{a}.indexer.wk.weight", s.draw((ihd, hd), 0.1))
            lw["i_k_norm"] = s.bf16(f"{a}.indexer.k_norm.weight", s.draw((ihd,), 0.1, 1.0))


def build(cfg_name, spec):
    c = spec["cfg"]
    s = store(spec["seed"])
    D, hc, L = c["hidden_size"], c["hc_mult"], c["num_hidden_layers"]
    E = c["n_routed_experts"]
    topo = Topology(c)
    w = {
        "embed": s.bf16("embed.weight", s.draw((c["vocab_size"], D), 1.0)),
        "norm": s.bf16("norm.weight", s.draw((D,), 0.1, 1.0)),
        "head": s.bf16("head.weight", s.draw((c["vocab_size"], D), 0.1)),
        "layers": [],
    }
    eng = engram_layout(c)
    for l in range(L):
        lw = draw_layer(s, f"layers.{l}", c, E, lambda lw, a: draw_sources(s, lw, a, c, topo, l))
        if eng and l in eng["layer_ids"]:
            k = eng["layer_ids"].index(l)
            rows, edim = eng["rows"][k], c["engram_head_dim"]
            cols = eng["cols"] * edim
            ep = f"layers.{l}.engram"
            # Table rows are FP8 with one E8M0 scale per 32 columns (1x32 blocks).
            lw["engram"] = {
                "embed": s.fp8(f"{ep}.embed.weight", s.draw((rows, edim), 0.5), 1, 32),
                "wkv": s.fp8(f"{ep}.wkv.weight", s.draw(((hc + 1) * D, cols), 0.05)),
                "q_w": s.bf16(f"{ep}.q_weight", s.draw((hc, D), 0.3, 1.0)),
                "k_w": s.bf16(f"{ep}.k_weight", s.draw((hc, D), 0.3, 1.0)),
                "index": k,
            }
        w["layers"].append(lw)
    return w, s.files


# ---------------------------------------------------------------- Engram

@functools.lru_cache(maxsize=None)
def token_map():
    """The committed tokenizer's compressed token map (computed once: it takes seconds)."""
    return v41_engram.compressed_token_map(TOKENIZER)


def engram_layout(c):
    if not c.get("engram_layer_ids"):
        return None
    lookup, size = token_map()
    layer_ids = c["engram_layer_ids"]
    n, heads = c["engram_max_ngram_size"], c["engram_n_heads"]
    primes, offsets, rows = v41_engram.layout(layer_ids, c["engram_vocab_size"], n, heads)
    mult = v41_engram.hash_multipliers(layer_ids, n, size)
    c["engram_compressed_vocab_size"] = size
    c["engram_num_embeddings"] = [int(r) for r in rows]
    return dict(layer_ids=layer_ids, primes=primes, offsets=offsets, rows=rows, mult=mult,
                cols=(n - 1) * heads, lookup=lookup, pad=lookup[c["engram_pad_token_id"]])


def engram_rows(eng, k, ids, image):
    compressed = [v41_engram.DEAD_ID if t == image else eng["lookup"][t] for t in ids]
    return torch.from_numpy(np.asarray(v41_engram.hash_rows(
        compressed, k, eng["mult"], eng["primes"], eng["offsets"], eng["pad"]), dtype=np.int64))


def engram(X, ew, rows, eps, keep, nm):
    """X [T, hc, D] → X with the gated lookup added (Engram.forward)."""
    T, hc, D = X.shape
    # FP8 table rows through MXFP8 (lossless: their 1x32 scales are powers of two).
    emb = nm.mxfp8(ew["embed"][rows].flatten(1))  # [T, cols·head_dim]
    kv = emb @ ew["wkv"].T  # [T, (hc+1)·D]
    keys, value = kv[:, : hc * D].view(T, hc, D), kv[:, hc * D:]
    x_rms = torch.rsqrt(X.square().mean(-1) + eps)
    k_rms = torch.rsqrt(keys.square().mean(-1) + eps)
    z = (X * ew["q_w"] * ew["k_w"] * keys).sum(-1) * x_rms * k_rms / math.sqrt(D)
    root = torch.sqrt(z.abs().clamp(min=1e-6))
    gate = torch.sigmoid(torch.where(z < 0, -root, root))  # the kernel's sign: 0 counts as +
    gate = gate * keep.unsqueeze(-1)  # image positions: gate shut
    return X + gate.unsqueeze(-1) * value.unsqueeze(1)


# ---------------------------------------------------------------- forward

class Gaps:
    def __init__(self):
        self.router = self.indexer = self.candidate = math.inf

    @staticmethod
    def margin(v, k):
        """Gap between the k-th and (k+1)-th largest finite value of v (inf if there is none)."""
        v = v[torch.isfinite(v)].sort(descending=True).values
        return float(v[k - 1] - v[k]) if len(v) > k else math.inf


class V41:
    """`nm`: where it rounds (golden/quant_sim.py's V41Numerics; by default nowhere)."""

    def __init__(self, c, w, nm=None):
        self.c, self.w, self.topo = c, w, Topology(c)
        self.nm = nm or V41Numerics(quantise=False)
        self.eps = c["rms_norm_eps"]
        self.fc = {}
        rs = c["rope_scaling"]
        fcfg = dict(rd=c["qk_rope_head_dim"], theta=c["rope_theta"], ctheta=c["compress_rope_theta"],
                    original=rs["original_max_position_embeddings"], factor=rs["factor"],
                    beta_fast=rs["beta_fast"], beta_slow=rs["beta_slow"])
        self.fc_main = freqs_cis(fcfg, False, c["max_position_embeddings"])
        self.fc_comp = freqs_cis(fcfg, True, c["max_position_embeddings"])
        self.eng = engram_layout(c)

    # -- mHC
    def coeffs(self, X, hcw):
        fn, scale, base = hcw
        mixes = hc_mixes(X, fn, self.eps)
        return hc_split_sinkhorn(mixes, scale, base, self.c["hc_mult"], self.c["hc_sinkhorn_iters"],
                                 self.c["hc_eps"])

    # golden/primitives.py's hc_post (mhc_post_torch computes the same).
    post = staticmethod(hc_post)

    # -- compressed state of a kv source
    def compress(self, l, x, fc):
        """`x`: the attention input as the bf16 compressor reads it."""
        lw, r, T, nm = self.w["layers"][l], self.topo.ratios[l], x.shape[0], self.nm
        kv = x @ lw["c_wkv"].T
        n = T // r
        if r == 1:
            pooled = kv
        else:
            z = x @ lw["c_wgate"].T
            kv, z = kv[: n * r].reshape(n, r, kv.shape[1]), z[: n * r].reshape(n, r, z.shape[1])
            pooled = (kv * z.softmax(1)).sum(1)
        latent = rms_norm(pooled, lw["c_norm"], self.eps)
        at = torch.arange(n) * r
        entries = nm.kv_record(rope_tail(latent, fc[at], self.c["qk_rope_head_dim"]))
        keys = None
        if "i_wk" in lw:
            keys = rms_norm(nm.bf16_input(latent) @ lw["i_wk"].T, lw["i_k_norm"], self.eps)
            keys = nm.index_fp8(rope_tail(keys, fc[at], self.c["qk_rope_head_dim"]))
        return entries, keys

    def index(self, l, x, qr, fc, keys, r, state, gaps):
        """`x`: the attention input as the bf16 weights_proj reads it; `qr` as wq_b reads it."""
        c, lw, T = self.c, self.w["layers"][l], x.shape[0]
        ih, ihd, k = c["index_n_heads"], c["index_head_dim"], c["index_topk"]
        q = rope_tail((qr @ lw["i_wq_b"].T).view(T, ih, ihd), fc[:T].unsqueeze(1).squeeze(1), c["qk_rope_head_dim"])
        q = self.nm.index_fp8(q)
        wts = (x @ lw["i_weights"].T) * (ihd ** -0.5 * ih ** -0.5)
        n = keys.shape[0]
        score = (torch.einsum("thd,nd->thn", q, keys).relu() * wts.unsqueeze(-1)).sum(1)
        visible = (torch.arange(T) + 1) // r
        cols = torch.arange(n)
        score = score.masked_fill(cols.view(1, -1) >= visible.view(-1, 1), float("-inf"))
        cand_src = c.get("candidate_source_layer_id", -1)
        B, nb = c.get("candidate_block_size", 0), c.get("candidate_topk_blocks", 0)
        if 0 <= cand_src < l:
            allowed = state["candidates"]  # [T, n] bool
            masked = score.masked_fill(~allowed, float("-inf"))
        else:
            masked = score
        picks = []
        for t in range(T):
            v = int(visible[t])
            if v <= k:
                picks.append(list(range(v)))
                continue
            row = masked[t, :v]
            gaps.indexer = min(gaps.indexer, Gaps.margin(row, k))
            top = row.topk(k)
            picks.append([int(i) for i, s in zip(top.indices, top.values) if math.isfinite(float(s))])
        if l == cand_src:
            allowed = torch.zeros(T, max(n, 1), dtype=torch.bool)
            for t in range(T):
                v = int(visible[t])
                if v == 0:
                    continue
                nblk = math.ceil(v / B)
                bs = torch.full((nblk,), float("-inf"))
                for b in range(nblk):
                    bs[b] = score[t, b * B:min((b + 1) * B, v)].max()
                finite = bs.clone()
                bs[nblk - 1] = float("inf")
                if nblk > nb:
                    gaps.candidate = min(gaps.candidate, Gaps.margin(finite[: nblk - 1], nb - 1))
                for b in bs.topk(min(nb, nblk)).indices:
                    allowed[t, int(b) * B:min((int(b) + 1) * B, v)] = True
            state["candidates"] = allowed
        return picks

    def attention(self, l, x, state, gaps):
        c, lw, T = self.c, self.w["layers"][l], x.shape[0]
        H, hd, rd, win = c["num_attention_heads"], c["head_dim"], c["qk_rope_head_dim"], c["sliding_window"]
        r, nm = self.topo.ratios[l], self.nm
        fc = (self.fc_comp if r else self.fc_main)
        xq, x = nm.mxfp8(x), nm.bf16_input(x)
        qr = nm.mxfp8(rms_norm(xq @ lw["wq_a"].T, lw["q_norm"], self.eps))
        q = rope_tail((qr @ lw["wq_b"].T).view(T, H, hd), fc[:T], rd)
        kv = nm.kv_record(rope_tail(rms_norm(xq @ lw["wkv"].T, lw["kv_norm"], self.eps), fc[:T], rd))
        all_kv = kv
        idxs = []
        for t in range(T):
            idxs.append(list(range(max(0, t - win + 1), t + 1)))
        if r:
            src = self.topo.kv_source(l)
            if src == l:
                state["kv"][l] = self.compress(l, x, fc)
            entries, keys = state["kv"][src]
            isrc = self.topo.index_source(l)
            if isrc == l:
                state["picks"] = self.index(l, x, qr, fc, state["kv"][src][1], r, state, gaps)
            picks = state["picks"]
            all_kv = torch.cat([kv, entries], 0)
            for t in range(T):
                idxs[t] += [T + e for e in picks[t]]
        width = max(len(i) for i in idxs)
        it = torch.tensor([i + [-1] * (width - len(i)) for i in idxs])
        o = sparse_attn(q, all_kv, lw["sink"], it, hd ** -0.5)
        o = rope_tail(o, fc[:T], rd, inverse=True)
        g = c["o_groups"]
        o = nm.mxfp8(o.reshape(T, g, -1))  # each group's input in its own blocks
        o = torch.einsum("sgd,grd->sgr", o, lw["wo_a"].view(g, c["o_lora_rank"], -1))
        return nm.mxfp8(o.flatten(1)) @ lw["wo_b"].T

    def moe(self, l, x, gaps, ids=None):
        c, lw, nm = self.c, self.w["layers"][l], self.nm
        k, E, lim = c["num_experts_per_tok"], c["n_routed_experts"], c["swiglu_limit"]
        scores = nm.bf16_input(x) @ lw["gate"].T
        x = nm.mxfp8(x)
        if c["scoring_func"] == "sigmoid":
            scores = scores.sigmoid()
        elif c["scoring_func"] == "softmax":
            scores = scores.softmax(-1)
        else:
            scores = F.softplus(scores).sqrt()
        bias = lw["bias"].expand_as(scores)
        if ids is not None:
            image = torch.tensor(ids) == self.c.get("image_token_id", -1)
            bias = torch.where(image.unsqueeze(-1), lw["bias_vl"], bias)
        biased = scores + bias
        idx = biased.topk(k, -1).indices
        if k < E:
            for row in biased:
                gaps.router = min(gaps.router, Gaps.margin(row, k))
        wts = scores.gather(1, idx)
        if c["scoring_func"] != "softmax":
            wts = wts / wts.sum(-1, keepdim=True)
        wts = wts * c["routed_scaling_factor"]

        def expert(e, x):
            gate, up = x @ e["w1"].T, x @ e["w3"].T
            up, gate = up.clamp(-lim, lim), gate.clamp(max=lim)
            return F.silu(gate) * up

        y = torch.zeros_like(x)
        for e in range(E):
            rows, slot = torch.where(idx == e)
            if len(rows):
                h, w2, wt = expert(lw["experts"][e], x[rows]), lw["experts"][e]["w2"], wts[rows, slot, None]
                if nm.weights_after_down:
                    y[rows] += (nm.mxfp8(h) @ w2.T) * wt
                else:
                    y[rows] += nm.mxfp8(h * wt) @ w2.T
        return y + nm.mxfp8(expert(lw["shared"], x)) @ lw["shared"]["w2"].T

    def forward(self, ids, want_layers=False, embeds=None):
        """(logits [T, vocab], per-layer streams if `want_layers`, Gaps) for the token ids `ids`.

        `embeds`, when given, is (rows, values): a LongTensor of positions and float32
        [len(rows), hidden] that replace those positions' token embeddings before the streams
        are expanded (every hc stream starts from the same vector) — vLLM's `inputs_embeds`
        path for an image span (vLLM 0.33.0 wheel, paths under vllm/):
        models/deepseek_v41/nvidia/vl_model.py 255-274 (embed_input_ids: the text model's
        embedding of input_ids, then _merge_multimodal_embeddings), model_executor/models/
        utils.py 717-753 (_merge_multimodal_embeddings: `inputs_embeds[is_multimodal] =
        mm_embeds_flat`, overwriting the placeholder rows in order), vl_model.py 287-301
        (forward hands inputs_embeds to the language model together with input_ids),
        models/deepseek_v41/nvidia/model.py 974-987 (DeepseekV41Model.forward takes
        inputs_embeds instead of embed_input_ids(input_ids)) and 527-531 (layer 0 expands the
        2-D embedding to hc_mult copies). The token ids still drive everything else as without
        `embeds`: `gate.bias_vl` at image-token positions (the MoE is built with
        image_sentinel_lo, model.py 155, and routes on input_ids), dead Engram hashing and a
        shut Engram gate there (model.py 1017-1018, image_sentinel_mask on input_ids). vLLM casts
        the merged rows to the model dtype (utils.py 738); here they stay float32."""
        c, T, hc = self.c, len(ids), self.c["hc_mult"]
        gaps = Gaps()
        x = self.w["embed"][torch.tensor(ids)]
        if embeds is not None:
            rows, values = embeds
            x = x.clone()
            x[rows] = values.to(torch.float32)
        X = x.unsqueeze(1).repeat(1, hc, 1)
        state = {"kv": {}, "picks": None, "candidates": None}
        pre = None
        layers = []
        for l, lw in enumerate(self.w["layers"]):
            if "engram" in lw:
                ew = lw["engram"]
                image = c.get("image_token_id", -1)
                keep = (torch.tensor(ids) != image).to(torch.float32)
                X = engram(X, ew, engram_rows(self.eng, ew["index"], ids, image), self.eps, keep, self.nm)
            new_pre, post, comb = self.coeffs(X, lw["hc_attn"])
            a = X[:, 0] if pre is None else (pre.unsqueeze(-1) * X).sum(1)
            a = self.attention(l, rms_norm(a, lw["attn_norm"], self.eps), state, gaps)
            X = self.post(a, X, post, comb)
            pre = new_pre
            new_pre, post, comb = self.coeffs(X, lw["hc_ffn"])
            f = rms_norm((pre.unsqueeze(-1) * X).sum(1), lw["ffn_norm"], self.eps)
            X = self.post(self.moe(l, f, gaps, ids), X, post, comb)
            pre = new_pre
            if want_layers:
                layers.append(X.clone())
        h = rms_norm((pre.unsqueeze(-1) * X).sum(1), self.w["norm"], self.eps)
        return self.nm.bf16_input(h) @ self.w["head"].T, layers, gaps


# ---------------------------------------------------------------- files

def write_config(c, out_dir):
    text = dict(c)
    text["model_type"] = "deepseek_v41_text"
    text["compress_ratios"] = list(c["compress_ratios"])
    text.update(num_nextn_predict_layers=0, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                image_token_id=c.get("image_token_id", 129264), torch_dtype="bfloat16")
    top = {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "text_config": text,
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                "scale_fmt": "ue8m0", "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
                                "expert_dtype": "fp4"},
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(top, f, indent=2, sort_keys=True)

