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
}

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
    }

    /// Empties the batch, keeping its buffers.
    pub fn clear(&mut self) {
        self.token_ids.clear();
        self.positions.clear();
        self.spans.clear();
        self.logits_rows.clear();
        self.window_floor.clear();
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
