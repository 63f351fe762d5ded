//! Runs the HTTP server on a bound listener until a shutdown signal, then lets in-flight
//! requests finish (their streams complete) before returning — for at most a drain
//! deadline, or until a second signal: a stuck or very long generation must not keep an
//! operator's Ctrl-C from stopping the process.
//!
//! Connections are HTTP/1.1 (as vLLM's), each bounded: at most `max_connections` at once
//! (further ones wait in the listen backlog), request headers within `header_read_timeout`
//! (this also ends an idle keep-alive connection), request bodies as [`crate::body`] says,
//! and a client that accepts no response bytes for `write_timeout` is disconnected, which
//! aborts its request.

use crate::body::BodyLimits;
use crate::connection::{serve_connection, Connection};
use crate::routes;
use crate::state::AppState;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// How long aborted streams get to send their last chunk once the drain is cut short.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// The server's limits (each is a `deepinfer serve` flag, with its default there; see
/// docs/RELIABILITY.md).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub max_body_bytes: usize,
    /// Request bodies in hand at once, across all connections.
    pub body_budget_bytes: usize,
    pub body_read_timeout: Duration,
    pub header_read_timeout: Duration,
    pub write_timeout: Duration,
    pub max_connections: usize,
    pub drain_timeout: Duration,
}

/// Serves `state` on `listener`. The first `signal()` stops accepting connections, closes
/// every connection with no request in flight, and starts draining: the call returns once
/// every open connection has finished, or, at the latest, when `drain_timeout` has passed
/// or a second `signal()` resolves. In those cases the engine is shut down, which aborts
/// every request still generating (their streams end with `finish_reason: "abort"`), and
/// the call returns shortly after.
pub async fn serve<S, F>(
    listener: TcpListener,
    state: Arc<AppState>,
    config: ServeConfig,
    signal: S,
) -> std::io::Result<()>
where
    S: Fn() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let engine = state.engine.clone();
    let body = BodyLimits::new(
        config.max_body_bytes,
        config.body_read_timeout,
        config.body_budget_bytes,
    );
    let app = routes::router(state, body);
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let (closing_tx, closing) = watch::channel(false);
    let mut conns = JoinSet::new();
    let first = signal();
    tokio::pin!(first);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            _ = &mut first => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was accepted:
                    // keep serving the ones already open.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut first => break,
        };
        let conn = Connection {
            app: app.clone(),
            header_read_timeout: config.header_read_timeout,
            write_timeout: config.write_timeout,
            closing: closing.clone(),
        };
        conns.spawn(async move {
            serve_connection(stream, conn).await;
            drop(slot);
        });
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    tracing::info!(
        connections = conns.len(),
        "shutdown requested: finishing in-flight requests"
    );
    let _ = closing_tx.send(true);
    // Armed only now, so it sees the next signal, not the one that started the drain.
    let second = signal();
    let drained = async { while conns.join_next().await.is_some() {} };
    let timed_out = tokio::select! {
        _ = drained => return Ok(()),
        _ = tokio::time::sleep(config.drain_timeout) => true,
        _ = second => false,
    };
    if timed_out {
        tracing::warn!(
            "{} connections still have requests in flight {} s after the shutdown request: \
             aborting them",
            conns.len(),
            config.drain_timeout.as_secs_f64()
        );
    } else {
        tracing::warn!("second shutdown request: aborting every request");
    }
    engine.shutdown();
    let finished = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(ABORT_GRACE, finished).await.is_err() {
        tracing::warn!(
            "{} connections still open after aborting; closing them",
            conns.len()
        );
        conns.shutdown().await;
    }
    Ok(())
}

/// Resolves on Ctrl-C or (on Unix) SIGTERM received after the call.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
