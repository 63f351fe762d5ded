//! `/tokenize` and `/detokenize` (vLLM's): the server's own tokenizer, so clients can count
//! tokens exactly as generation will.

use super::{blocking, body_bytes, Shared};
use crate::openai::{fields, ApiError, ChatFields};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
struct TokenizeFields {
    model: Option<String>,
    prompt: Option<String>,
    /// Only whether it is there: the chat form is read as [`ChatFields`].
    messages: Option<IgnoredAny>,
    add_special_tokens: Option<bool>,
    #[serde(default)]
    return_token_strs: bool,
}

pub async fn tokenize(
    State(st): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let bytes = body_bytes(body)?;
    let f: TokenizeFields = fields(&bytes)?;
    st.check_model(f.model.as_deref())?;
    let tok = st.tokenizer.clone();
    let limits = st.prompt_limits;
    let ids = match (f.prompt, f.messages) {
        (Some(p), _) => {
            limits.check_text("prompt", &p)?;
            let add_special = f.add_special_tokens.unwrap_or(true);
            blocking(&st, move || {
                tok.encode(&p, add_special)
                    .map_err(|e| ApiError::invalid("prompt", e.to_string()))
            })
            .await?
        }
        // The chat form renders the conversation exactly as /v1/chat/completions would.
        (None, Some(_)) => {
            let cf: ChatFields = fields(&bytes)?;
            drop(bytes);
            super::chat::check_takes_images(&st, &cf.messages)?;
            // Image spans counted: each image decoded and planned, not encoded.
            let state = st.clone();
            blocking(&st, move || {
                let vision = state.engine.vision().map(|v| &**v);
                super::chat::chat_prompt(state.chat_format, &tok, &cf, &limits, vision)
            })
            .await?
            .ids
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "prompt",
                "`prompt` or `messages` is required",
            ))
        }
    };
    let token_strs = f.return_token_strs.then(|| {
        ids.iter()
            .map(|&id| st.tokenizer.id_to_token(id).unwrap_or_default())
            .collect::<Vec<_>>()
    });
    Ok(Json(json!({
        "count": ids.len(),
        "max_model_len": st.engine.max_model_len(),
        "tokens": ids,
        "token_strs": token_strs,
    })))
}

#[derive(Deserialize)]
struct DetokenizeFields {
    model: Option<String>,
    tokens: Vec<u32>,
}

pub async fn detokenize(
    State(st): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let f: DetokenizeFields = fields(&body_bytes(body)?)?;
    st.check_model(f.model.as_deref())?;
    // No sequence the model can hold is longer; decoding a longer list would only cost.
    let max_model_len = st.prompt_limits.max_model_len;
    if f.tokens.len() > max_model_len {
        return Err(ApiError::invalid(
            "tokens",
            format!(
                "at most {max_model_len} token ids (the model's context) can be detokenized, \
                 got {}",
                f.tokens.len()
            ),
        ));
    }
    let vocab = st.tokenizer.vocab_size();
    if let Some(&id) = f.tokens.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {id} is outside the vocabulary of {vocab}"),
        ));
    }
    let tok = st.tokenizer.clone();
    let text = blocking(&st, move || {
        tok.try_decode(&f.tokens, false)
            .map_err(|e| ApiError::invalid("tokens", e.to_string()))
    })
    .await?;
    Ok(Json(json!({ "prompt": text })))
}
