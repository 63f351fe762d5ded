//! Tokenizer tests against fixtures from the Python `tokenizers` package on the same file
//! (tools/make_tokenizer_fixtures.py), plus incremental detokenization and stop strings.

use deepinfer_server::tokenizer::{IncrementalDetokenizer, StopStrings, Tokenizer};
use std::path::PathBuf;
use std::sync::OnceLock;

struct Case {
    name: String,
    text: String,
    ids: Vec<u32>,
    decoded: String,
    decoded_skip_special: String,
}

struct Fixtures {
    vocab_size: usize,
    token_ids: Vec<(String, u32)>,
    cases: Vec<Case>,
}

fn tokenizer_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/tokenizer")
}

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_dir(tokenizer_dir()).expect("load tokenizer"))
}

fn fixtures() -> &'static Fixtures {
    static FIX: OnceLock<Fixtures> = OnceLock::new();
    FIX.get_or_init(|| {
        let path =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer_cases.json");
        let text = std::fs::read_to_string(&path).expect("read fixtures");
        let v: serde_json::Value = serde_json::from_str(&text).expect("parse fixtures");
        let s = |c: &serde_json::Value, k: &str| c[k].as_str().expect(k).to_owned();
        let cases = v["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .map(|c| Case {
                name: s(c, "name"),
                text: s(c, "text"),
                ids: c["ids"]
                    .as_array()
                    .expect("ids")
                    .iter()
                    .map(|x| x.as_u64().expect("id") as u32)
                    .collect(),
                decoded: s(c, "decoded"),
                decoded_skip_special: s(c, "decoded_skip_special"),
            })
            .collect();
        let token_ids = v["token_ids"]
            .as_object()
            .expect("token_ids")
            .iter()
            .map(|(k, id)| (k.clone(), id.as_u64().expect("id") as u32))
            .collect();
        Fixtures {
            vocab_size: v["vocab_size"].as_u64().expect("vocab_size") as usize,
            token_ids,
            cases,
        }
    })
}

#[test]
fn fixtures_are_varied() {
    let f = fixtures();
    assert!(f.cases.len() >= 30);
    assert!(f.cases.iter().any(|c| c.ids.is_empty()));
    assert!(f.cases.iter().any(|c| c.ids.len() > 100));
}

#[test]
fn encode_matches_python() {
    let tok = tokenizer();
    for case in &fixtures().cases {
        let ids = tok.encode(&case.text, false).expect("encode");
        assert_eq!(ids, case.ids, "case {}", case.name);
    }
}

#[test]
fn decode_matches_python() {
    let tok = tokenizer();
    for case in &fixtures().cases {
        assert_eq!(
            tok.decode(&case.ids, false),
            case.decoded,
            "case {}",
            case.name
        );
        assert_eq!(
            tok.decode(&case.ids, true),
            case.decoded_skip_special,
            "case {} (skip special)",
            case.name
        );
    }
}

#[test]
fn vocab_and_special_ids() {
    let tok = tokenizer();
    let f = fixtures();
    assert_eq!(tok.vocab_size(), f.vocab_size);
    for (token, id) in &f.token_ids {
        assert_eq!(tok.token_to_id(token), Some(*id), "{token}");
        assert_eq!(tok.id_to_token(*id).as_deref(), Some(token.as_str()));
        // Written in text, an added token is one token.
        assert_eq!(tok.encode(token, false).unwrap(), vec![*id], "{token}");
    }
    assert_eq!(tok.bos_id(), tok.token_to_id("<｜begin▁of▁sentence｜>"));
    assert_eq!(tok.eos_id(), tok.token_to_id("<｜end▁of▁sentence｜>"));
    assert!(tok.bos_id().is_some() && tok.eos_id().is_some());
    // The config says add_bos_token = false; the post-processor adds nothing either.
    assert!(!tok.add_bos_token());
    assert_eq!(
        tok.encode("hi", true).unwrap(),
        tok.encode("hi", false).unwrap()
    );
    assert_eq!(tok.id_to_token(u32::MAX), None);
}

#[test]
fn load_errors_name_the_file() {
    let missing = std::env::temp_dir().join("deepinfer-no-such-tokenizer-dir");
    let err = Tokenizer::from_dir(&missing).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");

    let dir = std::env::temp_dir().join(format!("deepinfer-bad-tokenizer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), "{not json").unwrap();
    let err = Tokenizer::from_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");

    std::fs::copy(
        tokenizer_dir().join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), "[").unwrap();
    let err = Tokenizer::from_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("tokenizer_config.json"), "{err}");

    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<no-such-token>", "eos_token": {"content": "<｜end▁of▁sentence｜>"}}"#,
    )
    .unwrap();
    let err = Tokenizer::from_dir(&dir).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer_config.json") && err.contains("<no-such-token>"),
        "{err}"
    );

    // String-form tokens and add_bos_token = true.
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>", "add_bos_token": true}"#,
    )
    .unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let bos = tok.bos_id().unwrap();
    let plain = tok.encode("hi", false).unwrap();
    assert_eq!(
        tok.encode("hi", true).unwrap(),
        [&[bos][..], &plain].concat()
    );
    // Not added twice.
    let with_bos = tok.encode("<｜begin▁of▁sentence｜>hi", true).unwrap();
    assert_eq!(with_bos, [&[bos][..], &plain].concat());
}

/// Feeds `ids` one by one; checks that the running output is always a prefix of the full
/// decode and that deltas + flush equal it exactly.
fn check_incremental(tok: &Tokenizer, ids: &[u32], skip: bool, what: &str) {
    let full = tok.decode(ids, skip);
    let mut detok = IncrementalDetokenizer::new(tok.clone(), skip);
    let mut out = String::new();
    for (i, &id) in ids.iter().enumerate() {
        out.push_str(&detok.push(id));
        assert!(
            full.starts_with(&out),
            "{what}: after {} ids emitted {out:?}, not a prefix of {full:?}",
            i + 1
        );
    }
    out.push_str(&detok.flush());
    assert_eq!(out, full, "{what}");
    assert_eq!(detok.output_ids(), ids);
    assert_eq!(detok.flush(), "", "{what}: second flush");
}

#[test]
fn incremental_equals_full_decode() {
    let tok = tokenizer();
    for case in &fixtures().cases {
        for skip in [false, true] {
            check_incremental(tok, &case.ids, skip, &format!("{} skip={skip}", case.name));
        }
    }
}

#[test]
fn incremental_every_prefix_including_split_characters() {
    // Prefixes end mid-character (emoji and CJK split over byte-level tokens): the held-back
    // bytes come out only at flush, as the U+FFFD the full decode also shows.
    let tok = tokenizer();
    let mut saw_split = false;
    for case in &fixtures().cases {
        if case.ids.len() > 40 {
            continue;
        }
        for n in 0..=case.ids.len() {
            let prefix = &case.ids[..n];
            saw_split |= tok.decode(prefix, false).ends_with('\u{FFFD}');
            check_incremental(tok, prefix, false, &format!("{} prefix {n}", case.name));
        }
    }
    assert!(
        saw_split,
        "fixtures should split some character across tokens"
    );
}

#[test]
fn incremental_holds_back_partial_characters() {
    let tok = tokenizer();
    let ids = tok.encode("🦀", false).unwrap();
    assert!(
        ids.len() > 1,
        "expected the emoji to span several tokens: {ids:?}"
    );
    let mut detok = IncrementalDetokenizer::new(tok.clone(), false);
    for &id in &ids[..ids.len() - 1] {
        assert_eq!(detok.push(id), "");
    }
    assert_eq!(detok.push(ids[ids.len() - 1]), "🦀");
    assert_eq!(detok.flush(), "");
}

#[test]
fn incremental_special_tokens() {
    let tok = tokenizer();
    let user = tok.token_to_id("<｜User｜>").unwrap();
    let bos = tok.bos_id().unwrap();
    let hi = tok.encode("hi", false).unwrap();
    let ids = [&[bos, user][..], &hi].concat();

    let mut keep = IncrementalDetokenizer::new(tok.clone(), false);
    assert_eq!(keep.push(bos), "<｜begin▁of▁sentence｜>");
    assert_eq!(keep.push(user), "<｜User｜>");

    let mut skip = IncrementalDetokenizer::new(tok.clone(), true);
    let out: String = skip.push_all(&ids) + &skip.flush();
    assert_eq!(out, tok.decode(&ids, true));
    assert!(!out.contains("begin▁of▁sentence"));
}

#[test]
fn incremental_with_prompt_emits_only_output() {
    let tok = tokenizer();
    let prompt = tok
        .encode("<｜User｜>Say hello<｜Assistant｜>", false)
        .unwrap();
    let output = tok.encode("Hello 👋 world", false).unwrap();
    let mut detok = IncrementalDetokenizer::with_prompt(tok.clone(), &prompt, false);
    let out = detok.push_all(&output) + &detok.flush();
    assert_eq!(out, "Hello 👋 world");
    assert_eq!(detok.output_ids(), output);
}

// ---- stop strings ----

/// Runs `text` through a matcher split at the given byte positions; returns the emitted text
/// (flushed if no stop matched) and the matched index.
fn run_stops(stops: &[&str], chunks: &[&str]) -> (String, Option<usize>) {
    let mut m = StopStrings::new(stops.iter().copied());
    let mut out = String::new();
    let mut matched = None;
    for chunk in chunks {
        let (text, hit) = m.push(chunk);
        out.push_str(&text);
        if hit.is_some() {
            assert!(matched.is_none(), "matched twice");
            matched = hit;
        }
    }
    if matched.is_none() {
        out.push_str(&m.flush());
    }
    assert_eq!(m.matched(), matched);
    (out, matched)
}

/// Every split of `text` into two and three chunks gives `expected`.
fn check_all_splits(stops: &[&str], text: &str, expected: (&str, Option<usize>)) {
    let bounds: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    for &i in &bounds {
        for &j in bounds.iter().filter(|&&j| j >= i) {
            let chunks = [&text[..i], &text[i..j], &text[j..]];
            let got = run_stops(stops, &chunks);
            assert_eq!(
                (got.0.as_str(), got.1),
                expected,
                "stops {stops:?}, chunks {chunks:?}"
            );
        }
    }
    // One character at a time.
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let chunks: Vec<&str> = chars.iter().map(String::as_str).collect();
    let got = run_stops(stops, &chunks);
    assert_eq!(
        (got.0.as_str(), got.1),
        expected,
        "stops {stops:?}, char by char"
    );
}

#[test]
fn stop_split_across_deltas_at_every_position() {
    check_all_splits(&["STOP"], "hello STOP world", ("hello ", Some(0)));
    check_all_splits(
        &["\n\n"],
        "line one\nline two\n\nrest",
        ("line one\nline two", Some(0)),
    );
    check_all_splits(&["停止"], "你好停止世界", ("你好", Some(0)));
    check_all_splits(&["👋🏽"], "hi 👋 then 👋🏽 bye", ("hi 👋 then ", Some(0)));
}

#[test]
fn stop_overlapping_candidates() {
    // "ab" completes first; "abc" would complete later.
    check_all_splits(&["ab", "abc"], "xxab", ("xx", Some(0)));
    check_all_splits(&["abc", "ab"], "xxabc", ("xx", Some(1)));
    // Same end: the longer (earlier start) wins.
    check_all_splits(&["b", "ab"], "xxab", ("xx", Some(1)));
    // Earliest end wins even if another stop starts earlier.
    check_all_splits(&["abcd", "bc"], "xabcd", ("xa", Some(1)));
    // A partial candidate that fails must not swallow text.
    check_all_splits(&["abc"], "ababab abc", ("ababab ", Some(0)));
    check_all_splits(&["aab"], "aaab", ("a", Some(0)));
}

#[test]
fn stop_at_the_very_start() {
    check_all_splits(&["ab"], "abxyz", ("", Some(0)));
    let mut m = StopStrings::new(["<|end|>"]);
    assert_eq!(m.push("<|end|>tail"), (String::new(), Some(0)));
    // Nothing after a match.
    assert_eq!(m.push("more"), (String::new(), None));
    assert_eq!(m.flush(), "");
}

#[test]
fn stop_none_matches_everything_emitted_after_flush() {
    check_all_splits(&["xyz", "abd"], "abc xy ab", ("abc xy ab", None));
    let mut m = StopStrings::new(["xyz"]);
    assert_eq!(m.push("abc x"), ("abc ".to_owned(), None));
    assert_eq!(m.held(), "x");
    assert_eq!(m.push("y"), (String::new(), None));
    assert_eq!(m.flush(), "xy");
    // No stops at all (and empty ones) hold nothing back.
    let mut none = StopStrings::new(Vec::<String>::new());
    assert_eq!(none.push("anything"), ("anything".to_owned(), None));
    let mut empty = StopStrings::new([""]);
    assert_eq!(empty.push("abc"), ("abc".to_owned(), None));
}

#[test]
fn detokenizer_then_stops() {
    // The two together, as the server uses them: stop inside the token stream.
    let tok = tokenizer();
    let ids = tok
        .encode("The answer is 42.\n\nUser: more", false)
        .unwrap();
    let mut detok = IncrementalDetokenizer::new(tok.clone(), false);
    let mut stops = StopStrings::new(["\n\nUser:"]);
    let mut out = String::new();
    let mut matched = None;
    for &id in &ids {
        let (text, hit) = stops.push(&detok.push(id));
        out.push_str(&text);
        if hit.is_some() {
            matched = hit;
            break;
        }
    }
    assert_eq!((out.as_str(), matched), ("The answer is 42.", Some(0)));
}
