"""Quantises a GGUF file with llama.cpp's `llama-quantize` and prints the ggml types of the
result with their tensor counts. Exits 1 unless every type named by `--expect` is among
them (so a test knows the file holds what it means to exercise).

    python tools/gguf_quantize.py BIN_DIR IN.gguf OUT.gguf TYPE [--imatrix F] [--expect T ...]

BIN_DIR holds llama.cpp's tools (`llama-quantize`, `llama-imatrix`). TYPE is one of
llama-quantize's file types (Q4_K_M, IQ2_XXS, ...) or `ds4-q2`, the mix of antirez's ds4
q2 file: the routed experts' gate and up IQ2_XXS and their down Q2_K; attention, shared
experts and the head Q8_0; the token embeddings, indexer, compressors and mHC F16 (the
router stays as converted: llama-quantize does not quantise it); norms F32.

The input may hold quantised matrices already (the converter writes Q8_0 and MXFP4): they
are quantised again (`--allow-requantize`), as a user turning the published MXFP4_MOE file
into a smaller one does.

With `--imatrix F` the quantizer weighs each column by its importance (IQ1_*/IQ2_* need
it): F is llama-imatrix's output, computed here over the README if it does not exist yet.
llama.cpp 0c1e570 gives three kinds of V4 tensor no importance data: mHC's `hc_*_fn` and
the compressors' `_ape` (not products llama-imatrix observes) and `attn_output_a`, whose
grouped product llama-imatrix records per group (twice the columns), which llama-quantize
then refuses as the wrong size. So they get types that need none (F16, F32, Q8_0), as a
user of these tools must give them.
"""

import argparse
import collections
import os
import subprocess
import sys

from gguf import GGUFReader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_IMPORTANCE = ["--exclude-weights", "attn_output_a", "--tensor-type", "attn_output_a=q8_0",
                 "--tensor-type", "hc_=f16", "--tensor-type", "_ape=f32"]
# llama-quantize applies the first --tensor-type pattern a tensor's name matches.
RECIPES = {
    "ds4-q2": ("Q8_0", ["--tensor-type", "ffn_(gate|up)_exps=iq2_xxs",
                        "--tensor-type", "ffn_down_exps=q2_k",
                        "--tensor-type", "ffn_gate_inp|indexer|compressor|hc_=f16",
                        "--token-embedding-type", "f16", "--output-tensor-type", "q8_0"]),
}


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("type")
    ap.add_argument("--imatrix")
    ap.add_argument("--expect", nargs="*", default=[])
    args = ap.parse_args()
    ftype, options = RECIPES.get(args.type, (args.type, []))
    if args.imatrix:
        if not os.path.exists(args.imatrix):
            run([os.path.join(args.bin_dir, "llama-imatrix"), "-m", args.src,
                 "-f", os.path.join(ROOT, "README.md"), "-o", args.imatrix, "-c", "128",
                 "--chunks", "8", "--no-ppl", "-t", "2"])
        options = ["--imatrix", args.imatrix, *NO_IMPORTANCE, *options]
    run([os.path.join(args.bin_dir, "llama-quantize"), "--allow-requantize", *options,
         args.src, args.dst, ftype, "2"])
    types = collections.Counter(t.tensor_type.name for t in GGUFReader(args.dst).tensors)
    print(f"{args.dst}: " + ", ".join(f"{n} {c}" for n, c in sorted(types.items())))
    missing = [t for t in args.expect if t not in types]
    if missing:
        sys.exit(f"{args.dst} holds no {', '.join(missing)}")


if __name__ == "__main__":
    main()
