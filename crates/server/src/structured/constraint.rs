//! An llguidance matcher behind the engine's [`Constraint`] seam. In thinking mode the grammar
//! holds only the answer: the reasoning before `</think>` is free (as vLLM applies structured
//! outputs after the reasoning parser's end), so the matcher starts after that token.

use deepinfer_engine::constraint::{Constraint, TokenMask};
use llguidance::Matcher;

pub struct GrammarConstraint {
    matcher: Matcher,
    /// The `</think>` id while the answer has not begun; `None` once it has (or without
    /// thinking).
    gate: Option<u32>,
    think_end: u32,
    /// Tokens accepted, and how many of them came before the answer began.
    accepted: usize,
    opened_at: usize,
    eos: u32,
}

impl GrammarConstraint {
    pub fn new(matcher: Matcher, thinking: Option<u32>, eos: u32) -> Self {
        Self {
            matcher,
            gate: thinking,
            think_end: thinking.unwrap_or(u32::MAX),
            accepted: 0,
            opened_at: 0,
            eos,
        }
    }
}

impl Constraint for GrammarConstraint {
    fn fill_mask(&mut self, mask: &mut TokenMask) {
        if self.gate.is_some() {
            mask.allow_all();
            return;
        }
        // A matcher in error (a grammar past its limits midway) allows only the end.
        match self.matcher.compute_mask_or_eos() {
            Ok(m) => {
                let words = mask.words_mut();
                for (w, src) in words.iter_mut().zip(m.as_slice()) {
                    *w = *src;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "a structured-output grammar failed; ending the answer");
                mask.allow(self.eos);
            }
        }
    }

    fn accept(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.accepted += 1;
            if self.gate.is_some() {
                if t == self.think_end {
                    self.gate = None;
                    self.opened_at = self.accepted;
                }
            } else if t != self.eos || !self.matcher.is_stopped() {
                // Its error state shows in the next mask.
                let _ = self.matcher.consume_token(t);
            }
        }
    }

    fn rollback(&mut self, n: usize) {
        let in_answer = (self.accepted - self.opened_at).min(n);
        if self.gate.is_none() && in_answer > 0 {
            let _ = self.matcher.rollback(in_answer);
        }
        self.accepted -= n;
        if self.think_end != u32::MAX && self.accepted < self.opened_at {
            self.gate = Some(self.think_end);
            self.opened_at = 0;
        }
    }
}
