//! DeepSeek-V4 chat format: rendering against fixtures from the reference encoder
//! (tools/make_chat_fixtures.py), output parsing (round trips, streaming splits, malformed
//! output), and tokenization of rendered prompts.

mod chat {
    pub mod parse;
    pub mod render;
    pub mod stream_bytes;
    pub mod tokenize;
}
