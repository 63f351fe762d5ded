//! DeepSeek-V4 chat format: rendering against fixtures from the reference encoder
//! (tools/make_chat_fixtures.py).

mod chat {
    pub mod render;
}
