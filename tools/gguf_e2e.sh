#!/usr/bin/env bash
# GGUF end to end against llama.cpp: llama.cpp's own converter makes the file from a synthetic
# checkpoint (`synth --preset tiny-gguf`: V4's layout at toy width, the real vocabulary), and
# llama.cpp runs it beside deepinfer (tools/gguf_compare.py: greedy tokens and log-probs, in
# gguf and reference numerics); likewise the files llama.cpp's quantizer makes (K-quants,
# 32-block types, and with an importance matrix from llama-imatrix the IQ lattice types and
# a mix as antirez's ds4 q2 file's). Then deepinfer generates from text with the file's own tokenizer, streams
# experts to the resident bits, and refuses a truncated copy with a one-line error.
#
# llama.cpp 0c1e570 comes from the PyPI source distribution of llama-cpp-python 0.3.36 (its
# converter, gguf-py, libllama built here for the Python bindings, llama-quantize and
# llama-imatrix). Needs Python 3 with
# venv, cmake and a C++ compiler; installs torch and transformers (the converter's) into
# $GGUF_E2E_DIR (default target/gguf-e2e). Run by CI (.ci/run) and by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
D=${GGUF_E2E_DIR:-target/gguf-e2e}
BIN=${DEEPINFER_BIN:-target/debug/deepinfer}
mkdir -p "$D"
start=$(date +%s)

# 1. Python: the converter's packages and the bindings'.
[ -x "$D/venv/bin/python" ] || python3 -m venv "$D/venv"
PY="$D/venv/bin/python"
"$PY" -m pip install --quiet --disable-pip-version-check torch "transformers==5.23.0" numpy \
    safetensors sentencepiece diskcache jinja2 typing-extensions

# 2. llama.cpp: the sdist's converter and gguf-py, libllama and the quantizer's tools.
SDIST="$D/llama_cpp_python-0.3.36"
LLAMA="$SDIST/vendor/llama.cpp"
if [ ! -d "$LLAMA" ]; then
    "$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        llama-cpp-python==0.3.36 -d "$D/dl"
    tar xzf "$D/dl/llama_cpp_python-0.3.36.tar.gz" -C "$D"
fi
"$PY" -m pip install --quiet --disable-pip-version-check "$LLAMA/gguf-py"
# As in tools/bench_peers.sh: this llama.cpp's AMX buffer type aborts on V4's graph.
if grep -q amx_tile /proc/cpuinfo; then
    ISA_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
        -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
else
    ISA_FLAGS="-DGGML_NATIVE=ON"
fi
BUILD="$LLAMA/build-e2e"
if [ ! -e "$BUILD/bin/llama-imatrix" ] || [ ! -e "$BUILD/bin/llama-quantize" ]; then
    command -v cmake >/dev/null || { echo "cmake is needed (apt-get install -y cmake)" >&2; exit 1; }
    # shellcheck disable=SC2086
    cmake -S "$LLAMA" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release $ISA_FLAGS -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >/dev/null
    cmake --build "$BUILD" -j"$(nproc)" --target llama llama-quantize llama-imatrix >/dev/null
fi
echo "gguf e2e: tools ready after $(($(date +%s) - start)) s"

# 3. The file, made by llama.cpp's converter.
[ -x "$BIN" ] || cargo build --locked -p deepinfer-cli
rm -rf "$D/tiny-gguf" "$D/tiny-gguf.gguf"
"$BIN" synth --preset tiny-gguf --out "$D/tiny-gguf"
"$PY" "$LLAMA/convert_hf_to_gguf.py" "$D/tiny-gguf" --outfile "$D/tiny-gguf.gguf" 2>&1 | tail -1

# 4. deepinfer beside llama.cpp.
LLAMA_CPP_LIB_PATH="$BUILD/bin" PYTHONPATH="$SDIST" "$PY" tools/gguf_compare.py "$BIN" \
    "$D/tiny-gguf.gguf" 2> >(grep -v '^llama_\|^ggml\|^load\|^print_info' >&2)

# 4b. The files llama.cpp's quantizer makes (llama-quantize: tools/gguf_quantize.py, which
#     checks each file holds the types named), from `tiny-kquant` (256-wide rows, so the
#     K-quants are not replaced by their 32-block fallbacks everywhere): every K-quant,
#     IQ4_XS, the 32-block types and IQ4_NL. The Q8_K files compare in gguf numerics, where
#     more prompts may flip (see tools/gguf_compare.py).
rm -rf "$D/tiny-kquant" "$D"/tiny-kquant*.gguf "$D/imatrix.gguf"
"$BIN" synth --preset tiny-kquant --out "$D/tiny-kquant"
"$PY" "$LLAMA/convert_hf_to_gguf.py" "$D/tiny-kquant" --outfile "$D/tiny-kquant.gguf" 2>&1 | tail -1
opts=() # tools/gguf_quantize.py's options for the files that follow
quantized() { # NAME TYPE TYPES-IT-MUST-HOLD... -- COMPARE-ARGS...
    local ftype=$2 types=() out="$D/tiny-kquant-$1.gguf"
    shift 2
    while [ "$1" != -- ]; do types+=("$1"); shift; done
    shift
    PYTHONPATH="$SDIST" "$PY" tools/gguf_quantize.py "$BUILD/bin" "$D/tiny-kquant.gguf" "$out" \
        "$ftype" --expect "${types[@]}" "${opts[@]}"
    LLAMA_CPP_LIB_PATH="$BUILD/bin" PYTHONPATH="$SDIST" "$PY" tools/gguf_compare.py "$BIN" \
        "$out" "$@" 2> >(grep -v '^llama_\|^ggml\|^load\|^print_info' >&2) | tail -2
}
kquant=(--numerics gguf --max-mismatched 0.4)
quantized Q4_K_M Q4_K_M Q4_K Q6_K Q5_0 -- "${kquant[@]}"
quantized Q2_K Q2_K Q2_K Q3_K Q4_0 -- "${kquant[@]}"
quantized Q5_K_M Q5_K_M Q5_K Q5_1 -- "${kquant[@]}"
quantized IQ4_XS IQ4_XS IQ4_XS IQ4_NL -- "${kquant[@]}"
quantized Q4_1 Q4_1 Q4_1 --

# 4c. The lattice types, quantised with an importance matrix as llama.cpp requires (for
#     IQ1/IQ2 it refuses without one), which llama-imatrix computes on the file over the
#     README (tools/gguf_quantize.py: also which V4 tensors it gives none, and their types);
#     and a file mixed as antirez's ds4 q2 is.
opts=(--imatrix "$D/imatrix.gguf")
quantized IQ1_S IQ1_S IQ1_S -- "${kquant[@]}"
quantized IQ1_M IQ1_M IQ1_M -- "${kquant[@]}"
quantized IQ2_S IQ2_S IQ2_XS IQ3_S -- "${kquant[@]}"
quantized IQ2_M IQ2_M IQ2_S IQ3_S -- "${kquant[@]}"
quantized IQ3_XXS IQ3_XXS IQ3_XXS -- "${kquant[@]}"
quantized q2 ds4-q2 IQ2_XXS Q2_K Q8_0 F16 -- "${kquant[@]}"

# 5. Text in and out through the file's own tokenizer (no tokenizer.json beside it).
out=$("$BIN" generate --model "$D/tiny-gguf.gguf" --prompt "The capital of France is" \
    --max-tokens 4 --json 2>/dev/null | tail -1)
echo "$out" | "$PY" -c 'import json,sys; d=json.loads(sys.stdin.read()); assert d["prompt_ids"][:2] == [671, 6102], d; assert len(d["token_ids"]) == 4, d'

# 6. The routed experts streamed from the file through a small cache: the same tokens and
#    log-probabilities, bit for bit, as resident.
for f in tiny-gguf tiny-kquant-Q4_K_M tiny-kquant-q2; do
    run() { "$BIN" generate --model "$D/$f.gguf" --prompt-ids 0,5,6,7,8,9 --max-tokens 6 \
        --top-logprobs 2 --json "$@" 2>/dev/null | tail -1; }
    resident=$(run)
    streamed=$(run --expert-cache-mib 1)
    [ "$resident" = "$streamed" ] || { echo "$f: streamed experts differ: $resident vs $streamed" >&2; exit 1; }
done

# 7. A truncated file: one line naming it, no panic.
head -c 40000000 "$D/tiny-gguf.gguf" > "$D/truncated.gguf"
if err=$("$BIN" generate --model "$D/truncated.gguf" --prompt-ids 0,1 --max-tokens 1 2>&1); then
    echo "a truncated GGUF loaded" >&2
    exit 1
fi
echo "$err" | grep -q "truncated.gguf.*truncated" || { echo "unexpected error: $err" >&2; exit 1; }
echo "$err" | grep -qi "panicked" && { echo "panicked: $err" >&2; exit 1; }
rm -f "$D/truncated.gguf"
echo "gguf e2e passed in $(($(date +%s) - start)) s"
