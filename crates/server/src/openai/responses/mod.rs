//! OpenAI's Responses API (`/v1/responses`): the request translated into the chat request the
//! V4 renderer takes ([`convert`]), the chat parser's output as output items with their
//! stream events ([`output`]), and the bounded store behind `previous_response_id` and
//! `GET /v1/responses/{id}` ([`store`]). Routes live in `routes/responses.rs`.

mod convert;
mod output;
mod request;
mod store;

pub use convert::{conversation, Conversation};
pub use output::{Items, OutputItem};
pub use request::ResponsesRequest;
pub use store::{ResponseStore, Stored};
