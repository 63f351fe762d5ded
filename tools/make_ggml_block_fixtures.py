#!/usr/bin/env python3
"""Block fixtures for crates/kernels/src/ggml/tests.rs.

Quantises varied rows with llama.cpp's own quantizer (`ggml_quantize_chunk`, what
llama-quantize calls, from the libggml-base of llama-cpp-python 0.3.36's llama.cpp 0c1e570)
into each ggml block type deepinfer decodes, and writes the bytes beside the values gguf-py's
numpy decoder (`gguf.quants.dequantize`, the same source tree) gives them; ggml's own
`dequantize_row_*` must agree with gguf-py bit for bit or the tool stops. For Q8_K (the
activations of the K-quant products) it writes rows and the values `q * d` of their codes
from `quantize_row_q8_K_ref`; and products of weight rows with activation rows as llama.cpp's
CPU backend computes them (`quantize_row_<vec_dot_type>`, `ggml_vec_dot_<type>_<vec_dot_type>`
of libggml-cpu). Run by hand from the repository root once
tools/bench_peers.sh (or tools/gguf_e2e.sh with GGUF_E2E_DIR) has built llama.cpp; the
output is committed (CI has no Python):

    LIBGGML=target/peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/libggml-base.so \
    PYTHONPATH=target/peers/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py \
        target/peers/venv/bin/python tools/make_ggml_block_fixtures.py
"""

import ctypes
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "kernels", "src", "ggml", "blocks.txt")
# deepinfer's names (ggml_type_name) and 256 values each: a super-block, or 8 blocks.
TYPES = [("q4_0", T.Q4_0), ("q4_1", T.Q4_1), ("q5_0", T.Q5_0), ("q5_1", T.Q5_1),
         ("iq4_nl", T.IQ4_NL), ("q2_K", T.Q2_K), ("q3_K", T.Q3_K), ("q4_K", T.Q4_K),
         ("q5_K", T.Q5_K), ("q6_K", T.Q6_K), ("iq4_xs", T.IQ4_XS), ("iq2_xxs", T.IQ2_XXS),
         ("iq2_xs", T.IQ2_XS), ("iq2_s", T.IQ2_S), ("iq3_xxs", T.IQ3_XXS), ("iq3_s", T.IQ3_S),
         ("iq1_s", T.IQ1_S), ("iq1_m", T.IQ1_M), ("f16", T.F16)]
N = 256
# The 32-blocks' sizes; the rest are 256-blocks (gguf-py's GGML_QUANT_SIZES).
SMALL = {"q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q8_0", "mxfp4", "f16"}
# ggml's functions where they are not named after the type: F16 rows convert rather than
# dequantise, and its products read f16 inputs through `ggml_vec_dot_f16`.
DEQUANT = {"f16": "ggml_fp16_to_fp32_row"}
QUANT_ACT = {"f16": "ggml_cpu_fp32_to_fp16"}
VEC_DOT = {"f16": "ggml_vec_dot_f16"}
# The lattice types, which llama.cpp quantises with an importance matrix (required for
# IQ2_XXS, IQ2_XS, IQ1_S): the tool gives each an imatrix as llama-imatrix's are, the mean
# square of the activations a column sees.
LATTICE = {"iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"}


def rows(rng):
    """Rows as weights and activations come: gaussian, skewed (every value positive, where
    the offsets matter), heavy-tailed, with an outlier and a run of zeros."""
    g = rng.standard_normal(N).astype(np.float32) * 0.02
    pos = np.abs(rng.standard_normal(N)).astype(np.float32) * 0.5 + 0.1
    heavy = (rng.standard_t(3, N) * 0.3).astype(np.float32)
    out = rng.standard_normal(N).astype(np.float32)
    out[7] = -40.0
    out[200:240] = 0.0
    return [g, pos, heavy, out]


def main():
    rng = np.random.default_rng(47)
    lib = ctypes.CDLL(os.environ["LIBGGML"])
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]

    def quantize(name, qtype, x):
        """x quantised by llama.cpp: the blocks' bytes."""
        imatrix = None
        if name in LATTICE:
            imatrix = (np.abs(rng.standard_normal(len(x))) + 0.1).astype(np.float32) ** 2
        blocks = len(x) // (32 if name in SMALL else 256)
        dst = ctypes.create_string_buffer(blocks * 292)  # no block is larger than Q8_K's
        n = lib.ggml_quantize_chunk(int(qtype), x.ctypes.data, dst, 0, 1, len(x),
                                    None if imatrix is None else imatrix.ctypes.data)
        return dst.raw[:n]

    ptrs = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.quantize_row_q8_K_ref.argtypes = ptrs
    for name, _ in TYPES:
        getattr(lib, DEQUANT.get(name, f"dequantize_row_{name}")).argtypes = ptrs
    lines = ["# tools/make_ggml_block_fixtures.py: llama.cpp 0c1e570's quantizer, gguf-py's decoder",
             "# block <type> <hex bytes> / values <hex f32 bits>; q8_K <hex f32 bits of x> / values;",
             "# dot <type> <weight row hex> / x <hex f32 bits> / value <llama.cpp's product, f32 bits>"]
    for name, qtype in TYPES:
        for x in rows(rng):
            raw = quantize(name, qtype, x)
            dst = ctypes.create_string_buffer(raw)
            want = dequantize(np.frombuffer(raw, dtype=np.uint8), qtype).astype(np.float32)
            theirs = np.zeros(N, dtype=np.float32)
            getattr(lib, DEQUANT.get(name, f"dequantize_row_{name}"))(dst, theirs.ctypes.data, N)
            if not np.array_equal(want.view(np.uint32), theirs.view(np.uint32)):
                raise SystemExit(f"{name}: gguf-py and ggml decode differently")
            lines.append(f"block {name} {raw.hex()}")
            lines.append("values " + " ".join(f"{v:08x}" for v in want.view(np.uint32)))
    for x in rows(rng):
        # block_q8_K: f32 d, 256 int8 codes, 16 int16 sums.
        dst = ctypes.create_string_buffer(N // 256 * 292)
        lib.quantize_row_q8_K_ref(x.ctypes.data, dst, N)
        vals = []
        for b in range(N // 256):
            blk = dst.raw[b * 292:(b + 1) * 292]
            d = np.frombuffer(blk[:4], dtype=np.float32)[0]
            q = np.frombuffer(blk[4:260], dtype=np.int8).astype(np.float32)
            vals.append((q * d).astype(np.float32))
        vals = np.concatenate(vals)
        lines.append("q8_K " + " ".join(f"{v:08x}" for v in x.view(np.uint32)))
        lines.append("values " + " ".join(f"{v:08x}" for v in vals.view(np.uint32)))
    # Products as llama.cpp's CPU backend computes them: the activation row quantised by
    # `quantize_row_<vec_dot_type>`, then `ggml_vec_dot_<type>_<vec_dot_type>`.
    cpu = ctypes.CDLL(os.path.join(os.path.dirname(os.environ["LIBGGML"]), "libggml-cpu.so"))
    cpu.ggml_cpu_init()  # fills the fp16 tables the kernels read
    k = 512
    for name, qtype in TYPES + [("q8_0", T.Q8_0), ("mxfp4", T.MXFP4)]:
        act = {"q4_1": "q8_1", "q5_1": "q8_1", "f16": "f16"}.get(
            name, "q8_0" if name in SMALL else "q8_K")
        act_bytes = {"q8_K": 292 * k // 256, "q8_0": 34 * k // 32, "q8_1": 36 * k // 32,
                     "f16": 2 * k}[act]
        quant = getattr(cpu, QUANT_ACT.get(name, f"quantize_row_{act}"))
        quant.argtypes = ptrs
        dot = getattr(cpu, VEC_DOT.get(name, f"ggml_vec_dot_{name}_{act}"))
        dot.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
                        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                        ctypes.c_int]
        for _ in range(2):
            w = (rng.standard_normal(k) * 0.02).astype(np.float32)
            x = rng.standard_normal(k).astype(np.float32)
            x[5] = 9.0  # an outlier, as activations have
            wq = quantize(name, qtype, w)
            xq = ctypes.create_string_buffer(act_bytes)
            quant(x.ctypes.data, xq, k)
            out = ctypes.c_float()
            dot(k, ctypes.byref(out), 0, wq, 0, xq, 0, 1)
            lines.append(f"dot {name} {wq.hex()}")
            lines.append("x " + " ".join(f"{v:08x}" for v in x.view(np.uint32)))
            lines.append(f"value {np.float32(out.value).view(np.uint32):08x}")
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
