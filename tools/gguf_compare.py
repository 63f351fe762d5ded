"""deepinfer against llama.cpp on one GGUF file: greedy tokens and their log-probabilities.

For each prompt (token ids), llama.cpp (through llama-cpp-python's bindings on the libllama
built by tools/gguf_e2e.sh) decodes greedily; `deepinfer generate` does the same with
`--numerics gguf` (llama.cpp's arithmetic) and `--numerics reference` (f32 activations). The
tokens must be equal wherever llama.cpp's choice is tie-safe (its top two log-probabilities
more than MARGIN apart; after the first unsafe step the rest is not compared), and the chosen
tokens' log-probabilities within TOL. A synthetic model's next-token distribution is flat, so
many prompts start with a near tie: those are skipped, and at least MIN_PROMPTS must compare.
Its router scores are as flat: where two experts nearly tie, the two engines' roundings (the
f16 KV cache and bf16 router inputs of llama.cpp) can pick different ones and the rest of a
prompt differs by more than rounding. So a prompt may mismatch, but not more than a quarter
of them for either numerics, and the median log-probability difference of the equal steps
must stay within MEDIAN_TOL. Exit status 1 otherwise.

    python tools/gguf_compare.py DEEPINFER_BIN MODEL.gguf
"""

import json
import subprocess
import sys

import numpy as np
import llama_cpp

# Lengths from a few tokens to past the tiny preset's sliding window (16) and one HCA
# compression block (128).
PROMPTS = [[0] + [(i * 7919 + 104729 * n) % 128000 for i in range(1, length)]
           for n, length in enumerate([8, 10, 24, 41, 60, 100, 140, 160, 200, 260])]
MIN_PROMPTS = 4
STEPS = 8
MARGIN = 0.05
TOL = 0.1
MEDIAN_TOL = 0.05


def llama(model, ids):
    """Greedy tokens, their log-probabilities and the top-two margins."""
    llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_batch=512, logits_all=True,
                          n_threads=2, verbose=False)
    llm.eval(ids)
    toks, lps, margins = [], [], []
    for _ in range(STEPS):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        lp = logits - (np.log(np.exp(logits - logits.max()).sum()) + logits.max())
        top = np.argsort(-lp)[:2]
        toks.append(int(top[0]))
        lps.append(float(lp[top[0]]))
        margins.append(float(lp[top[0]] - lp[top[1]]))
        llm.eval([int(top[0])])
    return toks, lps, margins


def deepinfer(binary, model, ids, numerics):
    out = subprocess.run(
        [binary, "generate", "--model", model, "--numerics", numerics,
         "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(STEPS),
         "--top-logprobs", "1", "--json"],
        check=True, capture_output=True, text=True).stdout
    d = json.loads(out.strip().splitlines()[-1])
    return d["token_ids"], [t[0]["logprob"] for t in d["top_logprobs"]]


def main():
    binary, model = sys.argv[1], sys.argv[2]
    failed = False
    compared_prompts = 0
    mismatched = {"gguf": 0, "reference": 0}
    diffs = {"gguf": [], "reference": []}
    for ids in PROMPTS:
        want, want_lp, margins = llama(model, ids)
        if margins[0] <= MARGIN:
            print(f"prompt of {len(ids):3} tokens: skipped (llama.cpp's first choice is a near tie)")
            continue
        compared_prompts += 1
        for numerics in ["gguf", "reference"]:
            got, got_lp = deepinfer(binary, model, ids, numerics)
            compared = 0
            worst = 0.0
            for step, (w, g, wl, gl, m) in enumerate(zip(want, got, want_lp, got_lp, margins)):
                if m <= MARGIN:
                    break
                compared += 1
                worst = max(worst, abs(wl - gl))
                if w != g or abs(wl - gl) > TOL:
                    mismatched[numerics] += 1
                    print(f"mismatch: {numerics} prompt of {len(ids)} step {step}: "
                          f"llama.cpp {w} ({wl:.4f}), deepinfer {g} ({gl:.4f})")
                    break
                diffs[numerics].append(abs(wl - gl))
            print(f"{numerics:9} prompt of {len(ids):3} tokens: {compared}/{STEPS} tie-safe steps "
                  f"equal, largest log-prob difference {worst:.4f}")
    if compared_prompts < MIN_PROMPTS:
        failed = True
        print(f"only {compared_prompts} prompts were tie-safe; at least {MIN_PROMPTS} must be")
    for numerics, n in mismatched.items():
        median = float(np.median(diffs[numerics])) if diffs[numerics] else float("inf")
        print(f"{numerics}: {n} of {compared_prompts} prompts mismatched; median log-prob "
              f"difference {median:.4f} over {len(diffs[numerics])} equal steps")
        if 4 * n > compared_prompts or median > MEDIAN_TOL:
            failed = True
    print("FAILED" if failed else "ok")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
