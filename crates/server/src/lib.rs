//! deepinfer's serving layer: tokenizer (with incremental detokenizer and stop-string
//! matching) and the DeepSeek-V4 chat format (prompt rendering, output parsing); HTTP and the
//! OpenAI request/response types come later.

pub mod chat;
pub mod tokenizer;
