//! The tokenizer of a GGUF file, rebuilt from its `tokenizer.ggml.*` metadata, against the
//! repository's `tokenizer.json`. The fixture is what llama.cpp's converter writes for V4's
//! tokenizer (`convert_hf_to_gguf.py --vocab-only`, llama.cpp 0c1e570; see
//! docs/DEVELOPING.md), gzipped.

use std::io::Read;
use std::path::PathBuf;

use deepinfer_server::tokenizer::Tokenizer;
use rand::{RngExt, SeedableRng};

fn repo_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/tokenizer")
}

/// The converter's vocab-only GGUF, unpacked into `dir`.
fn gguf_in(dir: &tempfile::TempDir) -> PathBuf {
    let gz = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v4-vocab.gguf.gz");
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(gz).unwrap())
        .read_to_end(&mut bytes)
        .unwrap();
    let path = dir.path().join("v4-vocab.gguf");
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Text that exercises the pre-tokenizer's three regexes and the added tokens: digits,
/// CJK, punctuation runs, newlines, markers, and random code points from several scripts.
fn corpus(n: usize) -> Vec<String> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(47);
    let pieces = [
        "Hello, world!",
        " 12345678",
        "中文分词测试",
        "ひらがなカタカナ",
        "\n\n",
        "  \t",
        "<｜User｜>",
        "<｜Assistant｜>",
        "<think>",
        "</think>",
        "｜DSML｜",
        "<｜end▁of▁sentence｜>",
        "don't",
        "#include <stdio.h>",
        "é",
        "🙂",
        "x=1;y=2",
        "...",
        " \r\n",
        "Ωmega",
    ];
    (0..n)
        .map(|_| {
            let mut s = String::new();
            for _ in 0..rng.random_range(1..12) {
                if rng.random_bool(0.7) {
                    s.push_str(pieces[rng.random_range(0..pieces.len())]);
                } else {
                    let ranges = [0x20..0x7f, 0xa0..0x250, 0x3040..0x30ff, 0x4e00..0x9fa5];
                    let r = ranges[rng.random_range(0..ranges.len())].clone();
                    let c = char::from_u32(rng.random_range(r)).unwrap_or('?');
                    s.push(c);
                }
            }
            s
        })
        .collect()
}

#[test]
fn gguf_metadata_tokenizes_as_the_repository_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = Tokenizer::from_dir(gguf_in(&dir)).unwrap();
    let repo = Tokenizer::from_dir(repo_dir()).unwrap();
    assert_eq!(gguf.vocab_size(), repo.vocab_size());
    for id in 0..repo.vocab_size() as u32 {
        assert_eq!(gguf.id_to_token(id), repo.id_to_token(id), "id {id}");
    }
    assert_eq!(
        (gguf.bos_id(), gguf.eos_id()),
        (repo.bos_id(), repo.eos_id())
    );
    assert_eq!(gguf.add_bos_token(), repo.add_bos_token());
    for text in corpus(3000) {
        let ids = repo.encode(&text, false).unwrap();
        assert_eq!(gguf.encode(&text, false).unwrap(), ids, "{text:?}");
        assert_eq!(
            gguf.decode(&ids, false),
            repo.decode(&ids, false),
            "{text:?}"
        );
    }
}

#[test]
fn a_gguf_without_a_tokenizer_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    // A GGUF of no metadata and no tensors.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend([0u8; 16]);
    let path = dir.path().join("empty.gguf");
    std::fs::write(&path, bytes).unwrap();
    let msg = Tokenizer::from_dir(&path).err().unwrap().to_string();
    assert!(
        msg.contains("empty.gguf") && msg.contains("tokenizer.ggml.model"),
        "{msg}"
    );
}
