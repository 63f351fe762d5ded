"""DeepSeek-V4.1 Engram n-gram hashing, written from vLLM 0.33's description.

An importable reference for the V4.1 scripts and the fixtures of the Rust port
(crates/model/src/engram/). Each function follows one piece of vLLM's
``vllm/models/deepseek_v41/common/engram.py``:

* ``compressed_token_map`` -> ``build_compressed_token_map``: every token id
  onto a smaller id space where tokens that normalise alike share an id.
* ``hash_multipliers`` -> ``compute_hash_multipliers``: one odd multiplier per
  (layer, shift) from ``numpy.random.default_rng(10007 * layer_id)``.
* ``layout`` -> ``EngramLayout.__init__``: the prime bucket sizes per
  (layer, n-gram size, head), their offsets inside a layer's table, and the
  table's row count (the sum of the layer's primes).
* ``hash_rows`` -> ``_hash_ids_kernel`` as ``NgramHashState.forward`` runs it
  with every lookback id known (the V2 runner), for a stream that starts at
  position 0.

Integer range: the multiplier bound is ``(2**63 - 1) // compressed_vocab // 2``
and a multiplier is ``2 * U + 1`` with ``U < bound``, so it is at most
``(2**63 - 1) // compressed_vocab - 1``; any compressed id (pad included) is
below ``compressed_vocab``, so ``id * multiplier < 2**63`` and no product wraps.
The XOR of non-negative values below ``2**63`` stays below ``2**63``, so the
rolling hash stays non-negative and the kernel's truncating ``%`` equals
Python's flooring ``%``. ``hash_rows`` still computes the products with int64
wrap-around and a truncating remainder, so it keeps matching the kernel even
for multipliers that break the bound.
"""

from __future__ import annotations

import numpy as np

DEAD_ID = -1
"""Compressed id of a token that takes no part in an n-gram (image tokens)."""

_HASH_SEED_STRIDE = 10007
_I64_MOD = 1 << 64


def compressed_token_map(tokenizer_json_path: str) -> tuple[list[int], int]:
    """Token id -> compressed id for every id below the vocabulary size, and the
    number of distinct compressed ids.

    Follows ``build_compressed_token_map``: the raw decode of each single token
    (no cleanup of tokenisation spaces) is normalised NFKC -> NFD -> strip
    accents -> lowercase -> collapse whitespace runs -> strip, a lone space kept
    through a private-use sentinel; a decode containing U+FFFD (a partial UTF-8
    byte token) is keyed by its raw vocabulary piece instead. Compressed ids are
    handed out in order of first appearance.
    """
    from tokenizers import Regex, Tokenizer, normalizers

    tokenizer = Tokenizer.from_file(tokenizer_json_path)
    sentinel = "\ue000"
    normalizer = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), sentinel),
            normalizers.Strip(),
            normalizers.Replace(sentinel, " "),
        ]
    )
    # `len(tokenizer)` of a transformers fast tokenizer.
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    key_to_new: dict[str, int] = {}
    lookup = [0] * vocab_size
    for token_id in range(vocab_size):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tokenizer.id_to_token(token_id)
        else:
            normalized = normalizer.normalize_str(text)
            key = normalized if normalized else text
        lookup[token_id] = key_to_new.setdefault(key, len(key_to_new))
    return lookup, len(key_to_new)


def hash_multipliers(
    layer_ids: list[int], max_ngram: int, compressed_vocab: int
) -> np.ndarray:
    """int64 ``[len(layer_ids), max_ngram]``: ``2 * U + 1`` with ``U`` drawn by
    ``default_rng(10007 * layer_id).integers(0, bound, size=max_ngram)``, as
    ``compute_hash_multipliers``."""
    max_long = np.iinfo(np.int64).max
    bound = max(1, (max_long // compressed_vocab) // 2)
    rows = []
    for layer_id in layer_ids:
        rng = np.random.default_rng(_HASH_SEED_STRIDE * layer_id)
        values = rng.integers(low=0, high=bound, size=(max_ngram,), dtype=np.int64)
        rows.append(values * 2 + 1)
    return np.stack(rows).astype(np.int64)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    divisor = 3
    while divisor * divisor <= n:
        if n % divisor == 0:
            return False
        divisor += 2
    return True


def layout(
    layer_ids: list[int], engram_vocab_size: int, max_ngram: int, n_heads: int
) -> tuple[list[list[list[int]]], np.ndarray, list[int]]:
    """``(primes, offsets, rows_per_layer)`` as ``EngramLayout.__init__``.

    ``primes[layer][ngram - 2][head]``: each (layer, n-gram size) searches
    upward from ``engram_vocab_size - 1`` for ``n_heads`` primes never handed out
    before, so every bucket range in the model has its own prime.
    ``offsets`` int64 ``[layers, (max_ngram - 1) * n_heads]``: where each
    bucket range starts in its layer's table (cumulative sums of the layer's
    primes in (n-gram, head) order). ``rows_per_layer``: the table's rows.
    """
    seen: set[int] = set()
    primes = []
    for _ in layer_ids:
        per_ngram = []
        for _ in range(max_ngram - 1):
            sizes, current = [], engram_vocab_size - 1
            for _ in range(n_heads):
                current += 1
                while not _is_prime(current) or current in seen:
                    current += 1
                seen.add(current)
                sizes.append(current)
            per_ngram.append(sizes)
        primes.append(per_ngram)
    flat = [[p for sizes in layer for p in sizes] for layer in primes]
    offsets = np.array(
        [np.cumsum([0, *sizes[:-1]]) for sizes in flat], dtype=np.int64
    )
    rows_per_layer = [sum(sizes) for sizes in flat]
    return primes, offsets, rows_per_layer


def _wrap_i64(value: int) -> int:
    value %= _I64_MOD
    return value - _I64_MOD if value >= 1 << 63 else value


def _trunc_rem(value: int, modulus: int) -> int:
    """C / Triton remainder: takes the sign of the dividend."""
    rem = abs(value) % modulus
    return -rem if value < 0 else rem


def hash_rows(
    compressed_ids: list[int],
    layer_index: int,
    multipliers: np.ndarray,
    primes: list[list[list[int]]],
    offsets: np.ndarray,
    pad_id: int,
) -> np.ndarray:
    """int64 ``[T, (max_ngram - 1) * n_heads]``: the table row of every
    (position, n-gram size, head) of one layer, for a stream starting at
    position 0.

    ``compressed_ids[p]`` is the compressed id at position ``p`` or ``DEAD_ID``.
    ``layer_index`` indexes ``multipliers`` / ``primes`` / ``offsets`` (not the
    model layer id). ``pad_id`` is the compressed id of the pad token
    (``token_map[engram_pad_token_id]``). As ``_hash_ids_kernel``: shift ``s``
    reads position ``p - s``; once that or a smaller shift fell before position
    0 or met a dead token, the value is ``pad_id``; ``rolling ^= value * M[s]``
    and, for ``s >= 1``, column ``(s - 1) * n_heads + h`` gets
    ``rolling % P[s-1][h] + offset``.
    """
    layer_mult = [int(m) for m in multipliers[layer_index]]
    layer_primes = primes[layer_index]
    layer_offsets = [int(o) for o in offsets[layer_index]]
    max_ngram = len(layer_mult)
    n_heads = len(layer_primes[0])
    out = np.empty((len(compressed_ids), (max_ngram - 1) * n_heads), dtype=np.int64)
    for pos in range(len(compressed_ids)):
        blocked = False
        rolling = 0
        for shift in range(max_ngram):
            lookback = pos - shift
            source = compressed_ids[lookback] if lookback >= 0 else DEAD_ID
            blocked = blocked or lookback < 0 or source == DEAD_ID
            value = pad_id if blocked else source
            rolling = _wrap_i64(rolling ^ _wrap_i64(value * layer_mult[shift]))
            if shift == 0:
                continue
            for head in range(n_heads):
                col = (shift - 1) * n_heads + head
                rem = _trunc_rem(rolling, layer_primes[shift - 1][head])
                out[pos, col] = rem + layer_offsets[col]
    return out
