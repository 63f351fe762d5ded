#!/usr/bin/env python3
"""Engram fixtures for crates/model/src/engram/ (the V4.1 n-gram hashing).

Runs tools/golden/engram.py (the reference written from vLLM 0.33's
``deepseek_v41/common/engram.py``) on assets/tokenizer/tokenizer.json and writes
tests/fixtures/engram/:

* ``engram.json``: the compressed token map's size, its SHA-256 and FNV-1a 64
  checksums (over the map as little-endian u32) and sampled (token id,
  compressed id) pairs; hash multipliers for the V4.1-Flash and tiny layer
  sets; both layouts (primes, offsets, rows per layer, pad and image token).
* ``streams.safetensors``: random token streams with image (dead) tokens and
  the expected table rows of every layer, for the tiny layout (``tiny.*``) and
  the V4.1-Flash layout (``flash.*``).

Run by hand from the repository root with the Python venv that has numpy,
tokenizers and safetensors; the output is committed (CI has no Python):

    python tools/make_engram_fixtures.py
"""

import hashlib
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden import engram  # noqa: E402
from golden.paths import ENGRAM as OUT, TOKENIZER  # noqa: E402

IMAGE_TOKEN_ID = 129264
PAD_TOKEN_ID = 2
LAYOUTS = {
    # DeepSeek-V4.1-Flash config.json.
    "flash": dict(layer_ids=[1, 14], engram_vocab_size=16000000, max_ngram=4, n_heads=8),
    # The tiny V4.1-style test config (docs/MODEL.md §10.3).
    "tiny": dict(layer_ids=[1, 3], engram_vocab_size=1000, max_ngram=4, n_heads=2),
}
STREAMS = {"tiny": (3, 2000), "flash": (1, 768)}
# (layer ids, max n-gram, compressed vocab) for multipliers alone: NumPy's 64-bit
# Lemire path (vocab 1, 50000), its 32-bit path (bound below 2**32) and a bound of 1.
MULTIPLIER_CASES = [
    ([1], 4, 1),
    ([100, 200], 4, 50000),
    ([0, 2, 5], 7, 3_000_000_000),
    ([7], 5, 1 << 31),
    ([2], 3, 1 << 62),
]


def fnv1a64(data: bytes) -> int:
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value


def to_json(value, indent: str = "") -> str:
    """JSON with objects one key a line and each list on one line."""
    if not isinstance(value, dict):
        return json.dumps(value, separators=(",", ": "))
    inner = indent + " "
    items = [f"{inner}{json.dumps(k)}: {to_json(v, inner)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + indent + "}"


def sample_tokens(tokenizer, token_map, rng) -> list[int]:
    """Token ids that exercise each branch of the map: special tokens, lone
    whitespace, partial UTF-8 bytes, accents and case, merged keys, random."""
    size = len(token_map)
    decoded = [tokenizer.decode([i], skip_special_tokens=False) for i in range(size)]
    chosen = [0, 1, 2, 3, 128000, 128001, 128799, IMAGE_TOKEN_ID, size - 1]
    whitespace = [i for i, t in enumerate(decoded) if t and not t.strip()]
    chosen += whitespace[:20]
    partial = [i for i, t in enumerate(decoded) if "\ufffd" in t]
    chosen += rng.choice(partial, 30, replace=False).tolist()
    accented = [
        i for i, t in enumerate(decoded) if any(c.isalpha() and not c.isascii() for c in t)
    ]
    chosen += rng.choice(accented, 30, replace=False).tolist()
    upper = [i for i, t in enumerate(decoded) if t.strip().istitle() or t.isupper()]
    chosen += rng.choice(upper, 30, replace=False).tolist()
    first_of = {}
    merged = []
    for i, cid in enumerate(token_map):
        if cid in first_of:
            merged += [first_of[cid], i]
        else:
            first_of[cid] = i
    pairs = rng.choice(len(merged) // 2, 20, replace=False)
    chosen += [merged[2 * k + j] for k in pairs.tolist() for j in (0, 1)]
    chosen += rng.choice(size, 50, replace=False).tolist()
    return sorted(set(int(i) for i in chosen))


def random_stream(rng, length: int, vocab: int) -> np.ndarray:
    """Random ids with scattered image tokens and one image span, one stream
    opening on an image token."""
    ids = rng.integers(0, vocab, size=length, dtype=np.int64)
    ids[rng.random(length) < 0.03] = IMAGE_TOKEN_ID
    span = int(rng.integers(0, length - 40))
    ids[span : span + 25] = IMAGE_TOKEN_ID
    if rng.random() < 0.5:
        ids[0] = IMAGE_TOKEN_ID
    return ids.astype(np.uint32)


def stream_tensors(name, layout, token_map, compressed_vocab, multipliers, pad_id, rng):
    primes, offsets, rows_per_layer = engram.layout(
        layout["layer_ids"], layout["engram_vocab_size"], layout["max_ngram"], layout["n_heads"]
    )
    count, length = STREAMS[name]
    ids = np.stack([random_stream(rng, length, len(token_map)) for _ in range(count)])
    dead = ids == IMAGE_TOKEN_ID
    rows = np.empty((count, len(layout["layer_ids"]), length, len(offsets[0])), dtype=np.int64)
    for s in range(count):
        compressed = [
            engram.DEAD_ID if d else token_map[t] for t, d in zip(ids[s].tolist(), dead[s])
        ]
        for layer in range(len(layout["layer_ids"])):
            rows[s, layer] = engram.hash_rows(
                compressed, layer, multipliers, primes, offsets, pad_id
            )
    assert rows.min() >= 0 and rows.max() < max(rows_per_layer)
    row_dtype = np.uint16 if max(rows_per_layer) <= 0xFFFF else np.uint32
    tensors = {
        f"{name}.ids": ids,
        f"{name}.dead": dead.astype(np.uint8),
        f"{name}.rows": rows.astype(row_dtype),
    }
    description = dict(
        layout,
        compressed_vocab=compressed_vocab,
        pad_token_id=PAD_TOKEN_ID,
        image_token_id=IMAGE_TOKEN_ID,
        multipliers=multipliers.tolist(),
        primes=primes,
        offsets=offsets.tolist(),
        rows_per_layer=rows_per_layer,
        streams=count,
        stream_len=length,
    )
    return tensors, description


def main() -> None:
    from tokenizers import Tokenizer

    token_map, compressed_vocab = engram.compressed_token_map(TOKENIZER)
    tokenizer = Tokenizer.from_file(TOKENIZER)
    rng = np.random.default_rng(4141)
    packed = np.asarray(token_map, dtype="<u4").tobytes()
    samples = sample_tokens(tokenizer, token_map, rng)
    pad_id = token_map[PAD_TOKEN_ID]

    tensors, layouts = {}, {}
    for name, layout in LAYOUTS.items():
        multipliers = engram.hash_multipliers(
            layout["layer_ids"], layout["max_ngram"], compressed_vocab
        )
        # No product of the rolling hash can wrap int64 (see golden/engram.py's docstring).
        assert (compressed_vocab - 1) * int(multipliers.max()) < 1 << 63
        part, layouts[name] = stream_tensors(
            name, layout, token_map, compressed_vocab, multipliers, pad_id, rng
        )
        tensors.update(part)

    os.makedirs(OUT, exist_ok=True)
    doc = {
        "generator": "tools/make_engram_fixtures.py",
        "tokenizer": {
            "vocab_size": len(token_map),
            "compressed_vocab": compressed_vocab,
            "map_sha256_le_u32": hashlib.sha256(packed).hexdigest(),
            "map_fnv1a64_le_u32": f"{fnv1a64(packed):016x}",
            "samples": [[i, token_map[i]] for i in samples],
        },
        "layouts": layouts,
        "multiplier_cases": [
            {
                "layer_ids": ids,
                "max_ngram": n,
                "compressed_vocab": vocab,
                "values": engram.hash_multipliers(ids, n, vocab).tolist(),
            }
            for ids, n, vocab in MULTIPLIER_CASES
        ],
    }
    with open(os.path.join(OUT, "engram.json"), "w") as f:
        f.write(to_json(doc) + "\n")
    save_file(tensors, os.path.join(OUT, "streams.safetensors"))
    print(f"compressed vocab {compressed_vocab}, {len(samples)} samples -> {OUT}")


if __name__ == "__main__":
    main()
