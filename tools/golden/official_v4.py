"""DeepSeek-V4 as DeepSeek's own inference code computes it, on the CPU: a port, written for
this project, of DeepSeek-V4's `inference/model.py` (DeepSeek-V4-Flash/Pro release) with the
quantisation of its `inference/kernel.py` simulated by golden/quant_sim.py (docs/MODEL.md §2 and §5
describe both). make_official_golden.py records its goldens;
make_dspark_v4_golden.py runs it, quantisation off, as the DSpark target.

Which source each part follows:
  - `Model`, `Block`, `Attention`, `Compressor`, `Indexer`, `MoE` (model.py's `Gate`, `Expert`,
    `MoE`), `head`: model.py, statement for statement (prefill at start_pos 0, then one token
    per call with the same state buffers: the window ring, `kv_state`/`score_state`, the entry
    caches), batch size 1, without the tensor-parallel collectives.
  - Which projections are FP8/FP4 (`Numerics.linear` quantises their input) follows model.py's
    `Linear` dtypes for an FP8 checkpoint, whatever the file at hand stores: wq_a, wq_b, wkv,
    wo_b, the indexer's wq_b, every expert and the shared expert (`wo_a` is dequantised to
    bf16 and used in a plain einsum there; compressor, router, indexer weights_proj and head
    are BF16/F32). The inputs of those BF16/F32-weight products are rounded to bf16
    (`Numerics.bf16_input`).
  - `Mtp`: model.py's MTPBlock, its FP8 e_proj/h_proj included.
  - `hc_split_sinkhorn`, `sparse_attn` (golden/primitives.py): kernel.py's as docs/MODEL.md §3.3 and
    §3.4 state them.

Deliberate differences from DeepSeek's code, also stated in deepinfer's `numerics.rs`:
  - Activations between the quantisation points are float32 here; DeepSeek's code holds them
    in bf16 because it runs on bf16 hardware, and most of those roundings are not part of
    the model (vLLM and SGLang place them differently). So most `.to(dtype)`s of model.py are
    no-ops here, and the indexer scores (bf16 there) are float32. Two bf16 roundings are
    kept: the inputs of the BF16/F32-weight products (compressor wkv/wgate, indexer
    weights_proj, router gate, wo_a, head), which model.py holds in bf16 and vLLM/SGLang
    also feed bf16; and the KV vectors' RoPE dims, because the KV cache (model.py's
    `kv_cache` buffers, vLLM's 584-byte record) stores them as bf16.
  - Quantisation blocks may be short at the end of a row (see golden/quant_sim.py).

Every module takes the model's `Numerics` (`nm`): whether to quantise (off: the port must
reproduce HF's float32 goldens) and the count of fragile roundings.
"""

import json
import os

import torch
import torch.nn.functional as F

from golden.paths import GOLDEN
from golden.primitives import (freqs_cis, hc_head_collapse, hc_mixes, hc_post, hc_split_sinkhorn, rms_norm,
                               rope, sparse_attn)
from golden.quant_sim import FP4_BLOCK, KV_BLOCK, Numerics, hadamard
from golden.read import read_shards, tensor

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


# ---------------------------------------------------------------- the model (model.py)


class Compressor:
    """model.py's Compressor: pools every `ratio` tokens' kv (gated softmax over the group,
    overlapping windows of two groups at ratio 4) into one cache entry, then norm, RoPE and
    the cache's quantisation (FP4 after a Hadamard rotation for the indexer's keys)."""

    def __init__(self, c, raw, prefix, ratio, head_dim, rotate, fc, max_len, nm):
        self.c, self.ratio, self.d, self.rotate, self.fc, self.nm = c, ratio, head_dim, rotate, fc, nm
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
        x = self.nm.bf16_input(x)  # float32 weights, bf16 input, no quantisation (model.py)
        kv = x @ self.wkv.T
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
            kv = self.nm.fp4_sim(hadamard(kv), FP4_BLOCK)
        else:
            kv = torch.cat([self.nm.act_quant_sim(kv[:, :-rd], KV_BLOCK), self.nm.bf16(kv[:, -rd:])], -1)
        if start_pos == 0:
            self.cache[:seqlen // ratio] = kv
        else:
            self.cache[start_pos // ratio] = kv[0]
        return kv


class Indexer:
    """model.py's Indexer: scores the compressed entries for each query (FP4 queries and keys
    after a Hadamard rotation) and picks the top `index_topk`; records the smallest margin."""

    def __init__(self, c, raw, prefix, fc, max_len, gaps, nm):
        self.c, self.fc, self.gaps, self.nm = c, fc, gaps, nm
        self.wq_b = tensor(raw, prefix + ".wq_b.weight")
        self.weights_proj = tensor(raw, prefix + ".weights_proj.weight")
        self.compressor = Compressor(c, raw, prefix + ".compressor", 4, c["index_dim"], True, fc, max_len, nm)

    def __call__(self, x, qr, start_pos, offset):
        c = self.c
        seqlen, h, hd, rd = x.size(0), c["index_heads"], c["index_dim"], c["rd"]
        end = start_pos + seqlen
        fc = self.fc[start_pos:end]
        q = self.nm.linear(qr, self.wq_b, True).unflatten(-1, (h, hd))
        q = torch.cat([q[..., :-rd], rope(q[..., -rd:], fc)], -1)
        q = self.nm.fp4_sim(hadamard(q), FP4_BLOCK)
        self.compressor(x, start_pos)
        weights = (self.nm.bf16_input(x) @ self.weights_proj.T) * (hd ** -0.5 * h ** -0.5)
        keys = self.compressor.cache[:end // 4]
        score = (torch.einsum("shd,td->sht", q, keys).relu() * weights.unsqueeze(-1)).sum(1)
        visible = (torch.arange(start_pos, end) + 1) // 4
        score = score.masked_fill(torch.arange(end // 4).view(1, -1) >= visible.view(-1, 1), float("-inf"))
        k = min(c["index_topk"], end // 4)
        top = score.topk(k, dim=-1)
        for i in range(seqlen):  # the margin at each query that has more entries than picks
            if visible[i] > k:
                self.record_margin(score[i, :visible[i]], k)
        idxs = top.indices
        return torch.where(idxs >= visible.view(-1, 1), -1, idxs + offset)

    def record_margin(self, scores, k):
        """The gap between the k-th and (k+1)-th of a query's visible entry scores."""
        v = scores.sort(descending=True).values
        self.gaps["indexer"] = min(self.gaps["indexer"], float(v[k - 1] - v[k]))


class Attention:
    """model.py's Attention: the sliding window (a ring of `window` rows) plus, on compressed
    layers, the compressor's entries (all of them at ratio > 4, the indexer's picks at 4)."""

    def __init__(self, c, raw, prefix, layer, max_len, gaps, nm):
        self.c, self.ratio, self.nm = c, c["ratios"][layer], nm
        self.fc = freqs_cis(c, self.ratio > 0, max_len)
        w = lambda n: tensor(raw, f"{prefix}.{n}")
        self.sink = w("attn_sink")
        self.wq_a, self.q_norm, self.wq_b = w("wq_a.weight"), w("q_norm.weight"), w("wq_b.weight")
        self.wkv, self.kv_norm = w("wkv.weight"), w("kv_norm.weight")
        self.wo_a, self.wo_b = w("wo_a.weight"), w("wo_b.weight")
        self.compressor = self.indexer = None
        if self.ratio:
            self.compressor = Compressor(c, raw, prefix + ".compressor", self.ratio, c["head_dim"], False, self.fc,
                                         max_len, nm)
            if self.ratio == 4:
                self.indexer = Indexer(c, raw, prefix + ".indexer", self.fc, max_len, gaps, nm)
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

    def qkv(self, x, fc):
        """The low-rank query (also the indexer's input), the per-head RMS-normed RoPE'd
        queries, and this token's KV row in the cache's precision."""
        c, nm = self.c, self.nm
        h, hd, rd, eps = c["heads"], c["head_dim"], c["rd"], c["eps"]
        qr = rms_norm(nm.linear(x, self.wq_a, True), self.q_norm, eps)
        q = nm.linear(qr, self.wq_b, True).unflatten(-1, (h, hd))
        q = q * torch.rsqrt(q.square().mean(-1, keepdim=True) + eps)
        q = torch.cat([q[..., :-rd], rope(q[..., -rd:], fc)], -1)
        kv = rms_norm(nm.linear(x, self.wkv, True), self.kv_norm, eps)
        kv = torch.cat([nm.act_quant_sim(kv[:, :-rd], KV_BLOCK), nm.bf16(rope(kv[:, -rd:], fc))], -1)
        return qr, q, kv

    def keys(self, x, kv, start_pos):
        """Stores the new KV rows in the window ring and runs the compressor; returns the rows
        the indices point into (prefill: the prompt's rows then its entries; decode: the ring
        then the entry cache)."""
        seqlen, win = x.size(0), self.c["window"]
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
            return all_kv
        self.ring[start_pos % win] = kv[0]
        all_kv = self.ring
        if self.ratio:
            self.compressor(x, start_pos)
            all_kv = torch.cat([self.ring, self.compressor.cache], 0)
        return all_kv

    def __call__(self, x, start_pos):
        c = self.c
        seqlen, hd, rd, win = x.size(0), c["head_dim"], c["rd"], c["window"]
        fc = self.fc[start_pos:start_pos + seqlen]
        qr, q, kv = self.qkv(x, fc)
        idxs = self.window_idxs(seqlen, start_pos)
        if self.ratio:
            offset = seqlen if start_pos == 0 else win
            if self.indexer is not None:
                cidx = self.indexer(x, qr, start_pos, offset)
            else:
                cidx = self.compress_idxs(seqlen, start_pos, offset)
            idxs = torch.cat([idxs.expand(seqlen, -1), cidx.expand(seqlen, -1)], -1)
        o = sparse_attn(q, self.keys(x, kv, start_pos), self.sink, idxs.expand(seqlen, -1), hd ** -0.5)
        o = torch.cat([o[..., :-rd], rope(o[..., -rd:], fc, inverse=True)], -1)
        g = c["groups"]
        o = o.reshape(seqlen, g, -1)
        wo_a = self.wo_a.view(g, c["o_lora"], -1)
        # dequantised (bf16) weight, bf16 input, no activation quant (model.py)
        o = torch.einsum("sgd,grd->sgr", self.nm.bf16_input(o), wo_a)
        return self.nm.linear(o.flatten(1), self.wo_b, True)


class MoE:
    """model.py's Gate (hash or scored routing; records the smallest top-k margin), Expert
    (SwiGLU with the swiglu_limit clamp) and MoE (routed experts plus the shared one)."""

    def __init__(self, c, raw, prefix, layer, gaps, nm):
        self.c, self.gaps, self.nm = c, gaps, nm
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
        gate = self.nm.linear(x, *e["w1"])
        up = self.nm.linear(x, *e["w3"])
        if lim > 0:
            up = up.clamp(-lim, lim)
            gate = gate.clamp(max=lim)
        h = F.silu(gate) * up
        if weights is not None:
            h = weights * h
        return self.nm.linear(h, *e["w2"])

    def scores(self, x):
        """The gate's scores of every expert, `[T, experts]`, before any bias."""
        c = self.c
        scores = self.nm.bf16_input(x) @ self.gate.T  # the experts below read x unrounded
        if c["score"] == "softmax":
            return scores.softmax(-1)
        if c["score"] == "sigmoid":
            return scores.sigmoid()
        return F.softplus(scores).sqrt()

    def combine(self, x, scores, idx):
        """The picked experts `idx` weighted by their unbiased `scores`, plus the shared one."""
        c = self.c
        w = scores.gather(1, idx)
        if c["renorm"]:
            w = w / w.sum(-1, keepdim=True)
        w = w * c["route_scale"]
        y = torch.zeros_like(x)
        for e in range(c["experts"]):
            rows, slot = torch.where(idx == e)
            if len(rows):
                y[rows] += self.run_expert(self.experts[e], x[rows], w[rows, slot, None])
        return y + self.run_expert(self.shared, x)

    def __call__(self, x, ids):
        c = self.c
        scores = self.scores(x)
        if self.hash:
            idx = self.tid2eid[ids]
        else:
            biased = scores + self.bias
            idx = biased.topk(c["k"], -1).indices
            if c["k"] < c["experts"]:
                v = biased.sort(-1, descending=True).values
                self.gaps["router"] = min(self.gaps["router"], float((v[:, c["k"] - 1] - v[:, c["k"]]).min()))
        return self.combine(x, scores, idx)


class Block:
    """model.py's Block: attention and MoE, each between its own mHC pre and post."""

    def __init__(self, c, raw, layer, max_len, gaps, nm, prefix=None):
        p = prefix or f"layers.{layer}"
        self.c = c
        self.attn = Attention(c, raw, p + ".attn", layer, max_len, gaps, nm)
        self.ffn = MoE(c, raw, p + ".ffn", layer, gaps, nm)
        self.attn_norm, self.ffn_norm = tensor(raw, p + ".attn_norm.weight"), tensor(raw, p + ".ffn_norm.weight")
        self.hc = {s: [tensor(raw, f"{p}.hc_{s}_{n}") for n in ["fn", "scale", "base"]] for s in ["attn", "ffn"]}

    def hc_pre(self, x, fn, scale, base):
        c = self.c
        mixes = hc_mixes(x, fn, c["eps"])
        pre, post, comb = hc_split_sinkhorn(mixes, scale, base, c["hc"], c["sinkhorn"], c["hc_eps"])
        return (pre.unsqueeze(-1) * x).sum(1), post, comb

    # golden/primitives.py's hc_post, kept reachable as Block.hc_post (model.py's name).
    hc_post = staticmethod(hc_post)

    def __call__(self, x, start_pos, ids):
        r = x
        a, post, comb = self.hc_pre(x, *self.hc["attn"])
        a = self.attn(rms_norm(a, self.attn_norm, self.c["eps"]), start_pos)
        x = self.hc_post(a, r, post, comb)
        r = x
        f, post, comb = self.hc_pre(x, *self.hc["ffn"])
        f = self.ffn(rms_norm(f, self.ffn_norm, self.c["eps"]), ids)
        return self.hc_post(f, r, post, comb)


def head(h, hc_head, norm, weight, c, nm):
    """model.py's ParallelHead (hc_head, norm, f32 logits), at every position; the normed
    input is bf16 there (`nm.bf16_input`)."""
    y = hc_head_collapse(h, hc_head, c["eps"], c["hc_eps"])
    return nm.bf16_input(rms_norm(y, norm, c["eps"])) @ weight.T


class Model:
    """The checkpoint in directory `d` (official layout), with state buffers for `max_len`
    positions; `nm` is shared by every module (see Numerics)."""

    def __init__(self, d, max_len, nm):
        self.nm = nm
        self.c = c = load_config(d)
        self.raw = raw = read_shards(d)
        self.gaps = {"router": float("inf"), "indexer": float("inf")}
        self.embed = tensor(raw, "embed.weight")
        self.blocks = [Block(c, raw, i, max_len, self.gaps, nm) for i in range(c["layers"])]
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
        return head(self.streams(ids, start_pos), self.hc_head, self.norm, self.head, self.c, self.nm)


class Mtp:
    """model.py's MTPBlock: e = enorm(embed(next token)), x = hnorm(h) per stream,
    x = e_proj(e) + h_proj(x) (both FP8 projections: quantised inputs), then a Block at layer
    id n_layers (compress_ratios[n_layers] = 0: sliding window; a scored router), and the
    shared embedding and head behind the block's own hc_head and norm."""

    def __init__(self, model, max_len):
        c, raw, p = model.c, model.raw, "mtp.0"
        self.model, self.c = model, c
        self.block = Block(c, raw, c["layers"], max_len, model.gaps, model.nm, prefix=p)
        self.e_proj, self.h_proj = tensor(raw, p + ".e_proj.weight"), tensor(raw, p + ".h_proj.weight")
        self.enorm, self.hnorm = tensor(raw, p + ".enorm.weight"), tensor(raw, p + ".hnorm.weight")
        self.norm = tensor(raw, p + ".norm.weight")
        self.hc_head = [tensor(raw, f"{p}.hc_head_{n}") for n in ["fn", "scale", "base"]]

    def __call__(self, h, start_pos, ids):
        eps = self.c["eps"]
        e = rms_norm(self.model.embed[ids], self.enorm, eps)
        nm = self.model.nm
        x = nm.linear(e, self.e_proj, True).unsqueeze(1) + nm.linear(rms_norm(h, self.hnorm, eps), self.h_proj, True)
        x = self.block(x, start_pos, ids)
        return x, head(x, self.hc_head, self.norm, self.model.head, self.c, nm)


# ---------------------------------------------------------------- the plain check


def check_plain(cfg, d, hf):
    """The port without quantisation against HF's float32 logits (the last position) of
    config `cfg`'s golden.safetensors (`hf`: its golden.json) and mtp_golden.safetensors; `d`
    is the checkpoint directory."""
    nm = Numerics(quantise=False)
    want = read_shards(os.path.join(GOLDEN, cfg), only="golden.safetensors")
    for p in hf["prompts"]:
        model = Model(d, len(p["ids"]) + 1, nm)
        with torch.no_grad():
            got = model(torch.tensor(p["ids"]), 0)[-1]
        ref = tensor(want, f"p{p['index']}.last_logits")
        diff = float((got - ref).abs().max() / ref.abs().max().clamp_min(1.0))
        print(f"{cfg} p{p['index']} plain port vs HF: max relative diff {diff:.2e}")
        assert diff < 1e-4, "the port disagrees with HF without quantisation"
    hf_mtp = read_shards(os.path.join(GOLDEN, cfg), only="mtp_golden.safetensors")
    ids = [int(v) for v in tensor(hf_mtp, "prompt_ids")]
    model = Model(d, len(ids) + 1, nm)
    with torch.no_grad():
        h = model.streams(torch.tensor(ids), 0)
        nxt = int(tensor(hf_mtp, "next_token")[0])
        _, logits = Mtp(model, len(ids) + 1)(h, 0, torch.tensor(ids[1:] + [nxt]))
    ref = tensor(hf_mtp, "mtp_logits")
    diff = float((logits - ref).abs().max() / ref.abs().max().clamp_min(1.0))
    print(f"{cfg} MTP block, plain port vs HF: max relative diff {diff:.2e}")
    assert diff < 1e-4, "the MTP port disagrees with HF without quantisation"
