"""Quantises a GGUF file with llama.cpp's quantizer (`llama_model_quantize` of libllama, what
llama-quantize calls), through llama-cpp-python's bindings, and prints the ggml types of
the result with their tensor counts. Exits 1 unless every type named after the output file
is among them (so a test knows the file holds what it means to exercise).

    python tools/gguf_quantize.py IN.gguf OUT.gguf Q4_K_M [Q4_K Q6_K ...]
"""

import collections
import ctypes
import sys

import llama_cpp
from gguf import GGUFReader


@llama_cpp.llama_log_callback
def quiet(level, text, user_data):
    """The quantizer's per-tensor log, dropped (the bindings' own logger chokes on a log
    line cut inside a UTF-8 character)."""


def main():
    src, dst, ftype, *expect = sys.argv[1:]
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    # The converter's file holds Q8_0 and MXFP4 matrices already: quantise them again.
    params.allow_requantize = True
    params.nthread = 2
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) != 0:
        sys.exit(f"llama_model_quantize {src} -> {ftype} failed")
    types = collections.Counter(t.tensor_type.name for t in GGUFReader(dst).tensors)
    print(f"{dst}: " + ", ".join(f"{n} {c}" for n, c in sorted(types.items())))
    missing = [t for t in expect if t not in types]
    if missing:
        sys.exit(f"{dst} holds no {', '.join(missing)}")


if __name__ == "__main__":
    main()
