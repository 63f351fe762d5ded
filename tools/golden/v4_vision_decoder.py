"""DeepSeek-V4-Flash-Vision-Exp's decoder (the V4 text model under a vision tower, flat
`vision_*` config keys) as vLLM 0.33 runs it, in float32 on the CPU: golden/official_v4.py's
port of DeepSeek's V4 `inference/model.py` with its quantisation off (`Numerics(quantise=False)`,
as make_dspark_v4_golden.py runs it), and the three things an image span changes, wrapped
around it here without touching official_v4.py. make_vision_v4_decoder_golden.py records its
goldens on the tiny-v4-exp fixture.

What differs from the text decoder, and the vLLM 0.33.0 source each part follows (wheel, paths
under vllm/):

  1. Input embeddings (`VisionModel.streams`): models/deepseek_v4/common/vl_model.py 278-320
     (embed_input_ids): the token embedding of every id, then every position whose id is one
     of the five sentinels [B, B+5) (common/mm_preprocess.py 52-86: roles IMAGE_START 0,
     IMAGE_PAD 1, IMAGE 2, IMAGE_NEW_LINE 3, IMAGE_END 4, id = B + role, B =
     IMAGE_SENTINEL_BASE_ID = 129257) and not an IMAGE slot takes the learned vector
     table[id - B] of [image_start, image_pad, image_pad, image_newline, image_end]
     (vl_model.py 294-310), and the IMAGE slots (`is_multimodal`: the placeholder's is_embed,
     ids == B + IMAGE, mm_preprocess.py 453-458) take the aligner rows in the block's order
     (_merge_multimodal_embeddings, vl_model.py 312-320; rows[perm], vl_model.py 223-235). The
     override is keyed by id, so it covers the leading compressor pad (IMAGE_PAD ids) and
     would cover a sentinel id anywhere (a decoded one included). The merged rows enter as
     inputs_embeds, before the hc expansion (nvidia/model.py 957-960). vLLM casts them to
     bf16; here they stay float32.
  2. MoE routing (`VisionMoE`): a position whose id lies in [B, B+5) selects its experts by
     top-k of score + `gate.bias_vl` (F32 [n_routed_experts], created on every MoE layer of a
     vision config, hash layers included: nvidia/model.py 277-320) instead of + `gate.bias`
     on a scored layer, and instead of `tid2eid[id]` on a hash layer; text positions route as
     before. The routing weights are the unbiased scores (the scoring function's output) at
     the chosen experts, renormalised when norm_topk_prob, times routed_scaling_factor: the
     bias only selects. Sources: model_executor/layers/fused_moe/router/
     fused_topk_bias_router.py 327-370 (the torch statement: row_bias = where(image,
     bias_vl, e_score_correction_bias or 0); on a hash layer topk(scores + row_bias) replaces
     the table's rows for image tokens only; weights = scores.gather(1, ids), renormalised,
     times routed_scaling_factor), router/dsv4_topk.py 57-102 (the sqrtsoftplus kernel:
     bias = where(is_image, bias_vl, bias) for the choice, weights = sqrt(softplus(logit)) of
     the picks / their sum * routed_scaling_factor), nvidia/model.py 96-123 and 486-515 (the
     MegaMoE gate: image_bias at image_token_mask rows, hash rows fixed only where not an
     image). The CUDA op for sqrtsoftplus with a hash table (_moe_C.topk_softplus_sqrt,
     fused_topk_bias_router.py 80-103) ships compiled only; it takes the same arguments and
     the three statements above agree. A vision checkpoint also ships `gate.bias` on hash
     layers (nvidia/model.py 301-310); it routes nothing.
  3. Sliding window in prefill (`VisionAttention.window_idxs`): v1/attention/backends/mla/
     sparse_swa.py 998-1040 (_compute_image_visibility_kernel: for a query at pos inside an
     image range [s, e], left = min(pos - s, M - 1), right = min(e - pos, M); 0/0 elsewhere)
     and 1052-1128 (_compute_swa_indices_and_lens_kernel: left_add = max(left - (W - 1), 0),
     window = [max(pos - (W - 1) - left_add, 0), pos + right], inclusive), restated by
     models/deepseek_v4/common/ops/cache_utils.py 886-918 (combine_topk_swa_indices, the
     FlashMLA prefill: the compressed picks stay min((pos + 1) // ratio, top_k) causal
     entries, the indexer is untouched). W = sliding_window, M = max_image_tokens =
     config.vision_max_n_token (sparse_swa.py 483-493, models/deepseek_v4/attention.py
     228-234). The range [s, e] (v1/attention/backends/utils.py 78-110 with
     span_pad = COMPRESS_PAD_TO = 4, vl_model.py 129-130) is s = round_down(offset, 4) + 3,
     e = offset + length - 1, inclusive, where offset/length are the placeholder's
     (mm_preprocess.py 468-529: the placeholder starts at the leading compressor pad and
     counts it): s is the IMAGE_START slot, so the leading pad slots are NOT in the range and
     keep the plain window; e is the IMAGE_END slot. Decode rows keep the plain window
     (sparse_swa.py 686-688: spans are prefilled whole); every layer's window widens (SWA,
     CSA and HCA layers alike), nothing else in attention changes.

Here the whole prompt is one prefill (start_pos 0: every span inside it, as vLLM's scheduler
guarantees, see make_vision_v4_decoder_golden.py), then decode runs one token per call on
model.py's state buffers, unchanged.

Margins: besides official_v4's absolute router/indexer margins (`gaps["router"]`,
`gaps["indexer"]`), every selection's margin relative to the largest |value| of its row is
kept in `gaps["router_rel"]` / `gaps["indexer_rel"]`.
"""

import math

import torch

from golden.official_v4 import Attention, Indexer, Model, MoE, head
from golden.primitives import rope
from golden.quant_sim import FP4_BLOCK, hadamard
from golden.read import tensor

SENTINEL_BASE = 129257  # mm_preprocess.py 61
N_ROLES = 5
START, PAD, IMAGE, NEWLINE, END = range(N_ROLES)
PAD_TO = 4  # COMPRESS_PAD_TO


def rel_margin(values, k):
    """(absolute, relative) margin between the k-th and (k+1)-th largest of a 1-D tensor."""
    v = values.sort(descending=True).values
    gap = float(v[k - 1] - v[k])
    return gap, gap / max(float(values.abs().max()), 1e-30)


def image_range(offset, length):
    """The SWA-widening range [s, e] (inclusive) of a placeholder at `offset` of `length`
    slots, leading pad included (utils.py 92-94 with span_pad 4)."""
    return (offset // PAD_TO * PAD_TO + PAD_TO - 1, offset + length - 1)


def visibility(pos, ranges, max_image_tokens):
    """(left, right) of _compute_image_visibility_kernel (sparse_swa.py 1027-1039)."""
    left = right = 0
    for s, e in ranges:
        if s <= pos <= e:
            left = min(pos - s, max_image_tokens - 1)
            right = min(e - pos, max_image_tokens)
    return left, right


def prefill_window(pos, ranges, window, max_image_tokens):
    """(first, last) visible key position, inclusive, of a prefill query at `pos`
    (_compute_swa_indices_and_lens_kernel, sparse_swa.py 1096-1110; replay_start 0)."""
    left, right = visibility(pos, ranges, max_image_tokens)
    left_add = max(left - (window - 1), 0)
    return max(pos - (window - 1) - left_add, 0), pos + right


class VisionAttention(Attention):
    """official_v4's Attention with the prefill window widened inside image ranges
    (`image_ranges`, set per prefill call by VisionModel)."""

    image_ranges = ()
    max_image_tokens = 0

    def window_idxs(self, seqlen, start_pos):
        if start_pos > 0 or not self.image_ranges:
            return super().window_idxs(seqlen, start_pos)
        assert self.max_image_tokens > 0
        win = [prefill_window(t, self.image_ranges, self.c["window"], self.max_image_tokens)
               for t in range(seqlen)]
        width = max(hi - lo + 1 for lo, hi in win)
        m = torch.full((seqlen, width), -1, dtype=torch.int64)
        for t, (lo, hi) in enumerate(win):
            assert hi < seqlen, "an image range reaches past the prefill"
            m[t, :hi - lo + 1] = torch.arange(lo, hi + 1)
        return m


class VisionIndexer(Indexer):
    """official_v4's Indexer, unchanged, also recording relative margins."""

    def record_margin(self, scores, k):
        gap, rel = rel_margin(scores, k)
        self.gaps["indexer"] = min(self.gaps["indexer"], gap)
        self.gaps["indexer_rel"] = min(self.gaps["indexer_rel"], rel)


class VisionMoE(MoE):
    """official_v4's MoE with image-sentinel routing (module docstring, 2.); `bias_vl` and
    `lo` (the first sentinel id) are set by VisionModel (`bias_vl` None: the text model).
    `picks[kind]` = [image rows routed, image rows whose experts differ from what text
    routing would have picked] on hash / scored layers."""

    bias_vl = None
    lo = SENTINEL_BASE
    picks = None

    def __call__(self, x, ids):
        c, k = self.c, self.c["k"]
        scores = self.scores(x)
        image = (ids >= self.lo) & (ids < self.lo + N_ROLES)
        if self.bias_vl is None:
            image = torch.zeros_like(image)
        # Text rows: the table (hash layer) or top-k of score + bias (model.py's Gate).
        if self.hash:
            text_biased, text_idx = None, self.tid2eid[ids]
        else:
            text_biased = scores + self.bias
            text_idx = text_biased.topk(k, -1).indices
        idx, vl_biased = text_idx, None
        if image.any():
            # Image rows, every layer: top-k of score + bias_vl (fused_topk_bias_router.py 333-358).
            vl_biased = scores + self.bias_vl
            idx = torch.where(image.unsqueeze(-1), vl_biased.topk(k, -1).indices, text_idx)
        if k < c["experts"]:
            for r in range(x.size(0)):
                row = vl_biased[r] if image[r] else text_biased[r] if text_biased is not None else None
                if row is not None:
                    gap, rel = rel_margin(row, k)
                    self.gaps["router"] = min(self.gaps["router"], gap)
                    self.gaps["router_rel"] = min(self.gaps["router_rel"], rel)
        if self.picks is not None:
            kind = "hash" if self.hash else "scored"
            for r in torch.nonzero(image).flatten().tolist():
                self.picks[kind][0] += 1
                self.picks[kind][1] += int(set(idx[r].tolist()) != set(text_idx[r].tolist()))
        # The weights: the unbiased scores at the picks, renormalised, scaled (the bias only
        # selects; fused_topk_bias_router.py 364-370, dsv4_topk.py 86-102).
        return self.combine(x, scores, idx)


class VisionModel(Model):
    """The checkpoint in `d` (official layout, vision.safetensors beside it) as vLLM's V4
    vision variant runs its decoder; `sentinel_base` = B; `max_image_tokens` = M
    (vision_max_n_token). `vision=False` leaves every addition off (the plain text model;
    with it on and no sentinel ids in the prompt the results are the same)."""

    def __init__(self, d, max_len, nm, sentinel_base=SENTINEL_BASE, max_image_tokens=0, vision=True):
        super().__init__(d, max_len, nm)
        self.gaps.update(router_rel=math.inf, indexer_rel=math.inf)
        self.picks = {"hash": [0, 0], "scored": [0, 0]}
        self.lo, self.vision = sentinel_base, vision
        raw = self.raw
        if vision:
            self.table = torch.stack([tensor(raw, n) for n in (
                "image_start", "image_pad", "image_pad", "image_newline", "image_end")])
        for i, b in enumerate(self.blocks):
            b.attn.__class__ = VisionAttention
            b.attn.max_image_tokens = max_image_tokens
            if b.attn.indexer is not None:
                b.attn.indexer.__class__ = VisionIndexer
            b.ffn.__class__ = VisionMoE
            b.ffn.lo, b.ffn.picks = sentinel_base, self.picks
            if vision:
                b.ffn.bias_vl = tensor(raw, f"layers.{i}.ffn.gate.bias_vl")

    def inputs(self, ids, image_rows=None):
        """The input rows (module docstring, 1.): the token embeddings, the learned vector of
        its role at every sentinel id, the aligner rows (`image_rows` = (positions, values))
        at the IMAGE slots."""
        x = self.embed[ids].clone()
        if self.vision:
            sent = (ids >= self.lo) & (ids < self.lo + N_ROLES)
            x[sent] = self.table[ids[sent] - self.lo]
            if image_rows is not None:
                rows, values = image_rows
                assert bool((ids[rows] == self.lo + IMAGE).all()), "IMAGE rows must hold the IMAGE id"
                x[rows] = values
        else:
            assert image_rows is None
        return x

    def streams(self, ids, start_pos, image_rows=None, ranges=()):
        """The final residual streams. `image_rows`: see `inputs`; `ranges`: the prompt's
        image ranges [s, e] (prefill only; decode rows keep the plain window)."""
        assert self.vision or not ranges
        x = self.inputs(ids, image_rows)
        for b in self.blocks:
            b.attn.image_ranges = tuple(ranges) if start_pos == 0 else ()
        h = x.unsqueeze(1).repeat(1, self.c["hc"], 1)
        for b in self.blocks:
            h = b(h, start_pos, ids)
        for b in self.blocks:
            b.attn.image_ranges = ()
        return h

    def __call__(self, ids, start_pos, image_rows=None, ranges=()):
        return head(self.streams(ids, start_pos, image_rows, ranges), self.hc_head, self.norm, self.head,
                    self.c, self.nm)
