//! The HTTP server loop: hyper with the limits a public door needs, which `axum::serve` does not
//! offer — a cap on open connections, a deadline for a request's headers (a slow-loris client
//! holds a connection for at most that long), and the peer address for per-client limits.
//!
//! Request and body deadlines are layers of the router (`http::router`); this module owns the
//! connection.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::ConnectInfo;
use axum::extract::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::telemetry;

/// Limits of the connection layer.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Most connections open at once; the next one waits in the kernel's backlog.
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers (also bounds an idle keep-alive
    /// connection waiting for its next request).
    pub header_read_timeout: Duration,
}

/// Serves `app` on `listener` until `shutdown` fires, then stops accepting and waits for the
/// open connections to finish their requests (the caller bounds that wait).
pub async fn serve<S>(
    listener: TcpListener,
    app: S,
    limits: ConnLimits,
    shutdown: CancellationToken,
) where
    S: tower::Service<Request<Incoming>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(limits.header_read_timeout));
    loop {
        // A permit first: at the cap, connections wait in the backlog instead of being accepted
        // and starved.
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = app.clone().map_request(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            req
        });
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(service))
            .into_owned();
        let conn = graceful.watch(conn);
        metrics::gauge!(telemetry::HTTP_CONNECTIONS).increment(1.0);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            metrics::gauge!(telemetry::HTTP_CONNECTIONS).decrement(1.0);
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The peer address the server recorded for a request (`None` when the router is driven
/// without this server, as in unit tests).
pub fn peer(req: &Request) -> Option<SocketAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
}
