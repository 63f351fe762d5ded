//! Stop strings on the detokenized text stream (OpenAI semantics: the stop string itself is
//! never emitted).
//!
//! Text that could be the beginning of a stop string is held back until it is either completed
//! (a match) or ruled out. When several stops could match, the one whose occurrence *ends*
//! first wins (that is what a streaming check sees first); on a tie the one starting earliest
//! (the longest) wins. The result does not depend on how the text is split into deltas.

/// A stop-string matcher for one output stream.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not yet emitted.
    held: String,
    matched: Option<usize>,
}

impl StopStrings {
    /// Builds a matcher; empty stop strings never match (they keep their index, though, so
    /// returned indices always refer to the caller's list).
    pub fn new<I, S>(stops: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            stops: stops.into_iter().map(Into::into).collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// The stop strings, in the caller's order.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// The index of the stop string that matched, once one has.
    pub fn matched(&self) -> Option<usize> {
        self.matched
    }

    /// Text currently held back as a possible stop-string start.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Consumes a text delta. Returns the text that is safe to emit now and, when a stop string
    /// completed in this delta, its index; the text returned then is everything before the
    /// stop string, and later calls return nothing.
    pub fn push(&mut self, delta: &str) -> (String, Option<usize>) {
        if self.matched.is_some() {
            return (String::new(), None);
        }
        self.held.push_str(delta);

        // Earliest end wins; ties go to the earliest start. `find` gives each stop's earliest
        // occurrence, which for a fixed stop is also its earliest end.
        let mut best: Option<(usize, usize, usize)> = None; // (end, start, index)
        for (index, stop) in self.stops.iter().enumerate() {
            if stop.is_empty() {
                continue;
            }
            if let Some(start) = self.held.find(stop.as_str()) {
                let key = (start + stop.len(), start, index);
                if best.is_none_or(|b| (key.0, key.1) < (b.0, b.1)) {
                    best = Some(key);
                }
            }
        }
        if let Some((_, start, index)) = best {
            self.matched = Some(index);
            let mut text = std::mem::take(&mut self.held);
            text.truncate(start);
            return (text, Some(index));
        }

        let keep = self.partial_suffix_len();
        let emit_len = self.held.len() - keep;
        let text = self.held[..emit_len].to_owned();
        self.held.drain(..emit_len);
        (text, None)
    }

    /// Ends the stream: returns the held-back text (it can no longer become a stop string).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop.
    fn partial_suffix_len(&self) -> usize {
        let max_stop = self.stops.iter().map(String::len).max().unwrap_or(0);
        if max_stop == 0 {
            return 0;
        }
        let min_start = self.held.len().saturating_sub(max_stop - 1);
        for (i, _) in self.held.char_indices() {
            if i < min_start {
                continue;
            }
            let suffix = &self.held[i..];
            if self
                .stops
                .iter()
                .any(|s| s.len() > suffix.len() && s.starts_with(suffix))
            {
                return suffix.len();
            }
        }
        0
    }
}
