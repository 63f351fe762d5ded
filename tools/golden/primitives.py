"""The arithmetic that DeepSeek-V4's and V4.1's references share, in float32: RMSNorm, the
rotary tables and rotation, the mHC (manifold-constrained hyper-connection) mixing, and sink
attention over picked KV rows.

Sources: DeepSeek-V4's `inference/model.py` (`precompute_freqs_cis`, `apply_rotary_emb`,
`RMSNorm`, `Block.hc_pre`/`hc_post`, `ParallelHead.hc_head`) and the kernels of its
`inference/kernel.py` (`hc_split_sinkhorn`, `sparse_attn`) as docs/MODEL.md §3.3 and
§3.4 state them. vLLM 0.33's V4.1 (`vllm/models/deepseek_v41/`) uses the same
pieces: the V4.1 reference (golden/v41.py) calls these.
"""

import math

import torch


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps))


# ---------------------------------------------------------------- rotary embedding


def freqs_cis(c, compressed, seqlen):
    """model.py's precompute_freqs_cis: the main table (`theta`, no YaRN) or the compressed
    layers' one (`ctheta`, YaRN when `original` > 0), as complex rotations [seqlen, rd/2].
    `c` holds rd, theta, ctheta, original, factor, beta_fast, beta_slow."""
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
    """Rotates the trailing pairs of x (last dim even) by fc [s, rd/2]; x [s, ..., rd]
    (GPT-J interleaved pairs, as model.py's apply_rotary_emb)."""
    xc = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)).contiguous())
    if inverse:
        fc = fc.conj()
    shape = [fc.size(0)] + [1] * (xc.dim() - 2) + [fc.size(1)]
    return torch.view_as_real(xc * fc.view(shape)).flatten(-2)


def rope_tail(x, fc, rd, inverse=False):
    """RoPE on the trailing `rd` dims of x only (the rest passes through)."""
    return torch.cat([x[..., :-rd], rope(x[..., -rd:], fc, inverse)], -1)


# ---------------------------------------------------------------- mHC


def hc_mixes(x, fn, eps):
    """The mHC mixing logits of streams x [s, hc, D]: fn · flat(x), RMS-scaled (model.py's
    hc_pre and hc_head compute them the same way)."""
    flat = x.flatten(1)
    return (flat @ fn.T) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)


def hc_split_sinkhorn(mixes, scale, base, hc, iters, eps):
    """kernel.py's hc_split_sinkhorn: (pre, post, comb) from the mixing logits, comb made
    doubly stochastic by `iters` Sinkhorn normalisations."""
    pre = torch.sigmoid(mixes[..., :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(mixes[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = mixes[..., 2 * hc:].unflatten(-1, (hc, hc)) * scale[2] + base[2 * hc:].view(hc, hc)
    comb = comb.softmax(-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


def hc_post(f, residual, post, comb):
    """model.py's hc_post: the sublayer output f [s, D] spread by `post`, plus the residual
    streams [s, hc, D] mixed by `comb`."""
    return post.unsqueeze(-1) * f.unsqueeze(1) + (comb.unsqueeze(-1) * residual.unsqueeze(2)).sum(1)


def hc_head_collapse(h, hc_head, eps, hc_eps):
    """model.py's ParallelHead.hc_head: streams [s, hc, D] to one hidden [s, D] (before the
    final norm), `hc_head` = (fn, scale, base)."""
    fn, scale, base = hc_head
    pre = torch.sigmoid(hc_mixes(h, fn, eps) * scale + base) + hc_eps
    return (pre.unsqueeze(-1) * h).sum(1)


# ---------------------------------------------------------------- attention


def sparse_attn(q, kv, sink, idxs, scale):
    """kernel.py's sparse_attn: q [s, h, d], kv [n, d], idxs [s, k] (−1 = none): softmax with
    a zero-value sink."""
    valid = idxs >= 0
    sel = kv[idxs.clamp_min(0)]  # [s, k, d]
    scores = torch.einsum("shd,skd->shk", q, sel) * scale
    scores = scores.masked_fill(~valid.unsqueeze(1), float("-inf"))
    m = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - m)
    den = e.sum(-1) + torch.exp(sink.view(1, -1) - m.squeeze(-1))
    return torch.einsum("shk,skd->shd", e / den.unsqueeze(-1), sel)
