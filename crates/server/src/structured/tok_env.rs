//! The tokenizer as llguidance sees it: every id's bytes in a token trie, the special ids
//! (BOS, EOS) marked as such, so a grammar can only reach them by name and never as text.

use crate::tokenizer::Tokenizer;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use std::sync::Arc;

/// The token environment of `tok`; `eos` is the id a finished grammar allows.
pub fn tok_env(tok: &Tokenizer, eos: u32) -> TokEnv {
    let special: std::collections::HashSet<u32> = tok
        .inner()
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special)
        .map(|(id, _)| id)
        .collect();
    let vocab = tok.vocab_size().max(eos as usize + 1);
    let words: Vec<Vec<u8>> = (0..vocab as u32)
        .map(|id| {
            if special.contains(&id) {
                let name = tok.id_to_token(id).unwrap_or_default();
                [&[TokTrie::SPECIAL_TOKEN_MARKER][..], name.as_bytes()].concat()
            } else {
                tok.token_bytes(id)
            }
        })
        .collect();
    let trie = TokTrie::from(&TokRxInfo::new(vocab as u32, eos), &words);
    Arc::new(ApproximateTokEnv::new(trie))
}
