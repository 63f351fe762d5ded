"""The quantisation points of DeepSeek-V4's inference code, simulated in float32 (used by the
port in golden/official_v4.py).

What each part follows (DeepSeek-V4's `inference/kernel.py` and `inference/model.py`, as spec
docs/MODEL.md §2 and §5 state them):
  - `Numerics.act_quant_sim`, `Numerics.fp4_sim`: kernel.py's `act_quant`/`fp4_act_quant`
    (amax floors 1e-4 and 6·2^-126, power-of-two scale rounded up, clamp, round to nearest
    even onto e4m3 / e2m1, written back as `q·s`).
  - `hadamard`: `fast_hadamard_transform(x, scale=n^-0.5)` (Sylvester order).
  - `Numerics.linear`: model.py's `linear`: FP8/FP4-weight projections quantise their input
    with `act_quant(x, 128, ue8m0)` before `fp8_gemm`/`fp4_gemm`; BF16/F32 weights use a
    plain product.
  - `Numerics.bf16`: the KV cache's RoPE dims, stored as bf16 by model.py's `kv_cache`.
  - `Numerics.bf16_input`: the input of a product whose weight is BF16/F32 in model.py (or
    dequantised to bf16 there: wo_a), which model.py holds in bf16 (vLLM and SGLang too).

Quantisation blocks may be short at the end of a row (the tiny checkpoints' widths are not
multiples of 128/64); such a block is quantised with its own amax. model.py asserts whole
blocks; V4's real shapes always have them.
"""

import torch

ACT_BLOCK, KV_BLOCK, FP4_BLOCK = 128, 64, 32
# Roundings onto FP8/FP4 whose input lies within FRAGILE_REL (relative) of a rounding
# boundary: a different summation order upstream (ours is not torch's) can send such a value
# the other way, one FP8/FP4 step, and a long prompt has many. Counted per prompt; a prompt
# with more than FRAGILE_MAX is compared loosely, like one with a near-tied selection
# (measured: prompts with up to ~50 such roundings, up to 200 tokens here, agree with
# deepinfer to 3e-4; the 600- and 700-token ones, with 100+, drift by up to 3.4e-2 once a
# flipped rounding tips a router or indexer choice).
FRAGILE_REL = 1e-6
FRAGILE_MAX = 64
# The bf16 roundings of the dense products' inputs are far finer (a step of 2^-8 relative),
# so many more inputs lie near a boundary, and one that goes the other way moves its value
# by 2^-9, often enough to tip an FP8 rounding downstream (a step of 2^-4): a few percent on
# the logits from then on. Counted, for the record, at 2^-22 relative (a few f32 ulps);
# whether they tip anything is what make_official_golden.py's `order_robust` measures, by
# moving every such input by an ulp (`Numerics(jitter=…)`).
BF16_FRAGILE_REL = 2.0 ** -22

FP4_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def pow2_ceil(s):
    m, e = torch.frexp(s)  # s = m·2^e, m in [0.5, 1)
    return torch.where(m == 0.5, s, torch.ldexp(torch.ones_like(s), e))


def blocks(x, block, fn):
    """Applies `fn` to each `block`-wide slice of the last dim (the last may be short)."""
    parts = [fn(x[..., i:i + block]) for i in range(0, x.size(-1), block)]
    return torch.cat(parts, dim=-1)


def e2m1_rne(a):
    """Nearest e2m1 magnitude of a ≥ 0 (≤ 6), ties to the even code."""
    d = (a.unsqueeze(-1) - FP4_GRID).abs()
    tied = d == d.amin(-1, keepdim=True)
    idx = torch.arange(8)
    even = torch.where(tied & (idx % 2 == 0), idx, 99).amin(-1)
    any_ = torch.where(tied, idx, 99).amin(-1)
    return FP4_GRID[torch.where(even < 99, even, any_)]


def hadamard(x):
    n = x.size(-1)
    h = torch.ones(1, 1)
    while h.size(0) < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (x @ h) * (n ** -0.5)


class Numerics:
    """Where the port rounds, and a count of the fragile roundings since the last reset.

    `quantise=False` (make_official_golden.py --plain, and the V4 DSpark target) skips every
    quantisation point: the port must then reproduce HF's float32 goldens. One instance is
    shared by all modules of a model, so a run's `fragile` counts every rounding it made."""

    def __init__(self, quantise, jitter=None):
        self.quantise = quantise
        self.fragile = 0
        self.bf16_fragile = 0
        # A torch.Generator: every bf16 input moved by up to two f32 ulps first, as another
        # summation order upstream could leave it (make_official_golden.py's `order_robust`).
        self.jitter = jitter

    def count_fragile(self, y, q, step):
        """`y` rounded to `q` on a grid of spacing `step` at y: distance to the nearest boundary."""
        d = ((y - q).abs() - step / 2).abs()
        self.fragile += int((d < FRAGILE_REL * y.abs()).sum())

    def act_quant_sim(self, x, block, floor=1e-4):
        if not self.quantise:
            return x

        def one(b):
            amax = b.abs().amax(-1, keepdim=True).clamp_min(floor)
            s = pow2_ceil(amax / 448.0)
            y = (b / s).clamp(-448.0, 448.0)
            q = y.to(torch.float8_e4m3fn).float()
            e = torch.floor(torch.log2(y.abs().clamp_min(2.0 ** -6)))
            self.count_fragile(y, q, torch.exp2(e - 3))
            return q * s
        return blocks(x, block, one)

    def fp4_sim(self, x, block):
        if not self.quantise:
            return x

        def one(b):
            amax = b.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0 ** -126)
            s = pow2_ceil(amax / 6.0)
            y = (b / s).clamp(-6.0, 6.0)
            q = torch.sign(y) * e2m1_rne(y.abs())
            a = y.abs()
            self.count_fragile(y, q, torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)))
            return q * s
        return blocks(x, block, one)

    def bf16(self, x):
        """The KV cache's RoPE dims: model.py's kv_cache is bf16 (its other dims are FP8 values)."""
        return x.to(torch.bfloat16).float() if self.quantise else x

    def bf16_input(self, x):
        """The input of a BF16/F32-weight product (compressor wkv/wgate, indexer weights_proj,
        router gate, wo_a, head): bf16 in model.py, so rounded to bf16 (nearest even); counts
        the roundings within BF16_FRAGILE_REL of a boundary in `bf16_fragile`."""
        if not self.quantise:
            return x
        x = self.jittered(x)
        q = x.to(torch.bfloat16).float()
        step = torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(2.0 ** -126))) - 7)
        d = ((x - q).abs() - step / 2).abs()
        self.bf16_fragile += int((d < BF16_FRAGILE_REL * x.abs()).sum())
        return q

    def jittered(self, x):
        """`x` with every value moved by up to two f32 ulps when a `jitter` generator is set."""
        if self.jitter is None:
            return x
        ulps = torch.randint(-2, 3, x.shape, generator=self.jitter).float()
        return x + ulps * torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(2.0 ** -126))) - 23)

    def linear(self, x, w, quant):
        """x @ w.T, with the input quantised first when `quant` (an FP8/FP4 weight)."""
        if quant:
            x = self.act_quant_sim(x, ACT_BLOCK)
        return x @ w.T


# DeepSeek-V4.1 as vLLM 0.33 serves it on SM100 (docs/MODEL.md §8.8): MXFP8 in 32-blocks.
MX_BLOCK = 32
# FlashInfer's `mxfp8_quantize` has no amax floor (an all-zero block quantises to zeros): the
# smallest normal scale stands in for one, which gives the same values for every block.
MX_FLOOR = 448.0 * 2.0 ** -126


class V41Numerics(Numerics):
    """The quantisation points of DeepSeek-V4.1 as vLLM 0.33 serves it on SM100 (the
    default `DeepseekV4MegaAttnAttention` path, the `fp8_ds_mla` records and FP8 indexer
    keys), for golden/v41.py; paths under the wheel's `vllm/models/`:

      - `mxfp8`: every input of an MXFP8/MXFP4-weight product (wq_a and wkv, wq_b and the
        indexer's wq_b on the q-LoRA after q_norm, wo_a on the attention output after the
        inverse RoPE, wo_b on wo_a's output, every expert's w1/w3 and w2, Engram's wkv on
        its table rows): 32-blocks, scale 2^ceil(log2(amax/448)), round to nearest even
        (deepseek_v41/quant_config.py 221-243 and 261: kMxfp8Dynamic; the scale rule in
        deepseek_v41/common/ops/query_quant.py 66-78; wo_a/wo_b in
        deepseek_v41/nvidia/flash_mla_mega_attn.py 3-10 and 214-265; the expert GEMMs in
        deepseek_v41/nvidia/specialized_decode/moe/routed_expert_gemm_cute.py 938-955).
      - `kv_record`: window rows and compressed entries, all `head_dim` dims after RoPE,
        FP8 in 32-blocks with the cache writers' amax floor 1e-4 (deepseek_v41/attention.py
        130-138, common/ops/fused_compress_quant_cache.py 426-477, common/ops/cache_utils.py
        184-240): the attention reads them back, the current token's own row included.
      - `index_fp8`: an indexer query head or key, FP8 with one scale over its whole
        `index_head_dim` row, floor 1e-4 (common/ops/indexer_k_store.py 243-266;
        deepseek_v4/common/ops/fused_indexer_q.py 140-187); no Hadamard rotation.
      - `bf16_input` as for V4: the compressors' wkv/wgate, the indexer's weights_proj and
        wk, the router and the head read bf16 activations.
      - The experts' routing weights scale w2's output, after its input was quantised
        (`weights_after_down`: the MoE finalize), not w2's input as in DeepSeek's V4 code.

    Like the V4 port, activations between these points stay f32 (vLLM carries the residual
    and most outputs in bf16), and the indexer's scores stay f32 (vLLM's come back bf16)."""

    @property
    def weights_after_down(self):
        # Unquantised, the plain goldens keep DeepSeek's order (one f32 rounding apart).
        return self.quantise

    def act_quant_sim(self, x, block, floor=1e-4):
        # A jitter moves the FP8 inputs too: V4.1's tiny goldens make thousands of FP8
        # roundings, and whether one near a boundary tips a result is what `order_robust` asks.
        return super().act_quant_sim(self.jittered(x) if self.quantise else x, block, floor)

    def mxfp8(self, x):
        return self.act_quant_sim(x, MX_BLOCK, floor=MX_FLOOR)

    def kv_record(self, x):
        return self.act_quant_sim(x, MX_BLOCK)

    def index_fp8(self, x):
        return self.act_quant_sim(x, x.size(-1))
