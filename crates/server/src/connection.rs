//! One client connection: HTTP/1.1 through hyper with a header read timeout, a write timeout
//! on the socket, and a count of the requests in flight on it, so that shutdown closes an
//! idle or half-sent connection at once and waits only for connections serving a request.

use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Sleep;
use tower::ServiceExt;

/// What every connection task needs.
pub(crate) struct Connection {
    pub app: Router,
    pub header_read_timeout: Duration,
    pub write_timeout: Duration,
    /// Becomes true when the server shuts down.
    pub closing: watch::Receiver<bool>,
}

/// Decrements a connection's in-flight count when the response (body included) is done.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves one connection until the client closes it, a timeout ends it, or shutdown: then a
/// connection with no request in flight is closed at once, one with a request in flight
/// finishes that response and closes.
pub(crate) async fn serve_connection(stream: TcpStream, mut conn: Connection) {
    let _ = stream.set_nodelay(true);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let count = in_flight.clone();
    let app = conn.app;
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let guard = InFlight::enter(&count);
        let app = app.clone();
        async move {
            let response = app.oneshot(req.map(Body::new)).await?;
            // The guard lives as long as the response body: a stream is in flight until
            // its last chunk is written (or the client goes away).
            Ok::<_, std::convert::Infallible>(response.map(move |body| {
                Body::new(body.map_frame(move |frame| {
                    let _ = &guard;
                    frame
                }))
            }))
        }
    });
    let io = TokioIo::new(WriteTimeout::new(stream, conn.write_timeout));
    let http = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(conn.header_read_timeout)
        .serve_connection(io, service);
    tokio::pin!(http);
    tokio::select! {
        _ = http.as_mut() => return,
        _ = conn.closing.wait_for(|&c| c) => {}
    }
    if in_flight.load(Ordering::Acquire) == 0 {
        return;
    }
    http.as_mut().graceful_shutdown();
    let _ = http.await;
}

/// A socket whose writes fail with `TimedOut` once the peer has accepted nothing for
/// `timeout`: a client that stops reading is disconnected instead of holding its
/// connection (and its paused request) forever.
struct WriteTimeout {
    inner: TcpStream,
    timeout: Duration,
    /// Running while writes are blocked; reset by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl WriteTimeout {
    fn new(inner: TcpStream, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// Maps a write attempt's result: progress clears the timer, a blocked write starts it
    /// (and fails once it has run out).
    fn watch<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let timeout = self.timeout;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing within the write timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for WriteTimeout {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteTimeout {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
