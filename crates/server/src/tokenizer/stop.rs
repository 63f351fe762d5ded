//! Stop strings on the detokenized text stream (OpenAI semantics: the stop string itself is
//! never emitted).
//!
//! Text that could be the beginning of a stop string is held back until it is either completed
//! (a match) or ruled out: everything since the automaton last sat in its start state, at
//! most the longest stop's length less one byte (never less than the exact partial match, at
//! times a little more). When several stops could match, the one whose occurrence *ends*
//! first wins (that is what a streaming check sees first); on a tie the one starting earliest
//! (the longest) wins. The result does not depend on how the text is split into deltas.
//!
//! All the stop strings of a request are compiled once into one Aho–Corasick automaton
//! ([`StopSet`]), shared by the request's choices; each choice keeps only its automaton
//! state and the text it holds back ([`StopStrings`]). Every byte of output therefore costs
//! one automaton step, however many stop strings there are.

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::nfa::contiguous::NFA;
use aho_corasick::Anchored;
use std::sync::Arc;

/// The stop strings of one request, compiled.
#[derive(Debug)]
pub struct StopSet {
    stops: Vec<String>,
    /// Over the non-empty stops; `None` when there are none.
    nfa: Option<NFA>,
    /// Pattern id in `nfa` → index in `stops` (empty stops are left out of the automaton).
    index: Vec<usize>,
    max_len: usize,
}

impl StopSet {
    /// Compiles `stops`; empty stop strings never match (they keep their index, though, so
    /// returned indices always refer to the caller's list).
    pub fn new<I, S>(stops: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let stops: Vec<String> = stops.into_iter().map(Into::into).collect();
        let index: Vec<usize> = (0..stops.len()).filter(|&i| !stops[i].is_empty()).collect();
        let nfa = if index.is_empty() {
            None
        } else {
            // Sizes are bounded by the caller (the server validates count and length), so
            // building cannot run out of state ids.
            NFA::new(index.iter().map(|&i| stops[i].as_bytes())).ok()
        };
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        Self {
            stops,
            nfa,
            index,
            max_len,
        }
    }

    /// The stop strings, in the caller's order.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Of the stops that end at state `sid` (a match state), the longest, then the first.
    fn best_match(&self, nfa: &NFA, sid: StateID) -> (usize, usize) {
        (0..nfa.match_len(sid))
            .map(|k| {
                let pid = nfa.match_pattern(sid, k);
                (nfa.pattern_len(pid), self.index[pid.as_usize()])
            })
            .min_by_key(|&(len, i)| (std::cmp::Reverse(len), i))
            .expect("a match state matches at least one pattern")
    }
}

/// A stop-string matcher for one output stream.
#[derive(Debug, Clone)]
pub struct StopStrings {
    set: Arc<StopSet>,
    /// The automaton's state after every byte received so far.
    state: Option<StateID>,
    /// Bytes received since the automaton last sat in its start state: an upper bound on
    /// the longest suffix that could still begin a stop string.
    since_start: usize,
    /// Text received but not yet emitted.
    held: String,
    matched: Option<usize>,
}

impl Default for StopStrings {
    fn default() -> Self {
        Self::new(Vec::<String>::new())
    }
}

impl StopStrings {
    /// A matcher over its own copy of `stops` (see [`StopSet::new`]).
    pub fn new<I, S>(stops: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::shared(Arc::new(StopSet::new(stops)))
    }

    /// A matcher over a set shared with other streams (a request's choices).
    pub fn shared(set: Arc<StopSet>) -> Self {
        let state = set.nfa.as_ref().map(|nfa| {
            nfa.start_state(Anchored::No)
                .expect("an unanchored start state")
        });
        Self {
            set,
            state,
            since_start: 0,
            held: String::new(),
            matched: None,
        }
    }

    /// The stop strings, in the caller's order.
    pub fn stops(&self) -> &[String] {
        self.set.stops()
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
        let (Some(nfa), Some(mut sid)) = (self.set.nfa.as_ref(), self.state) else {
            return (delta.to_owned(), None);
        };
        let base = self.held.len();
        self.held.push_str(delta);
        for (k, &b) in delta.as_bytes().iter().enumerate() {
            sid = nfa.next_state(Anchored::No, sid, b);
            self.since_start = if nfa.is_start(sid) {
                0
            } else {
                self.since_start + 1
            };
            if nfa.is_match(sid) {
                // Standard semantics report a match at the first position where any stop
                // ends: the earliest end. The suffix before this byte was a stop prefix, so
                // it is still held and `start` lies inside `held`.
                let (len, index) = self.set.best_match(nfa, sid);
                let start = base + k + 1 - len;
                self.matched = Some(index);
                let mut text = std::mem::take(&mut self.held);
                text.truncate(start);
                return (text, Some(index));
            }
        }
        self.state = Some(sid);
        let mut cut = self.held.len() - self.since_start.min(self.set.max_len - 1);
        while !self.held.is_char_boundary(cut) {
            cut -= 1;
        }
        let text = self.held[..cut].to_owned();
        self.held.drain(..cut);
        (text, None)
    }

    /// Ends the stream: returns the held-back text (it can no longer become a stop string).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_set_serves_many_streams() {
        let set = Arc::new(StopSet::new(["END", "stop here"]));
        let mut a = StopStrings::shared(set.clone());
        let mut b = StopStrings::shared(set);
        assert_eq!(a.push("xx EN"), ("xx ".into(), None));
        assert_eq!(b.push("stop "), (String::new(), None));
        assert_eq!(a.push("D!"), (String::new(), Some(0)));
        assert_eq!(b.push("here"), (String::new(), Some(1)));
    }

    #[test]
    fn ties_at_one_end_go_to_the_longest_then_the_first() {
        let mut m = StopStrings::new(["c", "abc", "bc", "abc"]);
        assert_eq!(m.push("xabcy"), ("x".into(), Some(1)));
        let mut m = StopStrings::new(["bc", "abcd"]);
        assert_eq!(m.push("abcd"), ("a".into(), Some(0)));
    }

    #[test]
    fn held_text_never_splits_a_character() {
        let mut m = StopStrings::new(["é!"]);
        assert_eq!(m.push("aé"), ("a".into(), None));
        assert_eq!(m.held(), "é");
        assert_eq!(m.push("é!"), ("é".into(), Some(0)));
    }
}
