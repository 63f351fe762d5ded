#!/usr/bin/env python3
"""Encode/decode fixtures for crates/server/tests/tokenizer.rs.

Runs the Python `tokenizers` package (the same Rust library, different binding) on
assets/tokenizer/tokenizer.json and writes crates/server/tests/fixtures/tokenizer_cases.json.
Run by hand from the repository root; the output is committed (CI has no Python):

    python tools/make_tokenizer_fixtures.py
"""

import json
import os
import sys

import tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(ROOT, "assets", "tokenizer", "tokenizer.json")
OUT = os.path.join(ROOT, "crates", "server", "tests", "fixtures", "tokenizer_cases.json")

LONG = (
    "The quick brown fox jumps over the lazy dog. " * 3
    + "Serving engines batch requests continuously: prefill chunks and decode steps share one "
    "forward pass, the KV cache lives in fixed-size blocks, and speculative decoding proposes "
    "several tokens that the target model verifies at once. Numbers like 3.14159, 2026-12-03, "
    "1,234,567 and 0x1F600 are split into groups of at most three digits. "
    "长段落测试：深度学习模型的推理服务需要高效的批处理和内存管理。"
    "日本語の文章も含めます。カタカナとひらがな。"
)

CASES = [
    ("empty", ""),
    ("ascii_word", "hello"),
    ("ascii_sentence", "Hello, world! How are you today?"),
    ("leading_space", " leading space"),
    ("numbers", "1 12 123 1234 12345 3.14159 -42 1e10"),
    ("punctuation", "Wait... what?! (yes) [no] {maybe} <tag> a/b\\c 'q' \"qq\" @#$%^&*"),
    ("cjk_chinese", "你好，世界！今天天气很好。"),
    ("cjk_japanese", "こんにちは世界。カタカナ、ひらがな、漢字。"),
    ("cjk_korean", "안녕하세요 세계"),
    ("emoji_simple", "I ❤️ Rust 🦀🔥😀"),
    ("emoji_zwj", "family: 👨‍👩‍👧‍👦 tech: 👩🏽‍💻 rainbow flag: 🏳️‍🌈"),
    ("emoji_flags", "flags: 🇫🇷🇯🇵🇺🇸🇩🇪 done"),
    ("emoji_skin_tones", "👍🏻👍🏼👍🏽👍🏾👍🏿"),
    ("code_python", "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"),
    ("code_rust", "fn main() {\n\tlet v: Vec<u32> = (0..10).collect();\n\tprintln!(\"{:?}\", v);\n}\n"),
    ("whitespace_runs", "a  b   c    d\t\te\n\nf\r\ng \t \n h     "),
    ("only_spaces", "     "),
    ("only_newlines", "\n\n\n"),
    ("tabs_newlines", "\t\n\t\n  \t"),
    ("mixed_scripts", "English, Русский, Ελληνικά, العربية, עברית, हिन्दी, ไทย, 中文, 日本語"),
    ("accents_combining", "café naïve Zoë e\u0301 a\u0308"),
    ("math_symbols", "∀x∈ℝ: x² ≥ 0 ∑ ∫ √ ∞ ≠ ≈"),
    ("special_bos", "<｜begin▁of▁sentence｜>Hello"),
    ("special_chat", "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜><think>Easy.</think>4<｜end▁of▁sentence｜>"),
    ("special_inside_text", "before<｜User｜>middle<think>thinking</think>after"),
    ("special_adjacent", "<think></think><think>\n</think>"),
    ("special_spaced", " <｜User｜> hi <｜Assistant｜> there "),
    ("special_like_but_not", "<think <｜User| <|User|> </ think>"),
    ("json", '{"name": "deepinfer", "values": [1, 2, 3], "nested": {"ok": true}}'),
    ("url", "https://example.com/path?query=1&x=%20#frag"),
    ("control_chars", "a\u0000b\u0007c\u001bd"),
    ("long_paragraph", LONG),
]


def main():
    tok = tokenizers.Tokenizer.from_file(TOKENIZER)
    out = {
        "tokenizers_version": tokenizers.__version__,
        "tokenizer": "assets/tokenizer/tokenizer.json",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "token_ids": {
            s: tok.token_to_id(s)
            for s in [
                "<｜begin▁of▁sentence｜>",
                "<｜end▁of▁sentence｜>",
                "<｜User｜>",
                "<｜Assistant｜>",
                "<think>",
                "</think>",
            ]
        },
        "cases": [],
    }
    for name, text in CASES:
        ids = tok.encode(text, add_special_tokens=False).ids
        out["cases"].append(
            {
                "name": name,
                "text": text,
                "ids": ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
        )
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(CASES)} cases to {OUT} ({os.path.getsize(OUT)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
