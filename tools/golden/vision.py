"""The DeepSeek-V4 (Vision-Exp) and V4.1 vision tower on the CPU, in float32: image
preprocessing, the ViT, the aligner and the image span the decoder reads. No reference runs it
on a CPU (vLLM's tower needs its GPU layers), so this is a port; make_vision_golden.py records
its goldens on the tiny configs.

Which source each part follows (vLLM 0.33.0 wheel, paths under vllm/):

  - Config (`VisionConfig`): V4 reads flat `vision_*` keys off the top-level config
    (models/deepseek_v4/common/mm_preprocess.py 242-248, common/vision.py 81-372); V4.1 nests
    them under `vision_config` with HF names and these defaults
    (transformers_utils/configs/deepseek_v41.py 52-62): num_hidden_layers 0, hidden_size 1024,
    num_attention_heads 16, intermediate_size 2816, patch_size 14, rope_theta 10000,
    downsample_ratio 3, max_image_tokens 1024, min_pixels 295936, max_wh_ratio None.
  - Preprocessing (`load_image`): deepseek_v4/common/mm_preprocess.py 152-192 and
    deepseek_v41/common/mm_preprocess.py 121-161 (the same function): RGB, clamp a too-wide
    width to height·max_wh_ratio (a float from then on), scale a source under min_pixels up by
    sqrt(min_pixels/(w·h)) (int() truncation), ceil both sides to patch multiples, then the
    version's safe_resize; the canvas is `image.resize` (BICUBIC, a stretch) when the SOURCE
    is at least max_wh_ratio wide, else `ImageOps.pad` onto (127,127,127). Pixels /255,
    (x-0.5)/0.5, rounded to bfloat16, cut into (n_vit_h·n_vit_w, 3, p, p) in row-major
    patch order.
      V4 (v4 mm_preprocess.py 90-149): grid_tokens counts the N-layout block (a pad row when
      n_llm_h is odd, two pads when the row pairs hold an odd count); safe_resize keeps
      COMPRESS_PAD_TO-1 = 3 tokens of max_n_token for the compressor pad and, while the block
      does not fit, re-solves with a budget that drops by one each try (the first try uses the
      full reduced budget). solve_resize_ratio: a single column when max_w_float < 1, two rows
      when max_h_float < 2, else an aspect-preserving beta with an even row count.
      V4.1 (v41 mm_preprocess.py 71-118): a span costs n_llm_h·(n_llm_w+1)+2; one solve when
      it does not fit: a single column when max_w_float < 1, a single row when max_h_float < 1,
      else the aspect-preserving beta (no even-row rule); asserted to fit.
  - ViT (`vit`, deepseek_v4/common/vision.py 44-227; V4.1 imports the same classes): patch
    embed = linear with bias on the flattened (3,p,p) patch; blocks x + attn(norm1 x),
    x + mlp(norm2 x); RMSNorm eps 1e-6 in float32; attention: merged wqkv with bias (q,k,v
    chunks), heads of D/n_heads, 2-D RoPE (`rope_cos_sin`/`rotate`: rope_dim = head_dim/2
    frequencies 1/θ^(2i/rope_dim); the first rope_dim/2 angles use the patch row, the rest the
    column; element j of a head pairs with element j+head_dim/2), bidirectional softmax
    attention scaled by head_dim^-½ (MMEncoderAttention's default,
    model_executor/layers/attention/mm_encoder_attention.py 338), wo with bias; MLP: merged
    w1 without bias, silu(first half)·second half, w2 without bias; final norm.
  - Aligner (`aligner`, vision.py 341-372): (h,w,C) zero-padded right/bottom to multiples of
    r, each r×r cell flattened channel-major (feature c·r² + di·r + dj, F.unfold's order), rows
    in row-major cell order; w1 (bias), exact (erf) GELU, w2 (bias).
  - V4 span (`span_v4`): deepseek_v4/common/mm_preprocess.py 195-235 (build_image_block:
    types IMAGE_START=0, IMAGE_PAD=1, IMAGE=2, IMAGE_NEW_LINE=3, IMAGE_END=4; rows paired
    and walked column by column; `perm` maps IMAGE slots to aligner rows) and 487-508 (the
    splice prepends 3 - start_pos % 4 IMAGE_PAD); vl_model.py 223-235 (aligner rows[perm])
    and 291-320 (sentinel table [start, pad, pad, newline, end] at every non-IMAGE slot).
  - V4.1 span (`span_v41`): deepseek_v41/common/mm_preprocess.py 164-169 (types IMAGE_START=0,
    IMAGE=1, IMAGE_NEW_LINE=2, IMAGE_END=3, reading order, no pad) and
    deepseek_v41/common/vl_cudagraph.py 67-88 (aligner rows in reading order at IMAGE
    slots, the learned vectors at the rest).

Numerics: vLLM runs the tower in the model dtype (bf16) and casts the image_* vectors to it;
here every activation is float32 and the weights are the stored bf16 values upcast. The
image_* vectors are drawn on the bf16 grid (stored as F32) so either cast gives the same span.

`pil_resize_bicubic` / `pil_pad` restate Pillow 13.0.0's BICUBIC resample (sdist
src/libImaging/Resample.c: bicubic_filter, precompute_coeffs, normalize_coeffs_8bpc, the 8bpc
passes and ImagingResampleInner's pass order; src/_imaging.c _resize) and ImageOps.pad/contain
(src/PIL/ImageOps.py 299-333, 390-429) in numpy, as the specification a non-Python port
follows; the maker checks them byte for byte against the installed Pillow. Pillow 13 changed
the pass order (vertical first when the height drops by more than twice the width's pixels):
canvases made with Pillow 12 or older differ in the last bit on such resizes.
"""

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps

from golden.storage import Store

# V4 sentinel roles (deepseek_v4/common/mm_preprocess.py 52-53).
V4_START, V4_PAD, V4_IMAGE, V4_NEWLINE, V4_END = range(5)
COMPRESS_PAD_TO = 4
# V4.1 span roles (deepseek_v41/common/mm_preprocess.py 43).
V41_START, V41_IMAGE, V41_NEWLINE, V41_END = range(4)

PAD_COLOR = (127, 127, 127)


@dataclass
class VisionConfig:
    n_layers: int
    dim: int
    n_heads: int
    inter_dim: int
    patch_size: int
    rope_theta: float
    downsample_ratio: int
    max_n_token: int
    min_pixels: int
    max_wh_ratio: float | None
    hidden_size: int
    version: str  # "v4" or "v41"

    @property
    def head_dim(self):
        return self.dim // self.n_heads


# V4.1's HF names for the vision fields (configs/deepseek_v41.py 52-62).
V41_KEYS = {
    "n_layers": "num_hidden_layers", "dim": "hidden_size", "n_heads": "num_attention_heads",
    "inter_dim": "intermediate_size", "patch_size": "patch_size", "rope_theta": "rope_theta",
    "downsample_ratio": "downsample_ratio", "max_n_token": "max_image_tokens",
    "min_pixels": "min_pixels", "max_wh_ratio": "max_wh_ratio",
}


def config_fields(vc):
    """The config.json fields for `vc`: flat `vision_*` keys (V4 Vision-Exp) or a nested
    `vision_config` (V4.1)."""
    d = asdict(vc)
    if vc.version == "v4":
        return {f"vision_{k}": d[k] for k in V41_KEYS}
    return {"vision_config": {hf: d[k] for k, hf in V41_KEYS.items()}}


def add_to_config(cfg, vc):
    out = dict(cfg)
    out.update(config_fields(vc))
    return out


def read_config(cfg, version):
    """Inverse of `add_to_config` on a parsed config.json (the decoder width from the top level
    for V4, from `text_config` for V4.1)."""
    if version == "v4":
        vals = {k: cfg[f"vision_{k}"] for k in V41_KEYS}
        hidden = cfg["hidden_size"]
    else:
        vals = {k: cfg["vision_config"][hf] for k, hf in V41_KEYS.items()}
        hidden = cfg["text_config"]["hidden_size"]
    return VisionConfig(**vals, hidden_size=hidden, version=version)


# ---------------------------------------------------------------- token counts and sizes

def llm_grid(best_h, best_w, p, r):
    return math.ceil((best_h // p) / r), math.ceil((best_w // p) / r)


def v4_block_len(n_llm_h, n_llm_w):
    """Pad-free N-layout block length (v4 mm_preprocess.py 90-99 and 428-433)."""
    row = n_llm_w + 1
    n = n_llm_h * row + 2
    if n_llm_h % 2 == 1:
        n += row
    return n + (n_llm_h + 1) // 2 * row % 2 * 2


def v41_span_len(n_llm_h, n_llm_w):
    return n_llm_h * (n_llm_w + 1) + 2


def grid_bounds(height, width, budget):
    """solve_resize_ratio's max_w_float, max_h_float (both versions compute them alike)."""
    aspect = height / width
    mw = math.sqrt((budget - 2) / aspect + 0.25) - 0.5
    return mw, mw * aspect


def v4_solve(height, width, p, r, budget, trace):
    """v4 mm_preprocess.py 102-133; returns (best_h, best_w)."""
    mw, mh = grid_bounds(height, width, budget)
    cell = p * r
    if mw < 1.0:
        trace.append("single_column")
        rows = (budget - 2) // 2
        rows -= rows % 2
        return rows * cell, cell
    if mh < 2.0:
        trace.append("two_rows")
        cols = (budget - 2) // 2 - 1
        assert cols > 1
        return 2 * cell, cols * cell
    trace.append("aspect")
    cols, rows = math.floor(mw), math.floor(mh)
    rows -= rows % 2
    beta = min(cols * cell / width, rows * cell / height)
    return math.floor(height * beta / p) * p, math.floor(width * beta / p) * p


def v4_safe_resize(height, width, best_h, best_w, p, r, max_n_token, trace):
    """v4 mm_preprocess.py 136-149."""
    limit = max_n_token - (COMPRESS_PAD_TO - 1)
    budget = limit
    while v4_block_len(*llm_grid(best_h, best_w, p, r)) > limit:
        best_h, best_w = v4_solve(height, width, p, r, budget, trace)
        budget -= 1
    return best_h, best_w


def v41_solve(height, width, p, r, budget, trace):
    """v41 mm_preprocess.py 83-101; returns (best_h, best_w)."""
    mw, mh = grid_bounds(height, width, budget)
    cell = p * r
    if mw < 1.0:
        trace.append("single_column")
        return (budget - 2) // 2 * cell, cell
    if mh < 1.0:
        trace.append("single_row")
        return cell, (budget - 3) * cell
    trace.append("aspect")
    beta = min(math.floor(mw) * cell / width, math.floor(mh) * cell / height)
    return math.floor(height * beta / p) * p, math.floor(width * beta / p) * p


def v41_safe_resize(height, width, best_h, best_w, p, r, max_n_token, trace):
    """v41 mm_preprocess.py 104-118."""
    if v41_span_len(*llm_grid(best_h, best_w, p, r)) > max_n_token:
        best_h, best_w = v41_solve(height, width, p, r, max_n_token, trace)
        assert v41_span_len(*llm_grid(best_h, best_w, p, r)) <= max_n_token
    return best_h, best_w


def plan(vc, src_w, src_h):
    """The size decisions of load_image for a src_w × src_h source: a dict with best_width,
    best_height, the grids, the canvas path and which branches ran."""
    p, r = vc.patch_size, vc.downsample_ratio
    width, height = src_w, src_h
    clamped = vc.max_wh_ratio is not None and width > height * vc.max_wh_ratio
    if clamped:
        width = height * vc.max_wh_ratio
    upscaled = 0 < width * height < vc.min_pixels
    if upscaled:
        ratio = (vc.min_pixels / (width * height)) ** 0.5
        width, height = int(width * ratio), int(height * ratio)
    best_w = math.ceil(width / p) * p
    best_h = math.ceil(height / p) * p
    trace = []
    resize = v4_safe_resize if vc.version == "v4" else v41_safe_resize
    best_h, best_w = resize(height, width, best_h, best_w, p, r, vc.max_n_token, trace)
    n_llm_h, n_llm_w = llm_grid(best_h, best_w, p, r)
    stretch = vc.max_wh_ratio is not None and src_w >= vc.max_wh_ratio * src_h
    span_len = v4_block_len(n_llm_h, n_llm_w) if vc.version == "v4" else v41_span_len(n_llm_h, n_llm_w)
    return {
        "width": src_w, "height": src_h, "best_width": best_w, "best_height": best_h,
        "n_vit_h": best_h // p, "n_vit_w": best_w // p, "n_llm_h": n_llm_h, "n_llm_w": n_llm_w,
        "span_len": span_len, "path": "stretch" if stretch else "pad",
        "clamped": clamped, "upscaled": upscaled, "solves": trace,
    }


def canvas_pil(rgb, pl):
    """The canvas through Pillow, as vLLM builds it (uint8 [bh, bw, 3])."""
    im = Image.fromarray(np.ascontiguousarray(rgb), "RGB").convert("RGB")
    size = (pl["best_width"], pl["best_height"])
    if pl["path"] == "stretch":
        im = im.resize(size)
    else:
        im = ImageOps.pad(im, size, color=PAD_COLOR)
    return np.asarray(im, dtype=np.uint8).copy()


def patchify(canvas, p):
    """uint8 [H, W, 3] -> (n_vit_h·n_vit_w, 3, p, p) float32 on the bf16 grid."""
    x = torch.from_numpy(canvas.astype(np.float32)).permute(2, 0, 1) / 255
    x = ((x - 0.5) / 0.5).to(torch.bfloat16).to(torch.float32)
    _, h, w = x.shape
    nh, nw = h // p, w // p
    return x.view(3, nh, p, nw, p).permute(1, 3, 0, 2, 4).reshape(nh * nw, 3, p, p)


def load_image(vc, rgb):
    """(plan, canvas uint8, patches f32)."""
    h, w, _ = rgb.shape
    pl = plan(vc, w, h)
    canvas = canvas_pil(rgb, pl)
    assert canvas.shape == (pl["best_height"], pl["best_width"], 3)
    return pl, canvas, patchify(canvas, vc.patch_size)


# ---------------------------------------------------------------- Pillow's BICUBIC, restated

PRECISION_BITS = 32 - 8 - 2


def _bicubic(x):
    a = -0.5
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def _c_int(v):
    """C's (int) cast of a double: truncation toward zero."""
    return int(v)


def precompute_coeffs(in_size, in0, in1, out_size, support=2.0, filt=_bicubic):
    """Resample.c precompute_coeffs: per output index, (xmin, count, double weights); then the
    8bpc fixed-point weights (normalize_coeffs_8bpc)."""
    scale = float(np.float32(in1) - np.float32(in0)) / out_size  # (double)(in1 - in0), floats
    filterscale = max(scale, 1.0)
    sup = support * filterscale
    inv = 1.0 / filterscale
    out = []
    for xx in range(out_size):
        center = in0 + (xx + 0.5) * scale
        xmin = max(_c_int(center - sup + 0.5), 0)
        xmax = min(_c_int(center + sup + 0.5), in_size) - xmin
        w = [filt((x + xmin - center + 0.5) * inv) for x in range(xmax)]
        ww = 0.0
        for v in w:
            ww += v
        if ww != 0.0:
            w = [v / ww for v in w]
        one = 1 << PRECISION_BITS
        k = [_c_int(-0.5 + v * one) if v < 0 else _c_int(0.5 + v * one) for v in w]
        out.append((xmin, xmax, k))
    return out


def _pass(lines, coeffs):
    """One 8-bit pass along axis 1 of int64 [n, in, c]: 2^21 + Σ px·k, >> 22, clipped."""
    n, _, c = lines.shape
    res = np.empty((n, len(coeffs), c), dtype=np.int64)
    for i, (xmin, cnt, k) in enumerate(coeffs):
        acc = np.full((n, c), 1 << (PRECISION_BITS - 1), dtype=np.int64)
        for j in range(cnt):
            acc += lines[:, xmin + j, :] * k[j]
        res[:, i, :] = np.clip(acc >> PRECISION_BITS, 0, 255)
    return res


def pil_resize_bicubic(rgb, size):
    """Image.resize(size) (BICUBIC, box = the whole image) on uint8 [h, w, 3], as Pillow 13.0.0's
    ImagingResampleInner runs it: two 8-bit passes, each rounding to uint8, a pass skipped when
    its size does not change (no change at all is a copy). The vertical pass goes first iff the
    height drops by more than twice as many pixels as the width does (in_h - out_h > 0 and
    in_h - out_h > 2·(in_w - out_w), integer pixel counts); otherwise the horizontal pass goes
    first, over only the source rows the vertical coefficients touch (bounds[0] to the last
    output's xmin + count), and the vertical bounds are shifted by that first row."""
    h, w, _ = rgb.shape
    ow, oh = size
    if (ow, oh) == (w, h):
        return rgb.copy()
    x = rgb.astype(np.int64)
    need_h, need_v = ow != w, oh != h  # box = (0, 0, w, h)
    vert = precompute_coeffs(h, 0.0, float(h), oh)
    horiz = precompute_coeffs(w, 0.0, float(w), ow) if need_h else None
    horizontal_first = not (h - oh > 0 and h - oh > (w - ow) * 2)
    if horizontal_first:
        if need_h:
            y0 = vert[0][0]
            y1 = vert[-1][0] + vert[-1][1]
            x = _pass(x[y0:y1], horiz)
            vert = [(a - y0, b, k) for a, b, k in vert]
        if need_v:
            x = _pass(x.transpose(1, 0, 2), vert).transpose(1, 0, 2)
    else:
        if need_v:
            x = _pass(x.transpose(1, 0, 2), vert).transpose(1, 0, 2)
        if need_h:
            x = _pass(x, horiz)
    return x.astype(np.uint8)


def pil_contain_size(w, h, size):
    """ImageOps.contain's target size (Python round: half to even)."""
    tw, th = size
    im_ratio, dest_ratio = w / h, tw / th
    if im_ratio != dest_ratio:
        if im_ratio > dest_ratio:
            th = round(h / w * tw)
        else:
            tw = round(w / h * th)
    return tw, th


def pil_pad(rgb, size, color=PAD_COLOR):
    """ImageOps.pad(image, size, BICUBIC, color, centering=(0.5, 0.5))."""
    h, w, _ = rgb.shape
    tw, th = pil_contain_size(w, h, size)
    if min(tw, th) == 0:  # contain returns an empty image: the canvas is all fill
        resized = np.zeros((th, tw, 3), dtype=np.uint8)
    else:
        resized = pil_resize_bicubic(rgb, (tw, th))
    if (tw, th) == tuple(size):
        return resized
    out = np.empty((size[1], size[0], 3), dtype=np.uint8)
    out[:] = color
    if tw != size[0]:
        x = round((size[0] - tw) * 0.5)
        out[:, x:x + tw] = resized
    else:
        y = round((size[1] - th) * 0.5)
        out[y:y + th, :] = resized
    return out


def canvas_port(rgb, pl):
    size = (pl["best_width"], pl["best_height"])
    return pil_resize_bicubic(rgb, size) if pl["path"] == "stretch" else pil_pad(rgb, size)


# ---------------------------------------------------------------- weights

def draw_weights(vc, seed):
    """Random tower weights under the HF checkpoint names: matrices N(0, 1/in), norms
    1+N(0, 0.1), biases N(0, 0.05) (BF16); image_* vectors N(0, 1) on the bf16 grid (F32).
    Returns (float32 tensors for the forward, stored bytes in drawing order)."""
    s = Store(seed, fp8_block=128)
    D, I, H, p, r = vc.dim, vc.inter_dim, vc.hidden_size, vc.patch_size, vc.downsample_ratio
    w = {}

    def mat(name, out_dim, in_dim):
        w[name] = s.bf16(name, s.draw((out_dim, in_dim), in_dim ** -0.5))

    def bias(name, n):
        w[name] = s.bf16(name, s.draw((n,), 0.05))

    def norm(name, n):
        w[name] = s.bf16(name, s.draw((n,), 0.1, 1.0))

    mat("vision.patch_embed.proj.weight", D, 3 * p * p)
    bias("vision.patch_embed.proj.bias", D)
    for i in range(vc.n_layers):
        b = f"vision.blocks.{i}"
        norm(f"{b}.norm1.weight", D)
        mat(f"{b}.attn.wqkv.weight", 3 * D, D)
        bias(f"{b}.attn.wqkv.bias", 3 * D)
        mat(f"{b}.attn.wo.weight", D, D)
        bias(f"{b}.attn.wo.bias", D)
        norm(f"{b}.norm2.weight", D)
        mat(f"{b}.mlp.w1.weight", 2 * I, D)
        mat(f"{b}.mlp.w2.weight", D, I)
    norm("vision.norm.weight", D)
    mat("aligner.w1.weight", H, D * r * r)
    bias("aligner.w1.bias", H)
    mat("aligner.w2.weight", H, H)
    bias("aligner.w2.bias", H)
    names = ["image_start", "image_end", "image_newline"] + (["image_pad"] if vc.version == "v4" else [])
    for name in names:
        w[name] = s.f32(name, s.draw((H,), 1.0).to(torch.bfloat16).to(torch.float32))
    return w, s.files


# ---------------------------------------------------------------- the tower

def rms_norm(x, weight, eps=1e-6):
    return weight * (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps))


def rope_cos_sin(n_h, n_w, rope_dim, theta):
    """(cos, sin) [n_h·n_w, 1, rope_dim] (vision.py 44-52): the first rope_dim/2 angles are
    row·f_i, the rest column·f_i, f_i = 1/θ^(2i/rope_dim), in float32."""
    f = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))
    rows = torch.arange(n_h, dtype=torch.float32).repeat_interleave(n_w)
    cols = torch.arange(n_w, dtype=torch.float32).repeat(n_h)
    ang = torch.cat([rows[:, None] * f, cols[:, None] * f], dim=1)
    return ang.cos()[:, None, :], ang.sin()[:, None, :]


def rotate(x, cos, sin):
    """Rotate-half over each head: element j pairs with j + head_dim/2 (vision.py 62-65)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def block(vc, w, i, x, cos, sin):
    b = f"vision.blocks.{i}"
    n, D, nh, hd = x.shape[0], vc.dim, vc.n_heads, vc.head_dim
    h = rms_norm(x, w[f"{b}.norm1.weight"])
    qkv = F.linear(h, w[f"{b}.attn.wqkv.weight"], w[f"{b}.attn.wqkv.bias"])
    q, k, v = (t.reshape(n, nh, hd) for t in qkv.split(D, dim=-1))
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    scores = torch.einsum("qhd,khd->hqk", q, k) * hd ** -0.5
    o = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v).reshape(n, D)
    x = x + F.linear(o, w[f"{b}.attn.wo.weight"], w[f"{b}.attn.wo.bias"])
    h = rms_norm(x, w[f"{b}.norm2.weight"])
    gate, up = F.linear(h, w[f"{b}.mlp.w1.weight"]).split(vc.inter_dim, dim=-1)
    return x + F.linear(F.silu(gate) * up, w[f"{b}.mlp.w2.weight"])


@torch.no_grad()
def vit(vc, w, patches, n_vit_h, n_vit_w):
    """Returns (patch-embed output, the output of every block, after the final norm)."""
    pe = "vision.patch_embed.proj"
    x = F.linear(patches.flatten(1), w[f"{pe}.weight"], w[f"{pe}.bias"])
    embed = x
    cos, sin = rope_cos_sin(n_vit_h, n_vit_w, vc.head_dim // 2, vc.rope_theta)
    blocks = []
    for i in range(vc.n_layers):
        x = block(vc, w, i, x, cos, sin)
        blocks.append(x)
    return embed, blocks, rms_norm(x, w["vision.norm.weight"])


@torch.no_grad()
def aligner(vc, w, x, n_vit_h, n_vit_w):
    """Aligner rows [n_llm_h·n_llm_w, hidden] in row-major cell order."""
    r, C = vc.downsample_ratio, x.shape[-1]
    hh, ww = -(-n_vit_h // r) * r, -(-n_vit_w // r) * r
    g = torch.zeros(hh, ww, C)
    g[:n_vit_h, :n_vit_w] = x.view(n_vit_h, n_vit_w, C)
    cells = g.view(hh // r, r, ww // r, r, C).permute(0, 2, 4, 1, 3).reshape(-1, C * r * r)
    hidden = F.gelu(F.linear(cells, w["aligner.w1.weight"], w["aligner.w1.bias"]))
    return F.linear(hidden, w["aligner.w2.weight"], w["aligner.w2.bias"])


# ---------------------------------------------------------------- spans

def v4_block(n_llm_h, n_llm_w, start_pos=COMPRESS_PAD_TO - 1):
    """(types, perm) of the V4 block at `start_pos` (3, the default, is the pad-free block):
    3 - start_pos % 4 IMAGE_PAD, IMAGE_START, the rows (a pad row when n_llm_h is odd) taken in
    pairs and walked column by column, 2 IMAGE_PAD when a pair holds an odd count, IMAGE_END.
    perm[j] = the aligner row of the j-th IMAGE slot."""
    row = n_llm_w + 1
    rows = n_llm_h + n_llm_h % 2
    body, perm = [], []
    for top in range(0, rows, 2):
        for c in range(row):
            for rr in (top, top + 1):
                if rr >= n_llm_h:
                    body.append(V4_PAD)
                elif c == n_llm_w:
                    body.append(V4_NEWLINE)
                else:
                    body.append(V4_IMAGE)
                    perm.append(rr * n_llm_w + c)
    pad_last = rows // 2 * row % 2 * 2
    lead = COMPRESS_PAD_TO - 1 - start_pos % COMPRESS_PAD_TO
    types = [V4_PAD] * lead + [V4_START] + body + [V4_PAD] * pad_last + [V4_END]
    return torch.tensor(types, dtype=torch.int64), torch.tensor(perm, dtype=torch.int64)


def span_v4(w, rows, n_llm_h, n_llm_w, start_pos=COMPRESS_PAD_TO - 1):
    """(embeddings [len, hidden], types, perm) of the V4 block at `start_pos`."""
    types, perm = v4_block(n_llm_h, n_llm_w, start_pos)
    table = {V4_START: w["image_start"], V4_PAD: w["image_pad"], V4_NEWLINE: w["image_newline"],
             V4_END: w["image_end"]}
    out = torch.empty(len(types), rows.shape[1])
    for t, vec in table.items():
        out[types == t] = vec
    out[types == V4_IMAGE] = rows[perm]
    return out, types, perm


def v41_types(n_llm_h, n_llm_w):
    t = [V41_START] + ([V41_IMAGE] * n_llm_w + [V41_NEWLINE]) * n_llm_h + [V41_END]
    return torch.tensor(t, dtype=torch.int64)


def span_v41(w, rows, n_llm_h, n_llm_w):
    """(embeddings [len, hidden], types) of the V4.1 span (reading order)."""
    types = v41_types(n_llm_h, n_llm_w)
    out = torch.empty(len(types), rows.shape[1])
    out[types == V41_START] = w["image_start"]
    out[types == V41_NEWLINE] = w["image_newline"]
    out[types == V41_END] = w["image_end"]
    out[types == V41_IMAGE] = rows
    return out, types


def encode(vc, w, rgb):
    """Everything the golden records for one source image."""
    pl, canvas, patches = load_image(vc, rgb)
    nh, nw = pl["n_vit_h"], pl["n_vit_w"]
    embed, blocks, out = vit(vc, w, patches, nh, nw)
    rows = aligner(vc, w, out, nh, nw)
    r = {"plan": pl, "canvas": canvas, "patches": patches, "embed": embed, "blocks": blocks,
         "vit": out, "aligner": rows}
    if vc.version == "v4":
        r["span"], r["types"], r["perm"] = span_v4(w, rows, pl["n_llm_h"], pl["n_llm_w"])
    else:
        r["span"], r["types"] = span_v41(w, rows, pl["n_llm_h"], pl["n_llm_w"])
    return r
