//! Runs the HTTP server on a bound listener until a shutdown signal, then lets in-flight
//! requests finish (their streams complete) before returning — for at most a drain
//! deadline, or until a second signal: a stuck or very long generation must not keep an
//! operator's Ctrl-C from stopping the process.

use crate::routes;
use crate::state::AppState;
use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// How long aborted streams get to send their last chunk once the drain is cut short.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// Serves `state` on `listener`. The first `signal()` stops accepting connections and
/// starts draining: the call returns once every open connection has finished, or, at the
/// latest, when `drain_timeout` has passed or a second `signal()` resolves. In those cases
/// the engine is shut down, which aborts every request still generating (their streams end
/// with `finish_reason: "abort"`), and the call returns shortly after.
pub async fn serve<S, F>(
    listener: TcpListener,
    state: Arc<AppState>,
    max_body_bytes: usize,
    signal: S,
    drain_timeout: Duration,
) -> std::io::Result<()>
where
    S: Fn() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let engine = state.engine.clone();
    let app = routes::router(state, max_body_bytes);
    let (draining_tx, draining_rx) = tokio::sync::oneshot::channel::<()>();
    let first = signal();
    let graceful = async move {
        first.await;
        tracing::info!("shutdown requested: finishing in-flight requests");
        let _ = draining_tx.send(());
    };
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(graceful)
        .into_future();
    tokio::pin!(server);
    tokio::select! {
        result = &mut server => return result,
        _ = draining_rx => {}
    }
    // Armed only now, so it sees the next signal, not the one that started the drain.
    let second = signal();
    tokio::select! {
        result = &mut server => return result,
        _ = tokio::time::sleep(drain_timeout) => {
            tracing::warn!(
                "requests still running {} s after the shutdown request: aborting them",
                drain_timeout.as_secs_f64()
            );
        }
        _ = second => tracing::warn!("second shutdown request: aborting every request"),
    }
    engine.shutdown();
    match tokio::time::timeout(ABORT_GRACE, &mut server).await {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!("connections still open after aborting; exiting anyway");
            Ok(())
        }
    }
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
