"""Reading stored checkpoints back, with the scales applied by hand from the raw bytes (an
E8M0 byte b is 2^(b-127); FP8 e4m3 scales cover 128x128 blocks, cut at a ragged edge; FP4
e2m1 is two codes a byte, low nibble = even input index, one scale per 32 inputs).

Two readers, because the makers that use them were written against different libraries:
  - `read_shards` / `tensor`: plain numpy on the safetensors bytes (make_official_golden.py's
    port needs only torch and numpy);
  - `dequant_fp8` / `dequant_fp4` / `decode_official`: torch on tensors from
    `safetensors.safe_open` (the HF-side makers and hf_bench.py).
Both give the exact stored values in float32 (code times a power of two).
"""

import json
import os
import struct

import numpy as np
import torch

from golden.storage import FP4_GRID

# ---------------------------------------------------------------- numpy: the raw bytes


def e4m3_table():
    """Every e4m3 byte's value (NaN for the two NaN codes, no infinities)."""
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


def read_safetensors_raw(path):
    """name -> (dtype, shape, bytes) of one safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}


def read_shards(d, only=None):
    """name -> (dtype, shape, bytes) over every *.safetensors of directory `d` (or the one
    file named `only`)."""
    raw = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors") or (only and f != only):
            continue
        raw.update(read_safetensors_raw(os.path.join(d, f)))
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
    """The E8M0 scales beside a weight, as float64 powers of two."""
    dt, shape, data = raw[weight_name.removesuffix(".weight") + ".scale"]
    assert dt == "F8_E8M0", dt
    b = np.frombuffer(data, np.uint8).astype(np.float64)
    return (2.0 ** (b - 127)).reshape(shape)


# ---------------------------------------------------------------- torch: safe_open tensors


def e8m0(t):
    return torch.pow(2.0, t.view(torch.uint8).to(torch.float32) - 127.0)


def dequant_fp4(packed, scale):
    """I8 [out, in/2] (low nibble first) + E8M0 [out, in/32] -> f32 [out, in]."""
    p = packed.view(torch.uint8).to(torch.int64)
    codes = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(p.shape[0], -1)
    mag = FP4_GRID[codes & 7] * torch.where(codes & 8 > 0, -1.0, 1.0)
    return mag * e8m0(scale).repeat_interleave(32, dim=1)


def dequant_fp8(codes, scale):
    """FP8 e4m3 [out, in] times its 128x128 block scales: E8M0 (official layout) or F32
    `weight_scale_inv` (HF layout)."""
    w = codes.view(torch.float8_e4m3fn).to(torch.float32)
    s = e8m0(scale) if scale.dtype == torch.float8_e8m0fnu else scale.to(torch.float32)
    s = s.repeat_interleave(128, 0)[: w.shape[0]].repeat_interleave(128, 1)[:, : w.shape[1]]
    return w * s


def decode_official(f, name):
    """One official-layout tensor of an open safetensors file as float32: FP8 and FP4
    weights dequantised with their `.scale`, everything else converted."""
    t = f.get_tensor(name)
    if not name.endswith(".weight") or t.dtype not in (torch.float8_e4m3fn, torch.int8):
        return t.to(torch.float32)
    s = f.get_tensor(name[: -len(".weight")] + ".scale")
    return dequant_fp8(t, s) if t.dtype == torch.float8_e4m3fn else dequant_fp4(t, s)
