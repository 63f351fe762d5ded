//! The documentation's commands parse: every `deepinfer` command line in the shell blocks of
//! the README and the docs that show commands (run through `cargo run … --`, the binary's path
//! or its name) is accepted by this binary's argument parser, so a renamed flag or subcommand
//! cannot leave them stale.

use super::Cli;
use clap::Parser;

const DOCS: [(&str, &str); 5] = [
    ("README.md", include_str!("../../../README.md")),
    ("docs/GGUF.md", include_str!("../../../docs/GGUF.md")),
    ("docs/SERVER.md", include_str!("../../../docs/SERVER.md")),
    ("docs/SCALING.md", include_str!("../../../docs/SCALING.md")),
    (
        "docs/DEVELOPING.md",
        include_str!("../../../docs/DEVELOPING.md"),
    ),
];

/// The shell blocks' lines, continuation lines joined.
fn shell_lines(text: &str) -> Vec<String> {
    let (mut lines, mut inside, mut pending) = (Vec::new(), false, String::new());
    for line in text.lines() {
        if line.starts_with("```") {
            inside = line == "```bash";
            continue;
        }
        if !inside {
            continue;
        }
        match line.trim_end().strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => lines.push(std::mem::take(&mut pending) + line),
        }
    }
    lines
}

/// A shell line's words, quotes removed; `None` past an unquoted `#` ends the line.
fn words(line: &str) -> Vec<String> {
    let (mut out, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => (quote, any) = (Some(c), true),
            (None, '#') if word.is_empty() && !any => break,
            (None, c) if c.is_whitespace() => {
                if any || !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
                any = false;
            }
            (None, c) => word.push(c),
        }
    }
    if any || !word.is_empty() {
        out.push(word);
    }
    out
}

/// The arguments after the binary in a shell line that runs it.
fn deepinfer_args(line: &str) -> Option<Vec<String>> {
    let w = words(line);
    let at = w.iter().position(|x| {
        x == "--" && line.contains("cargo run") || x == "deepinfer" || x.ends_with("/deepinfer")
    })?;
    Some(w[at + 1..].to_vec())
}

#[test]
fn every_documented_command_parses() {
    let commands: Vec<(&str, Vec<String>)> = DOCS
        .iter()
        .flat_map(|(file, text)| {
            shell_lines(text)
                .iter()
                .filter_map(|l| deepinfer_args(l))
                .map(|args| (*file, args))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(commands.len() >= 15, "found only {}", commands.len());
    for (file, args) in commands {
        let argv = std::iter::once("deepinfer".to_string()).chain(args.iter().cloned());
        if let Err(e) = Cli::try_parse_from(argv) {
            panic!(
                "{file}: `deepinfer {}` does not parse:\n{e}",
                args.join(" ")
            );
        }
    }
}

#[test]
fn shell_words_and_lines() {
    assert_eq!(
        words(r#"a --x '{"m": 1}' "b c" # note"#),
        ["a", "--x", r#"{"m": 1}"#, "b c"]
    );
    let lines = shell_lines("```bash\na \\\n  b\nc\n```\nd\n");
    assert_eq!(lines, ["a   b", "c"]);
}
