#!/usr/bin/env python3
"""The header of a whole V4-Flash GGUF file as antirez's ds4 q2 file lays it out, for the
memory plan's test (crates/cli/src/engine_args.rs): no weights, only the metadata and every
tensor's name, type, shape and offset, so the test can give it a sparse data section and
plan it as the 81 GiB file it describes.

The template is `flash-slice` (V4-Flash's widths, six layers, 16 experts) as llama.cpp's
converter and then llama-quantize with the ds4-q2 recipe made it (tools/gguf_quantize.py;
`PEER=gguf PRESET=flash-slice QUANT=ds4-q2 tools/bench_peers.sh` leaves it in target/peers):
every tensor's type is the quantizer's choice. Its layers are repeated in V4-Flash's pattern
(43 layers, compress ratios [0, 0] + [4, 128] × 20 + [4], the first three hash-routed) and its
experts widened to V4-Flash's 256. The tokenizer's metadata is left out (the plan does not
read it). Run by hand, output committed:

    PYTHONPATH=target/peers/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py \\
        target/peers/venv/bin/python tools/make_gguf_plan_fixture.py \\
        target/peers/flash-slice-ds4-q2.gguf
"""

import os
import re
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf", "ds4-q2-flash.header.gguf")
LAYERS, EXPERTS = 43, 256
RATIOS = [0, 0] + [4, 128] * 20 + [4]


def template_layer(i):
    """The template's layer standing for V4-Flash's layer i: the two hash-routed
    sliding-window layers, the hash-routed CSA layer, then HCA (odd) and CSA (even)."""
    return i if i < 3 else (3 if i % 2 else 4)


def value(field):
    """A metadata field's value as gguf-py's writer takes it."""
    t = field.types[0]
    if t == GGUFValueType.ARRAY:
        return [field.parts[i].tolist()[0] for i in field.data], field.types[-1]
    if t == GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode(), None
    return field.parts[-1].tolist()[0], None


def main():
    src = GGUFReader(sys.argv[1])
    n_src = int(value(src.fields["deepseek4.block_count"])[0])
    w = GGUFWriter(OUT, "deepseek4")
    for name, field in src.fields.items():
        if name.startswith(("GGUF.", "tokenizer.", "general.architecture")):
            continue
        v, sub = value(field)
        if name == "deepseek4.block_count":
            v = LAYERS
        elif name == "deepseek4.expert_count":
            v = EXPERTS
        elif name == "deepseek4.attention.compress_ratios":
            v = RATIOS + v[n_src:]  # the MTP block's entries follow the layers'
        if sub is not None:
            w.add_key_value(name, v, GGUFValueType.ARRAY, sub)
        else:
            w.add_key_value(name, v, field.types[0])
    by_layer = {}
    for t in src.tensors:
        m = re.match(r"blk\.(\d+)\.(.*)", t.name)
        if m:
            by_layer.setdefault(int(m.group(1)), []).append((m.group(2), t))
    tensors = [(t.name, t) for t in src.tensors if not t.name.startswith("blk.")]
    for i in range(LAYERS):
        tensors += [(f"blk.{i}.{rest}", t) for rest, t in by_layer[template_layer(i)]]
    for j in range(n_src, max(by_layer) + 1):  # the MTP block(s)
        tensors += [(f"blk.{LAYERS + j - n_src}.{rest}", t) for rest, t in by_layer[j]]
    for name, t in tensors:
        ne = [int(d) for d in t.shape]
        if "_exps." in name:
            ne[2] = EXPERTS
        elif "ffn_gate_inp." in name:
            ne[1] = EXPERTS
        elif "exp_probs_b." in name:
            ne[0] = EXPERTS
        block, size = GGML_QUANT_SIZES[t.tensor_type]
        nbytes = int(np.prod(ne)) // block * size
        w.add_tensor_info(name, list(reversed(ne)), np.float32, nbytes, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    total = sum(ti.nbytes for ti in w.tensors[0].values())
    print(f"wrote {OUT}: {len(tensors)} tensors, {total / 2**30:.1f} GiB of weights")


if __name__ == "__main__":
    main()
