//! `deepinfer chat` driven as a person would drive it: through a pseudo-terminal, made by
//! util-linux `script` (in Debian's essential bsdutils), which runs the binary on a fresh pty
//! and copies our bytes to it. The pty's line discipline does the rest: `\x03` becomes a
//! SIGINT for the chat, `\x04` at the start of a line an end of input. The default synthetic
//! model answers (random weights, so the text is noise; greedy makes it the same every time).

mod support;

use deepinfer_server::chat::{parse_chat_output, ChatFormat, ChatMessage, RenderOptions};
use deepinfer_server::tokenizer::Tokenizer;
use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{binary, cache_dir};

/// Long enough for a shared two-core machine building something else at the same time.
const WAIT: Duration = Duration::from_secs(180);
/// Small pools: the tests run several chats at once.
const CACHE: [&str; 2] = ["--cache-budget-mib", "256"];
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// A chat on a pty: what we type goes in, everything the terminal shows comes out.
struct Pty {
    child: Child,
    input: ChildStdin,
    shown: Arc<Mutex<Vec<u8>>>,
    /// How much of `shown` the waits have consumed.
    seen: usize,
}

impl Pty {
    fn start(args: &[&str]) -> Pty {
        // `exec`: the chat replaces the shell `script` starts. A shell left waiting in the
        // pty's foreground group gets each Ctrl-C too; dash, a non-interactive /bin/sh,
        // then kills itself with SIGINT once the chat exits, so Ctrl-D ended with 130.
        let mut line = format!("exec {}", shell_quote(&binary().to_string_lossy()));
        for a in ["chat"].iter().chain(&CACHE).chain(args) {
            line.push(' ');
            line.push_str(&shell_quote(a));
        }
        // -e: exit with the chat's status; -q: no "Script started" lines; no log file.
        let mut child = Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            // `script` runs $SHELL; the same shell on every machine (CI may have no $SHELL).
            .env("SHELL", "/bin/sh")
            .env("DEEPINFER_CACHE_DIR", cache_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("util-linux `script` runs (package bsdutils)");
        let shown = Arc::new(Mutex::new(Vec::new()));
        let sink = shown.clone();
        let mut out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = out.read(&mut buf) {
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        let input = child.stdin.take().unwrap();
        let mut pty = Pty {
            child,
            input,
            shown,
            seen: 0,
        };
        pty.wait_for(">>> ");
        pty
    }

    fn send(&mut self, bytes: &str) {
        self.input.write_all(bytes.as_bytes()).unwrap();
        self.input.flush().unwrap();
    }

    /// Waits until `needle` shows up after what earlier waits consumed; returns the text
    /// from there through the needle, and consumes it.
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let text =
                String::from_utf8_lossy(&self.shown.lock().unwrap()[self.seen..]).into_owned();
            if let Some(at) = text.find(needle) {
                let through = at + needle.len();
                self.seen += text[..through].len();
                return text[..through].to_string();
            }
            if Instant::now() > deadline || self.child.try_wait().unwrap().is_some() {
                panic!("no {needle:?} in what the chat showed:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends a message and waits for its answer's numbers: (prompt tokens, cached tokens),
    /// and everything shown from the message's echo through the numbers.
    fn ask(&mut self, message: &str) -> (usize, usize, String) {
        self.send(&format!("{message}\n"));
        let shown = self.wait_for(" generated");
        let (prompt, cached) = numbers(&shown);
        self.wait_for(">>> ");
        (prompt, cached, shown)
    }

    /// Ctrl-D at the prompt: the chat must leave with status 0.
    fn leave(mut self) {
        self.send("\x04");
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "the chat did not leave on Ctrl-D"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "Ctrl-D left with {status}");
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// (prompt tokens, cached tokens) from the last `N prompt tokens (M cached)` in `shown`.
fn numbers(shown: &str) -> (usize, usize) {
    let at = shown.rfind(" prompt tokens (").expect("a numbers line");
    let prompt = shown[..at]
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap();
    let rest = &shown[at + " prompt tokens (".len()..];
    let cached = rest.split(' ').next().unwrap();
    (prompt.parse().unwrap(), cached.parse().unwrap())
}

/// About 270 tokens: more than two cache blocks of the default model (128 tokens).
fn long_question() -> String {
    "Please tell me about the history of the city of Rome and its emperors. ".repeat(12)
}

#[test]
fn a_conversation_is_kept_and_its_prefix_cached() {
    let mut chat = Pty::start(&["--temperature", "0", "--max-tokens", "8"]);
    let (p1, c1, first) = chat.ask(&long_question());
    assert_eq!(c1, 0, "{first}");
    // Thinking mode (the default): the answer starts in its reasoning, shown dimmed.
    let answer = &first[first.find(DIM).expect("dimmed reasoning")..];
    assert!(answer.len() > DIM.len() + RESET.len(), "{first}");

    // The second turn's prompt holds the first: the prefix cache has the first prompt's
    // blocks (up to its `<think>`, which the next turn renders as `</think>`).
    let (p2, c2, second) = chat.ask("And the second question?");
    assert!(
        p2 > p1 && c2 >= 256 && c2 < p1,
        "{p1} then {p2} ({c2} cached):\n{second}"
    );

    chat.send("/think\n");
    chat.wait_for("thinking off");
    let (p3, _, third) = chat.ask("chat one");
    // The history is in it (chat mode has no effort preamble, so it is shorter than the
    // second prompt, and the changed start misses the cache).
    assert!(p3 > 200, "{third}");
    let before_numbers = &third[..third.rfind(DIM).unwrap()];
    assert!(
        !before_numbers.contains(DIM),
        "no reasoning in chat mode:\n{third}"
    );

    chat.send("/reset\n");
    chat.wait_for("conversation reset");
    let (p4, c4, fourth) = chat.ask("fresh start");
    assert!(p4 < 16 && c4 == 0, "{fourth}");

    // Ctrl-C at the prompt: a hint, and the chat goes on.
    chat.send("\x03");
    chat.wait_for("(Ctrl-D or /exit to leave)");
    chat.wait_for(">>> ");
    chat.send("/help\n");
    chat.wait_for("/think");
    chat.wait_for(">>> ");
    chat.leave();
}

#[test]
fn ctrl_c_stops_an_answer_and_leaves_it_out() {
    let mut chat = Pty::start(&["--temperature", "0", "--max-tokens", "100000"]);
    let mut prompts = Vec::new();
    for _ in 0..2 {
        chat.send("Tell me a long story.\n");
        chat.wait_for(DIM);
        // Some of the answer streams out; the answer is far from over.
        let start = chat.seen;
        while chat.shown.lock().unwrap().len() < start + 200 {
            std::thread::sleep(Duration::from_millis(20));
        }
        chat.send("\x03");
        let shown = chat.wait_for("(stopped; left out of the conversation)");
        let generated: usize = shown[..shown.rfind(" generated").unwrap()]
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(generated < 100_000, "{shown}");
        prompts.push(numbers(&shown).0);
        chat.wait_for(">>> ");
    }
    // The stopped exchange is not in the history: the same question makes the same prompt.
    assert_eq!(prompts[0], prompts[1]);
    chat.leave();
}

#[test]
fn reasoning_is_shown_apart_from_the_answer() {
    let script = [
        "--debug-force-output",
        "Let me think.</think>The answer is 4.",
    ];
    let mut chat = Pty::start(&script);
    let (_, _, shown) = chat.ask("What is 2 + 2?");
    let shown = shown.replace("\r\n", "\n");
    assert!(
        shown.contains(&format!("{DIM}Let me think.{RESET}\n\nThe answer is 4.\n")),
        "{shown:?}"
    );
    // In chat mode the prompt ends with `</think>`: all of it is the answer (the parser
    // swallows the stray `</think>`).
    chat.send("/think\n");
    chat.wait_for("thinking off");
    let (_, _, shown) = chat.ask("Again?");
    assert!(shown.contains("Let me think.The answer is 4."), "{shown:?}");
    chat.leave();

    // Not on a terminal: plain markers instead of styles.
    let out = piped(&script, "What is 2 + 2?\n");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.starts_with("[thinking]\nLet me think.\n[/thinking]\nThe answer is 4.\n"),
        "{stdout}"
    );
    assert!(out.status.success());
}

/// The chat with its input from a pipe (stdin and stdout not terminals).
fn piped(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(binary())
        .arg("chat")
        .args(CACHE)
        .args(args)
        .env("DEEPINFER_CACHE_DIR", cache_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn a_greedy_answer_is_what_the_engine_generates_for_the_rendered_prompt() {
    let question = "Hello, who are you?";
    let out = piped(
        &["--temperature", "0", "--max-tokens", "12"],
        &format!("{question}\n"),
    );
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let dir = stderr
        .lines()
        .find_map(|l| l.strip_prefix("loaded ")?.split(" in ").next())
        .expect("a `loaded DIR` line")
        .to_string();

    // The same prompt, rendered and tokenized here, through `deepinfer generate`.
    let user = ChatMessage {
        role: "user".into(),
        content: Some(deepinfer_server::chat::MessageContent::Text(
            question.into(),
        )),
        ..ChatMessage::default()
    };
    let text = ChatFormat::V4
        .render(&[user], &[], &RenderOptions::default())
        .unwrap();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let ids: Vec<String> = tokenizer
        .encode(&text, false)
        .unwrap()
        .iter()
        .map(u32::to_string)
        .collect();
    let gen = Command::new(binary())
        .args(["generate", "--model", &dir, "--max-tokens", "12", "--json"])
        .args(CACHE)
        .args(["--prompt-ids", &ids.join(",")])
        .output()
        .unwrap();
    assert!(
        gen.status.success(),
        "{}",
        String::from_utf8_lossy(&gen.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&gen.stdout).unwrap();
    let tokens: Vec<u32> = json["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let text = tokenizer.decode(&tokens, true);
    let parsed = parse_chat_output(ChatFormat::V4.markup(), &text, true, false);
    let reasoning = parsed
        .reasoning
        .expect("thinking mode starts in the reasoning");
    assert!(!reasoning.is_empty());
    // The marker goes on a line of its own.
    let nl = if reasoning.ends_with('\n') { "" } else { "\n" };
    let mut expected = format!("[thinking]\n{reasoning}{nl}[/thinking]\n");
    if !parsed.content.is_empty() {
        expected.push_str(parsed.content.trim_start_matches(['\n', '\r']));
    }
    assert!(
        stdout.starts_with(&expected),
        "chat showed:\n{stdout}\nthe engine generated:\n{expected}"
    );
}
