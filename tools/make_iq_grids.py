#!/usr/bin/env python3
"""The IQ formats' lattice grids for crates/kernels/src/ggml/grids.txt.

The IQ1/IQ2/IQ3 block formats store, per group of 8 (or 4) weights, an index into a fixed
table of points (`iq2xxs_grid`, `iq2xs_grid`, `iq2s_grid`, `iq3xxs_grid`, `iq3s_grid`,
`iq1s_grid` in `ggml/src/ggml-common.h` of llama.cpp 0c1e570): those tables are part of
the format, as a codebook is. This reads them from that header, checks each against the
grid gguf-py (same source tree, packed independently) decodes, and writes every point as
indices into the grid's few distinct values, one hex digit per value:

    grid <name> <points> <values per point> <the distinct values, signed decimal>
    <points, 16 per line, each `values per point` hex digits>

Run by hand from the repository root once tools/bench_peers.sh (or tools/gguf_e2e.sh with
GGUF_E2E_DIR) has unpacked llama.cpp; the output is committed:

    LLAMA=target/peers/llama_cpp_python-0.3.36/vendor/llama.cpp \
    PYTHONPATH=target/peers/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py \
        target/peers/venv/bin/python tools/make_iq_grids.py
"""

import os
import re

import numpy as np
from gguf import quants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "kernels", "src", "ggml", "grids.txt")
# (ggml's table, bytes per point and their C type, gguf-py's class holding the same grid)
GRIDS = [("iq2xxs_grid", 8, quants.IQ2_XXS), ("iq2xs_grid", 8, quants.IQ2_XS),
         ("iq2s_grid", 8, quants.IQ2_S), ("iq3xxs_grid", 4, quants.IQ3_XXS),
         ("iq3s_grid", 4, quants.IQ3_S), ("iq1s_grid", 8, quants.IQ1_S)]


def table(header, name):
    """The numbers of `GGML_TABLE_BEGIN(type, name, size) ... GGML_TABLE_END()`."""
    m = re.search(r"GGML_TABLE_BEGIN\(\w+, " + name + r", (\w+)\)(.*?)GGML_TABLE_END",
                  header, re.S)
    size = {"NGRID_IQ1S": 2048}.get(m.group(1)) or int(m.group(1))
    words = [int(w, 16) for w in re.findall(r"0x[0-9a-fA-F]+", m.group(2))]
    assert len(words) == size, (name, len(words), size)
    return words


def main():
    path = os.path.join(os.environ["LLAMA"], "ggml", "src", "ggml-common.h")
    with open(path) as f:
        header = f.read()
    lines = ["# tools/make_iq_grids.py: the IQ grids of llama.cpp 0c1e570's ggml-common.h,",
             "# checked against gguf-py's; each point as hex indices into the listed values"]
    for name, width, cls in GRIDS:
        words = table(header, name)
        # Point p's value j is byte j of its little-endian word (int8 for iq1s).
        points = np.array(words, dtype=np.uint64 if width == 8 else np.uint32)
        vals = points.view(np.uint8).reshape(-1, width)
        if name == "iq1s_grid":
            vals = vals.view(np.int8)
        cls.init_grid()
        theirs = cls.grid.reshape(-1, width)
        if not np.array_equal(vals.astype(np.float32), theirs):
            raise SystemExit(f"{name}: ggml-common.h and gguf-py disagree")
        distinct = sorted(set(vals.flatten().tolist()))
        assert len(distinct) <= 16
        index = {v: i for i, v in enumerate(distinct)}
        lines.append(f"grid {name} {len(vals)} {width} " + " ".join(map(str, distinct)))
        codes = ["".join(f"{index[v]:x}" for v in p.tolist()) for p in vals]
        lines += [" ".join(codes[i:i + 16]) for i in range(0, len(codes), 16)]
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
