//! What the user typed, line by line, assembled into commands and messages.
//!
//! A message may span lines two ways: a line ending in `\` goes on with the next line (as in
//! a shell), and `"""` opens a block that the next `"""` closes (as in `ollama run`). A
//! command is a single line starting with `/`; inside a block every line is text.

/// A finished entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Entry {
    Message(String),
    Command(Command),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Command {
    Reset,
    Think,
    Help,
    Exit,
    /// Anything else after a `/`, kept to name it in the reply.
    Unknown(String),
}

/// The commands and what they do, for `/help` and the start-up line.
pub(super) const HELP: &str = "\
/reset   forget the conversation
/think   turn thinking mode on or off
/help    show this
/exit    leave (Ctrl-D too)
End a line with \\ to go on on the next one, or put a message between \"\"\" lines.
Ctrl-C stops an answer.";

const BLOCK: &str = "\"\"\"";

/// Lines typed so far of an entry not yet finished.
#[derive(Debug, Default)]
pub(super) struct Input {
    lines: Vec<String>,
    /// Inside a `"""` block.
    block: bool,
}

impl Input {
    /// Whether the next line continues an entry (the prompt says so).
    pub fn continuing(&self) -> bool {
        self.block || !self.lines.is_empty()
    }

    /// Drops a half-typed entry (Ctrl-C at the prompt).
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Takes one line (without its newline); returns the entry it finishes, if any. An empty
    /// entry (a blank line) gives nothing.
    pub fn push(&mut self, line: &str) -> Option<Entry> {
        if self.block {
            return match line.strip_suffix(BLOCK) {
                Some(last) => {
                    // A closing `"""` alone on its line adds no empty last line.
                    if !last.is_empty() {
                        self.lines.push(last.to_string());
                    }
                    self.block = false;
                    self.finish()
                }
                None => {
                    self.lines.push(line.to_string());
                    None
                }
            };
        }
        if self.lines.is_empty() {
            if let Some(rest) = line.strip_prefix(BLOCK) {
                // `"""text"""` on one line is a one-line message.
                if let Some(whole) = rest.strip_suffix(BLOCK) {
                    self.lines.push(whole.to_string());
                    return self.finish();
                }
                self.block = true;
                if !rest.is_empty() {
                    self.lines.push(rest.to_string());
                }
                return None;
            }
            if let Some(name) = line.trim().strip_prefix('/') {
                return Some(Entry::Command(command(name)));
            }
        }
        match line.strip_suffix('\\') {
            Some(head) => {
                self.lines.push(head.to_string());
                None
            }
            None => {
                self.lines.push(line.to_string());
                self.finish()
            }
        }
    }

    fn finish(&mut self) -> Option<Entry> {
        let text = std::mem::take(&mut self.lines).join("\n");
        self.block = false;
        (!text.trim().is_empty()).then_some(Entry::Message(text))
    }
}

fn command(name: &str) -> Command {
    match name {
        "reset" | "clear" => Command::Reset,
        "think" => Command::Think,
        "help" | "?" => Command::Help,
        "exit" | "quit" | "bye" => Command::Exit,
        other => Command::Unknown(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(lines: &[&str]) -> Vec<Entry> {
        let mut input = Input::default();
        lines.iter().filter_map(|l| input.push(l)).collect()
    }

    fn msg(s: &str) -> Entry {
        Entry::Message(s.to_string())
    }

    #[test]
    fn single_lines_and_commands() {
        assert_eq!(feed(&["hello"]), [msg("hello")]);
        assert_eq!(feed(&["", "  "]), []);
        assert_eq!(
            feed(&["/think", " /reset ", "/exit", "/what"]),
            [
                Entry::Command(Command::Think),
                Entry::Command(Command::Reset),
                Entry::Command(Command::Exit),
                Entry::Command(Command::Unknown("what".into())),
            ]
        );
    }

    #[test]
    fn backslash_continues() {
        let mut input = Input::default();
        assert_eq!(input.push("one \\"), None);
        assert!(input.continuing());
        // A continued line starting with `/` is text, not a command.
        assert_eq!(input.push("/two\\"), None);
        assert_eq!(input.push("three"), Some(msg("one \n/two\nthree")));
        assert!(!input.continuing());
    }

    #[test]
    fn triple_quote_blocks() {
        assert_eq!(
            feed(&["\"\"\"", "a", "", "/b\\", "c\"\"\""]),
            [msg("a\n\n/b\\\nc")]
        );
        assert_eq!(feed(&["\"\"\"first", "last\"\"\""]), [msg("first\nlast")]);
        assert_eq!(feed(&["\"\"\"one line\"\"\""]), [msg("one line")]);
        assert_eq!(feed(&["\"\"\"", "x", "\"\"\""]), [msg("x")]);
        assert_eq!(feed(&["\"\"\"", "\"\"\""]), []);
    }

    #[test]
    fn clear_drops_a_half_entry() {
        let mut input = Input::default();
        input.push("\"\"\"");
        input.push("lost");
        input.clear();
        assert!(!input.continuing());
        assert_eq!(input.push("kept"), Some(msg("kept")));
    }
}
