#!/usr/bin/env bash
# deepinfer, llama.cpp and HF transformers side by side, on the same weights, in one run.
#
# Three pairings (PEER=fp8, the default, PEER=bf16 or PEER=gguf):
#  - fp8: the `bench` preset as DeepSeek ships V4 (FP8 e4m3 dense with E8M0 block scales, FP4
#    experts), deepinfer with --numerics official, against llama.cpp on the GGUF its users
#    make of such a checkpoint: `convert_hf_to_gguf.py --outtype q8_0` (the FP8 projections
#    dequantised and requantised to Q8_0, the FP4 experts repacked to MXFP4 — the same bits;
#    head, embedding and compressors BF16). No HF run (its FP8 path is not a CPU one).
#  - bf16: the `bench-bf16` preset (the same shape with BF16 dense projections), which the
#    converter packs losslessly (`--outtype bf16`) and HF loads after an exact dequant;
#    deepinfer in reference numerics; HF too unless SKIP_HF=1.
#  - gguf: the fp8 pairing's GGUF file in both engines (deepinfer with --numerics gguf,
#    llama.cpp's arithmetic): the same bytes per token, the same file.
# llama.cpp comes from the PyPI source distribution of llama-cpp-python (no GitHub needed).
#
# Run by hand, not in CI: it downloads torch + transformers (several GB), builds llama.cpp
# (~6 min on 2 cores) and needs ~12 GB of RAM for the HF run. Everything lands in
# $PEERS_DIR (default target/peers). Prints one table; the raw JSON stays in $PEERS_DIR.
#
#   tools/bench_peers.sh                      # FP8 bench preset vs llama.cpp Q8_0 + MXFP4
#   PEER=bf16 tools/bench_peers.sh            # BF16 preset: deepinfer, llama.cpp, HF
#   PEER=bf16 SKIP_HF=1 tools/bench_peers.sh  # deepinfer and llama.cpp only
#   PRESET=flash-slice tools/bench_peers.sh   # V4-Flash's own shapes (FP8 pairing)
#   PEER=gguf PRESET=flash-slice tools/bench_peers.sh  # one GGUF file in both engines
#   PEER=gguf PRESET=flash-slice QUANT=Q4_K_M tools/bench_peers.sh  # llama-quantize's file
#   PEER=gguf PRESET=flash-slice QUANT=ds4-q2 tools/bench_peers.sh  # as antirez's q2 file
set -euo pipefail
cd "$(dirname "$0")/.."
P=${PEERS_DIR:-target/peers}
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-2}
PEER=${PEER:-fp8}
case "$PEER" in
    fp8) PRESET=${PRESET:-bench} OUTTYPE=q8_0 NUMERICS=official SKIP_HF=1 ;;
    bf16) PRESET=bench-bf16 OUTTYPE=bf16 NUMERICS=reference ;;
    gguf) PRESET=${PRESET:-bench} OUTTYPE=q8_0 NUMERICS=gguf SKIP_HF=1 ;;
    *) echo "PEER is fp8, bf16 or gguf" >&2; exit 1 ;;
esac
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
# On a CPU with AMX, this llama.cpp's AMX buffer type aborts on V4's graph
# (`GGML_ASSERT(*cur_backend_id != -1)` in ggml-backend.cpp); built for AVX-512 without AMX,
# its weight repacking (the faster path) works, so that is the peer there.
if grep -q amx_tile /proc/cpuinfo; then
    ISA_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
        -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    LLAMA_BUILD="$LLAMA/build-noamx"
else
    ISA_FLAGS="-DGGML_NATIVE=ON"
    LLAMA_BUILD="$LLAMA/build"
fi
if [ ! -x "$LLAMA_BUILD/bin/llama-bench" ]; then
    command -v cmake >/dev/null || { echo "cmake is needed (apt-get install -y cmake)" >&2; exit 1; }
    # shellcheck disable=SC2086
    cmake -S "$LLAMA" -B "$LLAMA_BUILD" -DCMAKE_BUILD_TYPE=Release $ISA_FLAGS \
        -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF >/dev/null
    cmake --build "$LLAMA_BUILD" -j"$THREADS" --target llama-bench >/dev/null
fi
[ -z "${QUANT:-}" ] || [ -x "$LLAMA_BUILD/bin/llama-imatrix" ] ||
    cmake --build "$LLAMA_BUILD" -j"$THREADS" --target llama-quantize llama-imatrix >/dev/null

# 3. The weights, once in deepinfer's format and once converted for llama.cpp.
cargo build --release --locked -p deepinfer-cli
BIN=target/release/deepinfer
MODEL="$P/$PRESET"
[ -f "$MODEL/config.json" ] || "$BIN" synth --preset "$PRESET" --out "$MODEL"
GGUF="$P/$PRESET-$OUTTYPE.gguf"
[ -f "$GGUF" ] || "$P/venv/bin/python" "$LLAMA/convert_hf_to_gguf.py" "$MODEL" --outtype "$OUTTYPE" --outfile "$GGUF"
# gguf with QUANT (Q4_K_M, Q2_K, IQ2_XXS, ds4-q2, ...): that file requantised by
# llama.cpp's quantizer, with an importance matrix for the types that need one.
if [ "$PEER" = gguf ] && [ -n "${QUANT:-}" ]; then
    SRC=$GGUF
    GGUF="$P/$PRESET-$QUANT.gguf"
    imatrix=()
    case "$QUANT" in IQ*|ds4-*) imatrix=(--imatrix "$P/$PRESET-imatrix.gguf") ;; esac
    [ -f "$GGUF" ] || "$P/venv/bin/python" tools/gguf_quantize.py "$LLAMA_BUILD/bin" "$SRC" \
        "$GGUF" "$QUANT" "${imatrix[@]}"
fi

# 4. The runs, alternating engine by engine for $ROUNDS rounds: this machine is shared, and
#    its bandwidth and FMA rate drift from one minute to the next, so each round's ratio
#    compares runs made minutes apart at most, and the table gives the medians. Decode:
#    batch 1, 64 tokens (llama-bench's tg64 starts from an empty cache; deepinfer decodes at
#    context 32, the middle of those 64). Prefill: 128 and 512 tokens in one step.
#    A deepinfer repetition times one decode step where llama-bench's averages 64 tokens, so
#    deepinfer runs four times the repetitions (their median) to be as little at the mercy
#    of one noisy moment.
ROUNDS=${ROUNDS:-5}
# What deepinfer loads: the checkpoint, or (gguf) llama.cpp's file itself.
DMODEL=$MODEL
[ "$PEER" = gguf ] && DMODEL=$GGUF
rm -f "$P"/deepinfer.*.json "$P"/llama.*.json "$P/hf.json"
for i in $(seq 1 "$ROUNDS"); do
    "$BIN" bench model --model "$DMODEL" --numerics "$NUMERICS" --threads "$THREADS" --batch 1 --context 32 \
        --prompt 128,512 -r "$((4 * REPS))" --json "$P/deepinfer.$i.json" >/dev/null
    "$LLAMA_BUILD/bin/llama-bench" -m "$GGUF" -t "$THREADS" -p 128,512 -n 64 -r "$REPS" \
        -o json > "$P/llama.$i.json"
done
if [ -z "${SKIP_HF:-}" ]; then
    "$P/venv/bin/python" tools/hf_bench.py "$MODEL" --threads "$THREADS" > "$P/hf.json"
fi

# 5. One table: per measurement, the median over the rounds of each engine and of the
#    per-round ratio.
"$P/venv/bin/python" - "$P" "$ROUNDS" <<'PY'
import json, os, statistics, sys
p, rounds = sys.argv[1], int(sys.argv[2])
hf = json.load(open(os.path.join(p, "hf.json"))) if os.path.exists(os.path.join(p, "hf.json")) else None
def ours(d, what):
    if what == "decode":
        return d["decode"][0]["tokens_per_s"]
    return next(r["tokens_per_s"] for r in d["prefill"] if r["tokens"] == what)
def theirs(l, what):
    n_prompt, n_gen = (0, 64) if what == "decode" else (what, 0)
    return next(r["avg_ts"] for r in l if r["n_prompt"] == n_prompt and r["n_gen"] == n_gen)
runs = [(json.load(open(os.path.join(p, f"deepinfer.{i}.json"))),
         json.load(open(os.path.join(p, f"llama.{i}.json")))) for i in range(1, rounds + 1)]
d0 = runs[0][0]
print(f"{rounds} rounds, {d0['isa']}, {d0['threads']} threads; deepinfer's decode at "
      f"{statistics.median(d['decode'][0]['pct_of_bandwidth'] for d, _ in runs):.0f} % of the read roof (median)")
hdr = "HF " + hf["dtype"] if hf else "HF"
print(f"{'':24}{'deepinfer':>11}{'llama.cpp':>11}{hdr:>16}{'ratio (median)':>16}{'ratio range':>16}")
for what, name in [("decode", "decode, batch 1"), (128, "prefill pp128"), (512, "prefill pp512")]:
    a = [ours(d, what) for d, _ in runs]
    b = [theirs(l, what) for _, l in runs]
    r = [x / y for x, y in zip(a, b)]
    h = None
    if hf:
        h = hf["decode"]["tokens_per_s"] if what == "decode" else next(
            (x["tokens_per_s"] for x in hf.get("prefill", []) if x["tokens"] == what), None)
    hs = f"{h:.2f}" if h is not None else "-"
    print(f"{name + ' (tok/s)':24}{statistics.median(a):>11.2f}{statistics.median(b):>11.2f}{hs:>16}"
          f"{statistics.median(r):>15.2f}x{min(r):>10.2f}-{max(r):.2f}x")
PY
