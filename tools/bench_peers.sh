#!/usr/bin/env bash
# deepinfer, llama.cpp and HF transformers side by side, on identical weights, in one run.
#
# The weights: the `bench-bf16` synthetic checkpoint (the `bench` preset's V4-Flash shape with
# BF16 dense projections and FP4 experts), which llama.cpp's converter packs losslessly into
# its GGUF (FP4 experts become MXFP4, the same bits) and HF loads after an exact dequant.
# llama.cpp comes from the PyPI source distribution of llama-cpp-python (no GitHub needed).
#
# Run by hand, not in CI: it downloads torch + transformers (several GB), builds llama.cpp
# (~6 min on 2 cores) and needs ~12 GB of RAM for the HF run. Everything lands in
# $PEERS_DIR (default target/peers). Prints one table; the raw JSON stays in $PEERS_DIR.
#
#   tools/bench_peers.sh            # all three
#   SKIP_HF=1 tools/bench_peers.sh  # deepinfer and llama.cpp only
set -euo pipefail
cd "$(dirname "$0")/.."
P=${PEERS_DIR:-target/peers}
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-3}
mkdir -p "$P"

# 1. Python for the converter and HF.
if [ ! -x "$P/venv/bin/python" ]; then
    python3 -m venv "$P/venv"
fi
"$P/venv/bin/pip" install --quiet --disable-pip-version-check torch "transformers==5.23.0" numpy safetensors sentencepiece

# 2. llama.cpp, from the llama-cpp-python 0.3.36 sdist (bundles llama.cpp 0c1e570, which has V4).
LLAMA="$P/llama_cpp_python-0.3.36/vendor/llama.cpp"
if [ ! -d "$LLAMA" ]; then
    "$P/venv/bin/pip" download --quiet --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d "$P/dl"
    tar xzf "$P/dl/llama_cpp_python-0.3.36.tar.gz" -C "$P"
fi
"$P/venv/bin/pip" install --quiet --disable-pip-version-check "$LLAMA/gguf-py"
if [ ! -x "$LLAMA/build/bin/llama-bench" ]; then
    command -v cmake >/dev/null || { echo "cmake is needed (apt-get install -y cmake)" >&2; exit 1; }
    cmake -S "$LLAMA" -B "$LLAMA/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF >/dev/null
    cmake --build "$LLAMA/build" -j"$THREADS" --target llama-bench >/dev/null
fi

# 3. The weights, once in deepinfer's format and once converted for llama.cpp.
cargo build --release --locked -p deepinfer-cli
BIN=target/release/deepinfer
MODEL="$P/bench-bf16"
[ -f "$MODEL/config.json" ] || "$BIN" synth --preset bench-bf16 --out "$MODEL"
GGUF="$P/bench-bf16.gguf"
[ -f "$GGUF" ] || "$P/venv/bin/python" "$LLAMA/convert_hf_to_gguf.py" "$MODEL" --outtype bf16 --outfile "$GGUF"

# 4. The runs, one after the other on an otherwise idle machine. Decode: batch 1, 64 tokens
#    (llama-bench's tg64 starts from an empty cache; deepinfer decodes at context 32, the
#    middle of those 64). Prefill: 128 and 512 tokens in one step.
"$BIN" bench model --model "$MODEL" --batch 1 --context 32 --prompt 128,512 -r "$REPS" --json "$P/deepinfer.json"
"$LLAMA/build/bin/llama-bench" -m "$GGUF" -t "$THREADS" -p 128,512 -n 64 -r "$REPS" -o json > "$P/llama.json"
if [ -z "${SKIP_HF:-}" ]; then
    "$P/venv/bin/python" tools/hf_bench.py "$MODEL" --threads "$THREADS" > "$P/hf.json"
fi

# 5. One table.
"$P/venv/bin/python" - "$P" <<'PY'
import json, os, sys
p = sys.argv[1]
d = json.load(open(os.path.join(p, "deepinfer.json")))
l = json.load(open(os.path.join(p, "llama.json")))
hf = json.load(open(os.path.join(p, "hf.json"))) if os.path.exists(os.path.join(p, "hf.json")) else None
def llama(n_prompt, n_gen):
    for r in l:
        if r["n_prompt"] == n_prompt and r["n_gen"] == n_gen:
            return r["avg_ts"]
rows = [("decode, batch 1 (tok/s)", d["decode"][0]["tokens_per_s"], llama(0, 64),
         hf["decode"]["tokens_per_s"] if hf else None)]
for pr in d["prefill"]:
    n = pr["tokens"]
    h = next((x["tokens_per_s"] for x in (hf or {}).get("prefill", []) if x["tokens"] == n), None)
    rows.append((f"prefill pp{n} (tok/s)", pr["tokens_per_s"], llama(n, 0), h))
print(f"roofs: {d['roofs']['read_gbs']:.1f} GB/s read, {d['roofs']['fma_gflops']:.1f} GFLOP/s f32 FMA ({d['isa']}, {d['threads']} threads)")
print(f"{'':28}{'deepinfer':>12}{'llama.cpp':>12}{'HF ' + (hf['dtype'] if hf else ''):>18}{'deepinfer/llama.cpp':>22}")
for name, a, b, c in rows:
    fmt = lambda v: f"{v:.2f}" if v is not None else "-"
    ratio = f"{a / b:.2f}x" if a and b else "-"
    print(f"{name:28}{fmt(a):>12}{fmt(b):>12}{fmt(c):>18}{ratio:>22}")
PY
