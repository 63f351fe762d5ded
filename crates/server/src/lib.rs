//! deepinfer's serving layer: tokenizer (with incremental detokenizer and stop-string
//! matching); HTTP, OpenAI types, chat rendering and output parsing come later.

pub mod tokenizer;
