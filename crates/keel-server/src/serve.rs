//! The accept loop: HTTP/1.1 connections served by hyper, one task each.
//!
//! axum's own `serve` takes hyper's defaults, which let a connection's read
//! buffer grow to 16 KB and beyond; each open event stream keeps its
//! buffer for as long as the run lasts, so 2,000 streams held 33 MB of
//! read buffers alone. Here the buffer is capped at 8 KB, which is also
//! the largest request head keel accepts (the size most servers allow;
//! request bodies are read in chunks and are not limited by it).

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

/// The read buffer's cap, hence the largest request head, in bytes (hyper's
/// smallest allowed).
const MAX_BUF_SIZE: usize = 8 * 1024;

/// A client must send its request head within this time.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// After a failed accept that is not the peer's doing (out of file
/// descriptors, say), the loop waits this long before accepting again.
const ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Serves `app` on `listener` until `shutdown` resolves, then waits for the
/// open connections to finish their requests.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.max_buf_size(MAX_BUF_SIZE)
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) if peer_error(&e) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "accepting a connection failed; trying again in 1 s");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Without TCP_NODELAY the last small SSE frame of a run waits for
        // the client's delayed ACK of the previous one (tens of milliseconds).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let service = TowerToHyperService::new(app.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(tcp), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Errors that concern one connection only: the loop goes on at once.
fn peer_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}
