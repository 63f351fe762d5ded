//! Incremental detokenization (vLLM / HF TGI "prefix offset / read offset" algorithm).
//!
//! The ids are decoded in a sliding window: `prefix_offset..read_offset` is the part whose text
//! was already emitted (kept as context, because a token's text can depend on its neighbours),
//! `read_offset..` the part not yet emitted. After each new id the window is decoded twice and
//! the difference is the candidate delta; it is held back while it ends with U+FFFD (a UTF-8
//! character split across byte-level tokens). Because every emitted text ends at a complete
//! character, the decoder state resets there, so the deltas concatenate to exactly the full
//! decode.

use super::Tokenizer;

const REPLACEMENT: char = '\u{FFFD}';

/// How many prompt tokens [`IncrementalDetokenizer::with_prompt`] keeps as decoding context
/// (vLLM's `INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET`).
pub const PROMPT_CONTEXT_TOKENS: usize = 5;

/// Turns a stream of token ids into a stream of text deltas.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    tokenizer: Tokenizer,
    skip_special_tokens: bool,
    /// Context ids (prompt tail) followed by every id pushed.
    ids: Vec<u32>,
    /// Number of leading `ids` that are prompt context, not output.
    num_context: usize,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDetokenizer {
    /// A detokenizer for output that starts from scratch.
    pub fn new(tokenizer: Tokenizer, skip_special_tokens: bool) -> Self {
        Self::with_prompt(tokenizer, &[], skip_special_tokens)
    }

    /// A detokenizer for output that follows `prompt_ids`: the last few prompt ids are used as
    /// decoding context (not emitted), as vLLM does.
    pub fn with_prompt(
        tokenizer: Tokenizer,
        prompt_ids: &[u32],
        skip_special_tokens: bool,
    ) -> Self {
        let context = &prompt_ids[prompt_ids.len().saturating_sub(PROMPT_CONTEXT_TOKENS)..];
        Self {
            tokenizer,
            skip_special_tokens,
            ids: context.to_vec(),
            num_context: context.len(),
            prefix_offset: 0,
            read_offset: context.len(),
        }
    }

    /// Feeds one id; returns the newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.ids.push(id);
        let prefix_text = self.decode(self.prefix_offset, self.read_offset);
        let new_text = self.decode(self.prefix_offset, self.ids.len());
        if new_text.len() > prefix_text.len()
            && !new_text.ends_with(REPLACEMENT)
            && new_text.starts_with(&prefix_text)
        {
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            new_text[prefix_text.len()..].to_owned()
        } else {
            String::new()
        }
    }

    /// Feeds several ids; returns the concatenated deltas.
    pub fn push_all(&mut self, ids: &[u32]) -> String {
        ids.iter().map(|&id| self.push(id)).collect()
    }

    /// Emits whatever is still held back (e.g. an incomplete character at the end of the
    /// stream, which decodes to U+FFFD as in the full decode). Call once at the end.
    pub fn flush(&mut self) -> String {
        let prefix_text = self.decode(self.prefix_offset, self.read_offset);
        let new_text = self.decode(self.prefix_offset, self.ids.len());
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        match new_text.strip_prefix(prefix_text.as_str()) {
            Some(rest) => rest.to_owned(),
            // Not reachable with a byte-level decoder; emit nothing rather than garbage.
            None => String::new(),
        }
    }

    /// The output ids pushed so far (prompt context excluded).
    pub fn output_ids(&self) -> &[u32] {
        &self.ids[self.num_context..]
    }

    /// Whether special tokens are dropped from the text.
    pub fn skip_special_tokens(&self) -> bool {
        self.skip_special_tokens
    }

    fn decode(&self, start: usize, end: usize) -> String {
        self.tokenizer
            .decode(&self.ids[start..end], self.skip_special_tokens)
    }
}
