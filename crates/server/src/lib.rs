//! deepinfer's serving layer: the OpenAI-compatible HTTP API over the engine, with the
//! tokenizer (incremental detokenizer, stop strings) and DeepSeek-V4's chat format (prompt
//! rendering, reasoning and DSML tool-call parsing).

pub mod anthropic;
pub mod body;
pub mod chat;
mod connection;
pub mod generation;
pub mod images;
pub mod openai;
mod routes;
pub mod serve;
pub mod state;
pub mod structured;
pub mod tokenizer;

pub use routes::router;
pub use serve::{serve, shutdown_signal, ServeConfig};
pub use state::AppState;
