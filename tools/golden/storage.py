"""Storage formats of DeepSeek's checkpoints, shared by the golden makers: values drawn in
float32 are rounded onto what the checkpoint stores (BF16; FP8 e4m3 with power-of-two E8M0
block scales; FP4 e2m1 with an E8M0 scale per 32 inputs, two codes a byte, low nibble first),
and written as safetensors byte for byte (dtypes such as F8_E8M0 included).

`Store` draws a checkpoint's weights in order and keeps both what the forward computes with
(the rounded float32 values) and the stored bytes. `write_arrays` is the second, older
writer of the official goldens (sorted names, numpy arrays); its bytes are committed, so it
stays as it is.
"""

import json
import math
import re
import struct

import torch


def bf16_round(t):
    return t.to(torch.bfloat16).to(torch.float32)


def fp8_block_quant(w, block=128, block_cols=None):
    """Round w onto FP8 e4m3 with a power-of-two scale per `block` × `block_cols` block (square
    when `block_cols` is None; a ragged edge block uses its own amax); return (codes u8, scale
    exps u8, scales, dequant)."""
    br, bc = block, block_cols or block
    out_dim, in_dim = w.shape
    rb, cb = math.ceil(out_dim / br), math.ceil(in_dim / bc)
    padded = torch.zeros(rb * br, cb * bc)
    padded[:out_dim, :in_dim] = w
    blocks = padded.view(rb, br, cb, bc)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-4)
    exp = torch.ceil(torch.log2(amax / 448.0))
    scale = torch.pow(2.0, exp)
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    deq = (q.to(torch.float32) * scale[:, None, :, None]).view(rb * br, cb * bc)[:out_dim, :in_dim]
    codes = q.view(rb * br, cb * bc)[:out_dim, :in_dim].contiguous().view(torch.uint8)
    return codes, (exp + 127).to(torch.uint8), scale, deq.contiguous()


FP4_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def fp4_quant(w):
    """Round w onto e2m1 with a power-of-two scale per 32 inputs; return (packed i8, scale exps u8, dequant)."""
    out_dim, in_dim = w.shape
    assert in_dim % 32 == 0
    g = w.view(out_dim, in_dim // 32, 32)
    amax = g.abs().amax(dim=2).clamp(min=6 * 2.0 ** -126)
    exp = torch.ceil(torch.log2(amax / 6.0))
    x = g / torch.pow(2.0, exp)[..., None]
    idx = (x.abs()[..., None] - FP4_GRID).abs().argmin(dim=-1)
    neg = (x < 0) & (idx > 0)
    codes = (idx | (neg.to(torch.int64) << 3)).view(out_dim, in_dim)
    deq = (FP4_GRID[idx] * torch.where(neg, -1.0, 1.0) * torch.pow(2.0, exp)[..., None]).view(out_dim, in_dim)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed, (exp + 127).to(torch.uint8), deq


def raw(t, dtype):
    """(safetensors dtype, shape, bytes) for a tensor in the given storage dtype."""
    t = t.contiguous()
    if dtype == "F32":
        return dtype, list(t.shape), t.to(torch.float32).numpy().tobytes()
    if dtype == "BF16":
        return dtype, list(t.shape), t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    if dtype in ("F8_E4M3", "F8_E8M0", "U8", "I8"):
        return dtype, list(t.shape), t.to(torch.uint8).numpy().tobytes()
    if dtype == "I64":
        return dtype, list(t.shape), t.to(torch.int64).numpy().tobytes()
    if dtype == "I32":
        return dtype, list(t.shape), t.to(torch.int32).numpy().tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors):
    """Minimal safetensors writer (so dtypes such as F8_E8M0 and packed I8 are written exactly)."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def write_arrays(path, tensors):
    """Safetensors of `{name: (numpy array, dtype)}` as make_official_golden.py has always
    written them: names sorted, JSON header with spaces and no `__metadata__`."""
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


class Store:
    """Draws weights, rounds them onto their storage format, keeps the rounded values for the
    forward and the stored bytes for the checkpoint (`files`, in drawing order, which fixes
    the committed bytes). `fp8_block` is the FP8 scale block edge: 32 for V4.1's checkpoints,
    128 for V4's."""

    def __init__(self, seed, fp8_block):
        self.g = torch.Generator().manual_seed(seed)
        self.files = {}
        self.fp8_block = fp8_block

    def draw(self, shape, std, mean=0.0):
        return torch.randn(*shape, generator=self.g) * std + mean

    def f32(self, name, t):
        self.files[name] = raw(t, "F32")
        return t

    def bf16(self, name, t):
        t = bf16_round(t)
        self.files[name] = raw(t, "BF16")
        return t

    def fp8(self, name, t, rb=None, cb=None):
        """FP8 with `rb` x `cb` scale blocks (the store's square block by default)."""
        codes, exps, _, deq = fp8_block_quant(t, rb or self.fp8_block, cb or self.fp8_block)
        self.files[name] = raw(codes, "F8_E4M3")
        self.files[name.removesuffix(".weight") + ".scale"] = raw(exps, "F8_E8M0")
        return deq

    def fp4(self, name, t):
        packed, exps, deq = fp4_quant(t)
        self.files[name] = raw(packed, "I8")
        self.files[name.removesuffix(".weight") + ".scale"] = raw(exps, "F8_E8M0")
        return deq


def finite(x):
    """`x`, or None for an infinity (JSON has none)."""
    return None if math.isinf(x) else x


def dump_json(obj, path):
    """indent=1, but lists of numbers on one line."""
    text = json.dumps(obj, indent=1)

    def flat(mt):
        return "[" + ", ".join(t.strip() for t in mt.group(1).split(",") if t.strip()) + "]"

    text = re.sub(r"\[\s*([-0-9., \n]*?)\s*\]", flat, text)
    with open(path, "w") as f:
        f.write(text + "\n")
    assert json.loads(text) == obj
