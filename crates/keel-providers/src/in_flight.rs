//! A provider's bound on requests in flight.
//!
//! Over HTTP/1.1 each request in flight holds a connection of its own, with
//! its buffers (about 30 KB), for as long as the model takes to answer. A
//! burst of runs would otherwise open one connection per run: 2,000 runs
//! started at once held 1,700 connections to the model and 100 MB of memory
//! between them. A provider's rate limit caps how many requests are worth
//! sending at once anyway; the rest wait their turn, in order.

use std::sync::Arc;

use keel_protocol::ModelError;
use tokio::sync::{Semaphore, SemaphorePermit, TryAcquireError};

/// keel's configuration default (`max_concurrent_requests`).
pub(crate) const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 256;

/// Shared by the clones of one client, so the bound is the provider's.
#[derive(Debug, Clone)]
pub(crate) struct InFlight(Arc<Semaphore>);

impl InFlight {
    /// At most `limit` requests at once (at least one).
    pub(crate) fn new(limit: usize) -> Self {
        Self(Arc::new(Semaphore::new(
            limit.clamp(1, Semaphore::MAX_PERMITS),
        )))
    }

    /// Waits for a place; the request holds it until its reply is read.
    /// The wait is not part of the request's timeout: a request that has
    /// not been sent cannot have timed out.
    pub(crate) async fn enter(&self, model: &str) -> Result<SemaphorePermit<'_>, ModelError> {
        match self.0.try_acquire() {
            Ok(permit) => Ok(permit),
            Err(TryAcquireError::NoPermits) => {
                tracing::debug!(
                    model,
                    "the provider's max_concurrent_requests are in flight; this request waits"
                );
                self.0.acquire().await.map_err(|_| closed())
            }
            Err(TryAcquireError::Closed) => Err(closed()),
        }
    }
}

/// Never closed while its client exists; named in case that changes.
fn closed() -> ModelError {
    ModelError::Connect("the provider's request limiter was closed".into())
}
