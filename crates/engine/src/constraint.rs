//! Structured outputs' seam: a grammar a sequence's tokens must follow (a JSON schema, a
//! regex, a choice), owned by the sequence beside its sampler state. The engine asks it which
//! tokens may come next, masks the rest before sampling, and tells it which tokens were kept;
//! how a grammar is compiled and matched (llguidance, in the server) stays behind this trait.
//!
//! Masks are computed on a thread of their own while the step's forward pass runs (see
//! [`masks_for_step`]), for the sequence's next token and, with speculative decoding, for the
//! token after each draft the grammar allows: a draft the grammar forbids is masked out at its
//! row, so verification rejects it and it is never emitted.

use std::time::Instant;

/// A set of token ids, one bit each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    vocab: usize,
}

impl TokenMask {
    /// A mask over `vocab` ids with none allowed.
    pub fn new(vocab: usize) -> Self {
        Self {
            words: vec![0; vocab.div_ceil(32)],
            vocab,
        }
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The words, bit `i % 32` of word `i / 32` for id `i` (llguidance's layout), for a
    /// constraint to fill; bits past the vocabulary are ignored.
    pub fn words_mut(&mut self) -> &mut [u32] {
        &mut self.words
    }

    pub fn allow(&mut self, id: u32) {
        if (id as usize) < self.vocab {
            self.words[id as usize / 32] |= 1 << (id % 32);
        }
    }

    pub fn allow_all(&mut self) {
        self.words.fill(u32::MAX);
    }

    pub fn allows(&self, id: u32) -> bool {
        (id as usize) < self.vocab && self.words[id as usize / 32] >> (id % 32) & 1 == 1
    }

    /// The lowest allowed id.
    pub fn first_allowed(&self) -> Option<u32> {
        let (w, word) = self.words.iter().enumerate().find(|(_, w)| **w != 0)?;
        let id = w as u32 * 32 + word.trailing_zeros();
        ((id as usize) < self.vocab).then_some(id)
    }

    /// Sets every logit of a disallowed id to -inf (ids past the mask's vocabulary too).
    pub fn apply(&self, logits: &mut [f32]) {
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let word = self.words.get(w).copied().unwrap_or(0);
            if word == u32::MAX {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if word >> b & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// A grammar the output follows. Errors inside it (a grammar too complex to go on) are its
/// own to handle: it then allows only the end of the sequence.
pub trait Constraint: Send {
    /// Fills `mask` (all clear on entry) with the tokens that may come next.
    fn fill_mask(&mut self, mask: &mut TokenMask);
    /// Advances past tokens the sequence kept.
    fn accept(&mut self, tokens: &[u32]);
    /// Undoes the last `n` accepted tokens.
    fn rollback(&mut self, n: usize);
}

/// One sequence's part of a step's mask work: its constraint (lent for the step), the drafts
/// the step verifies, and how many logits rows it has.
pub struct MaskJob {
    pub id: crate::request::RequestId,
    pub constraint: Box<dyn Constraint>,
    pub drafts: Vec<u32>,
    pub rows: usize,
}

/// What a [`MaskJob`] gives back: the constraint and one mask per row it may sample (fewer
/// when a draft is forbidden: the rows past it are never sampled).
pub struct MaskResult {
    pub id: crate::request::RequestId,
    pub constraint: Box<dyn Constraint>,
    pub masks: Vec<TokenMask>,
}

/// Computes a step's masks: for each job the mask of its next token, then, for each draft the
/// grammar allows, the mask after it (the drafts are consumed, then rolled back). Returns the
/// results and the seconds spent.
pub fn masks_for_step(jobs: Vec<MaskJob>, vocab: usize) -> (Vec<MaskResult>, f64) {
    let t0 = Instant::now();
    let results = jobs
        .into_iter()
        .map(|mut job| {
            let mut masks = Vec::with_capacity(job.rows);
            let mut consumed = 0;
            while masks.len() < job.rows {
                let mut m = TokenMask::new(vocab);
                job.constraint.fill_mask(&mut m);
                let next = job.drafts.get(masks.len()).copied();
                let go_on = next.is_some_and(|d| m.allows(d));
                masks.push(m);
                match next {
                    Some(d) if go_on => {
                        job.constraint.accept(&[d]);
                        consumed += 1;
                    }
                    _ => break,
                }
            }
            job.constraint.rollback(consumed);
            MaskResult {
                id: job.id,
                constraint: job.constraint,
                masks,
            }
        })
        .collect();
    (results, t0.elapsed().as_secs_f64())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A test grammar: the output spells `word` (token ids), then ends with `eos`.
    pub struct Spell {
        pub word: Vec<u32>,
        pub eos: u32,
        pub pos: usize,
    }

    impl Constraint for Spell {
        fn fill_mask(&mut self, mask: &mut TokenMask) {
            mask.allow(self.word.get(self.pos).copied().unwrap_or(self.eos));
        }
        fn accept(&mut self, tokens: &[u32]) {
            self.pos += tokens.len();
        }
        fn rollback(&mut self, n: usize) {
            self.pos -= n;
        }
    }

    #[test]
    fn masks_set_clear_and_apply() {
        let mut m = TokenMask::new(70);
        assert_eq!(m.first_allowed(), None);
        m.allow(3);
        m.allow(65);
        m.allow(500);
        assert!(m.allows(3) && m.allows(65) && !m.allows(4) && !m.allows(500));
        assert_eq!(m.first_allowed(), Some(3));
        let mut logits = vec![1.0f32; 80];
        m.apply(&mut logits);
        let kept: Vec<usize> = (0..80).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(kept, [3, 65]);
        assert_eq!(logits[3], 1.0);
    }

    /// Masks follow the allowed drafts and stop at the first forbidden one; the constraint
    /// comes back where it was.
    #[test]
    fn masks_cover_the_allowed_drafts() {
        let job = |drafts: Vec<u32>| MaskJob {
            id: 1,
            constraint: Box::new(Spell {
                word: vec![5, 6, 7],
                eos: 0,
                pos: 0,
            }),
            drafts: drafts.clone(),
            rows: drafts.len() + 1,
        };
        let (r, _) = masks_for_step(vec![job(vec![5, 6]), job(vec![5, 9, 7]), job(vec![])], 10);
        let firsts: Vec<Vec<Option<u32>>> = r
            .iter()
            .map(|r| r.masks.iter().map(TokenMask::first_allowed).collect())
            .collect();
        assert_eq!(firsts[0], [Some(5), Some(6), Some(7)]);
        assert_eq!(firsts[1], [Some(5), Some(6)]);
        assert_eq!(firsts[2], [Some(5)]);
        let mut m = TokenMask::new(10);
        let mut c = r.into_iter().next().unwrap().constraint;
        c.fill_mask(&mut m);
        assert_eq!(m.first_allowed(), Some(5));
    }
}
