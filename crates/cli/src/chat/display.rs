//! How an answer is shown: the reasoning apart from the answer itself (dimmed on a terminal,
//! between `[thinking]` and `[/thinking]` lines elsewhere, so a log or a pipe still tells
//! them apart), and a dimmed line of numbers after each answer.

use std::io::{self, Write};

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// Writes one answer after another to `out`.
pub(super) struct Display<W: Write> {
    out: W,
    /// ANSI styling (`out` is a terminal) rather than markers.
    styled: bool,
    in_reasoning: bool,
    /// Nothing of the answer's content was written yet (leading newlines are skipped).
    content_pending: bool,
    /// The last byte written was a newline (or nothing was written).
    at_line_start: bool,
}

impl<W: Write> Display<W> {
    pub fn new(out: W, styled: bool) -> Self {
        Self {
            out,
            styled,
            in_reasoning: false,
            content_pending: true,
            at_line_start: true,
        }
    }

    pub fn reasoning(&mut self, text: &str) -> io::Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        if !self.in_reasoning {
            self.in_reasoning = true;
            self.new_line()?;
            let open = if self.styled { DIM } else { "[thinking]\n" };
            self.out.write_all(open.as_bytes())?;
        }
        self.text(text)
    }

    pub fn content(&mut self, text: &str) -> io::Result<()> {
        self.close_reasoning()?;
        let text = if self.content_pending {
            text.trim_start_matches(['\n', '\r'])
        } else {
            text
        };
        if text.is_empty() {
            return Ok(());
        }
        self.content_pending = false;
        self.text(text)
    }

    /// Ends the answer: closes the reasoning, ends the line, and resets for the next one.
    pub fn end(&mut self) -> io::Result<()> {
        self.close_reasoning()?;
        self.new_line()?;
        self.content_pending = true;
        self.out.flush()
    }

    /// A line of the chat's own (a note, the numbers after an answer), dimmed on a terminal.
    pub fn note(&mut self, text: &str) -> io::Result<()> {
        self.new_line()?;
        if self.styled {
            writeln!(self.out, "{DIM}{text}{RESET}")?;
        } else {
            writeln!(self.out, "{text}")?;
        }
        self.out.flush()
    }

    /// The prompt, without a newline.
    pub fn prompt(&mut self, text: &str) -> io::Result<()> {
        self.new_line()?;
        self.out.write_all(text.as_bytes())?;
        // The user's line (echoed by the terminal) ends it.
        self.at_line_start = true;
        self.out.flush()
    }

    /// The terminal echoed something (`^C`) after the last thing written: the next line of
    /// ours starts on a line of its own.
    pub fn after_echo(&mut self) {
        self.at_line_start = false;
    }

    fn close_reasoning(&mut self) -> io::Result<()> {
        if self.in_reasoning {
            self.in_reasoning = false;
            if self.styled {
                self.out.write_all(RESET.as_bytes())?;
                self.new_line()?;
                // A blank line between the reasoning and the answer.
                self.out.write_all(b"\n")?;
            } else {
                self.new_line()?;
                self.out.write_all(b"[/thinking]\n")?;
            }
        }
        Ok(())
    }

    fn text(&mut self, text: &str) -> io::Result<()> {
        self.out.write_all(text.as_bytes())?;
        self.at_line_start = text.ends_with('\n');
        self.out.flush()
    }

    fn new_line(&mut self) -> io::Result<()> {
        if !self.at_line_start {
            self.out.write_all(b"\n")?;
            self.at_line_start = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(styled: bool, f: impl FnOnce(&mut Display<&mut Vec<u8>>)) -> String {
        let mut buf = Vec::new();
        f(&mut Display::new(&mut buf, styled));
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn markers_outside_a_terminal() {
        let s = shown(false, |d| {
            d.reasoning("Let me ").unwrap();
            d.reasoning("think.").unwrap();
            d.content("\n\nIt is ").unwrap();
            d.content("4.").unwrap();
            d.end().unwrap();
            d.note("9 prompt tokens").unwrap();
        });
        assert_eq!(
            s,
            "[thinking]\nLet me think.\n[/thinking]\nIt is 4.\n9 prompt tokens\n"
        );
    }

    #[test]
    fn dimmed_on_a_terminal() {
        let s = shown(true, |d| {
            d.reasoning("hm").unwrap();
            d.end().unwrap();
            d.content("yes").unwrap();
            d.end().unwrap();
        });
        assert_eq!(s, format!("{DIM}hm{RESET}\n\nyes\n"));
    }
}
