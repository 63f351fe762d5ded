//! Runs the HTTP server on a bound listener until a shutdown signal, then lets in-flight
//! requests finish (their streams complete) before returning.

use crate::routes;
use crate::state::AppState;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Serves `state` on `listener`; returns after `shutdown` resolves and every open
/// connection has finished.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    max_body_bytes: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = routes::router(state, max_body_bytes);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Resolves on Ctrl-C or (on Unix) SIGTERM.
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
    tracing::info!("shutdown requested: finishing in-flight requests");
}
