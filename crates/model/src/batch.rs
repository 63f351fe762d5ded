//! The flat batch the model runs on, in vLLM's shape: every scheduled token of every
//! sequence concatenated, a span per sequence, and the rows that need logits.

/// One sequence's slice of a [`ForwardBatch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqSpan {
    /// Offset of the sequence's first token in the flat arrays.
    pub start: usize,
    /// Number of tokens of this sequence in the batch.
    pub len: usize,
}

/// A flat batch: `token_ids[i]` sits at absolute position `positions[i]` of its sequence.
#[derive(Clone, Debug, Default)]
pub struct ForwardBatch {
    pub token_ids: Vec<u32>,
    pub positions: Vec<usize>,
    pub spans: Vec<SeqSpan>,
    /// Flat row indices whose logits are wanted, in output order.
    pub logits_rows: Vec<usize>,
    /// Per span, the first position its sliding window may reach back to (the MTP block
    /// restarting its context after a pause); empty: 0 for every span.
    pub window_floor: Vec<usize>,
    /// The tokens just before each span, oldest first, flat: span `s` has
    /// `lookback[lookback_ends[s-1]..lookback_ends[s]]` ([`Self::lookback`]). What a model
    /// that hashes n-grams across chunk boundaries (V4.1's Engram) reads.
    pub lookback: Vec<u32>,
    pub lookback_ends: Vec<usize>,
    /// Rows whose input embedding is given instead of looked up (an image's span): flat row
    /// `embed_rows[i]` takes `embed_values[i · hidden..(i + 1) · hidden]`. Their token ids
    /// still route and hash as the model reads them.
    pub embed_rows: Vec<usize>,
    pub embed_values: Vec<f32>,
    /// Image spans the batch's sequences hold, whole even where this batch holds part of
    /// one. What a model whose image positions see their whole span (V4-Flash-Vision-Exp)
    /// reads.
    pub image_spans: Vec<ImageSpan>,
}

/// Positions `first..=last` of the sequence of span `seq` hold an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageSpan {
    pub seq: usize,
    pub first: usize,
    pub last: usize,
}

/// Tokens before a span that [`ForwardBatch::push_lookback`] keeps: V4.1's longest n-gram
/// reads 3 back; configs may ask for up to 7.
pub const LOOKBACK: usize = 7;

impl ForwardBatch {
    /// Whole prompts from position 0, asking for the last position of each (or every
    /// position when `all_positions`).
    pub fn from_prompts(prompts: &[Vec<u32>], all_positions: bool) -> Self {
        let mut b = ForwardBatch::default();
        for p in prompts {
            let logits = if all_positions { p.len() } else { 1 };
            b.push_span(0, p.iter().copied(), logits);
        }
        b
    }

    /// Appends one sequence's `tokens` at positions `start..`, asking for the logits of the
    /// last `num_logits` of them.
    pub fn push_span(
        &mut self,
        start: usize,
        tokens: impl IntoIterator<Item = u32>,
        num_logits: usize,
    ) {
        let first = self.token_ids.len();
        self.token_ids.extend(tokens);
        let len = self.token_ids.len() - first;
        self.positions.extend(start..start + len);
        self.spans.push(SeqSpan { start: first, len });
        self.logits_rows
            .extend(first + len - num_logits.min(len)..first + len);
        self.lookback_ends.push(self.lookback.len());
    }

    /// Gives the span just pushed the tokens before it (its sequence's history, oldest
    /// first); only the last [`LOOKBACK`] are kept.
    pub fn push_lookback(&mut self, history: impl IntoIterator<Item = u32>) {
        let from = self.lookback_ends.iter().rev().nth(1).copied().unwrap_or(0);
        self.lookback.extend(history);
        let extra = (self.lookback.len() - from).saturating_sub(LOOKBACK);
        self.lookback.drain(from..from + extra);
        if let Some(end) = self.lookback_ends.last_mut() {
            *end = self.lookback.len();
        }
    }

    /// Gives `values.len() / hidden` consecutive rows of the span just pushed, from its
    /// offset `first`, their input embeddings.
    pub fn push_embeds(&mut self, first: usize, values: &[f32], hidden: usize) {
        let span = self.spans.last().expect("a span to give embeddings to");
        let rows = values.len() / hidden;
        debug_assert!(first + rows <= span.len);
        self.embed_rows
            .extend(span.start + first..span.start + first + rows);
        self.embed_values.extend_from_slice(values);
    }

    /// Tells the span just pushed that its positions `first..=last` hold an image.
    pub fn push_image_span(&mut self, first: usize, last: usize) {
        let seq = self
            .spans
            .len()
            .checked_sub(1)
            .expect("a span to give images to");
        self.image_spans.push(ImageSpan { seq, first, last });
    }

    /// The tokens before span `s` given with [`Self::push_lookback`] (empty when none were).
    pub fn lookback(&self, s: usize) -> &[u32] {
        let start = if s == 0 {
            0
        } else {
            self.lookback_ends.get(s - 1).copied().unwrap_or(0)
        };
        let end = self.lookback_ends.get(s).copied().unwrap_or(start);
        &self.lookback[start.min(end)..end]
    }

    /// Empties the batch, keeping its buffers.
    pub fn clear(&mut self) {
        self.token_ids.clear();
        self.positions.clear();
        self.spans.clear();
        self.logits_rows.clear();
        self.window_floor.clear();
        self.lookback.clear();
        self.lookback_ends.clear();
        self.embed_rows.clear();
        self.embed_values.clear();
        self.image_spans.clear();
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }
}

/// Logits for the requested rows, `[rows, vocab]` row-major.
#[derive(Clone, Debug)]
pub struct Logits {
    pub vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    pub fn rows(&self) -> usize {
        self.data.len() / self.vocab.max(1)
    }
}
