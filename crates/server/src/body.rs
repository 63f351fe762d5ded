//! Request bodies, read whole before a handler runs. A body is refused by its declared length
//! before a byte of it is read (413), bounded while it is read (413 past the size limit, 408
//! past the read deadline), and counted against one budget shared by every connection until
//! its handler has answered (503 when the bodies in hand would pass it). One slow client
//! therefore holds a connection for a bounded time, and many large bodies at once cannot
//! take more memory than the budget.

use crate::openai::ApiError;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget counts whole KiB.
const KIB: usize = 1024;

pub struct BodyLimits {
    max_bytes: usize,
    read_timeout: Duration,
    /// KiB of request bodies that may be in hand at once, across all connections.
    budget: Arc<Semaphore>,
    budget_bytes: usize,
}

impl BodyLimits {
    /// `budget_bytes` is raised to at least one body of `max_bytes`.
    pub fn new(max_bytes: usize, read_timeout: Duration, budget_bytes: usize) -> Self {
        let budget_bytes = budget_bytes.max(max_bytes);
        let kib = budget_bytes.div_ceil(KIB).min(Semaphore::MAX_PERMITS);
        Self {
            max_bytes,
            read_timeout,
            budget: Arc::new(Semaphore::new(kib)),
            budget_bytes,
        }
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    fn too_large(&self) -> ApiError {
        let mut e = ApiError::bad_request(format!(
            "the request body is larger than the server's limit of {} bytes \
             (--max-request-body-mib)",
            self.max_bytes
        ));
        e.status = StatusCode::PAYLOAD_TOO_LARGE;
        e
    }

    fn over_budget(&self) -> ApiError {
        let mut e = ApiError::bad_request(format!(
            "the server is handling {} MiB of request bodies, its limit; retry later",
            self.budget_bytes >> 20
        ));
        e.status = StatusCode::SERVICE_UNAVAILABLE;
        e.kind = "server_overloaded";
        e
    }

    fn too_slow(&self) -> ApiError {
        let mut e = ApiError::bad_request(format!(
            "the request body did not arrive within {} s (--body-read-timeout-secs)",
            self.read_timeout.as_secs_f64()
        ));
        e.status = StatusCode::REQUEST_TIMEOUT;
        e
    }

    /// Reads `body` whole, taking budget for every KiB as it arrives.
    async fn read(
        &self,
        body: &mut Body,
        held: &mut Option<OwnedSemaphorePermit>,
    ) -> Result<Bytes, ApiError> {
        let mut buf: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let len = buf.len() + data.len();
            if len > self.max_bytes {
                return Err(self.too_large());
            }
            let have = held.as_ref().map_or(0, |p| p.num_permits());
            let need = len.div_ceil(KIB);
            if need > have {
                let more = self
                    .budget
                    .clone()
                    .try_acquire_many_owned((need - have) as u32)
                    .map_err(|_| self.over_budget())?;
                match held {
                    Some(p) => p.merge(more),
                    None => *held = Some(more),
                }
            }
            buf.extend_from_slice(&data);
        }
        Ok(Bytes::from(buf))
    }
}

/// How long a refused body is still read (and thrown away) after the answer.
const LINGER: Duration = Duration::from_secs(5);

impl BodyLimits {
    /// Reads and drops what is left of a refused body for a moment, in the background:
    /// a client that sends its body without waiting for `100 Continue` is still writing
    /// when the refusal goes out, and closing on unread bytes would reset the connection
    /// before it reads the answer. Bounded in time and bytes; nothing is kept.
    fn discard(&self, mut body: Body) {
        let most = self.max_bytes.saturating_mul(4);
        tokio::spawn(async move {
            let drain = async {
                let mut seen = 0usize;
                while let Some(Ok(frame)) = body.frame().await {
                    seen += frame.data_ref().map_or(0, |d| d.len());
                    if seen > most {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(LINGER, drain).await;
        });
    }
}

/// Middleware: the request reaches the handler with its body read whole (see the module).
pub async fn read_whole_body(
    State(limits): State<Arc<BodyLimits>>,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut body = body;
    if declared.is_some_and(|n| n > limits.max_bytes as u64) {
        limits.discard(body);
        return limits.too_large().into_response();
    }
    let mut held = None;
    let read = limits.read(&mut body, &mut held);
    let bytes = match tokio::time::timeout(limits.read_timeout, read).await {
        Err(_) => return limits.too_slow().into_response(),
        Ok(Err(e)) => {
            limits.discard(body);
            return e.into_response();
        }
        Ok(Ok(bytes)) => bytes,
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    // The handler has parsed (and tokenized) what it needed from the body by now.
    drop(held);
    response
}
