//! keel's HTTP face: the run API with its resumable SSE event stream
//! (SPEC §2, §3), auth and tenant scoping, health and metrics, and the
//! operator console at `/`.

mod auth;
mod body;
mod console;
mod error;
mod extract;
pub mod gateway;
pub mod metrics;
mod openapi;
mod routes;
mod serve;
mod sse;

use std::sync::Arc;

use axum::Router;
use keel_core::Runtime;

pub use auth::Auth;
pub use error::{ApiError, ErrorResponse};
/// Entry points for the fuzz targets under `fuzz/`; not part of the
/// supported API.
#[doc(hidden)]
pub use routes::responses_fuzzing as fuzzing;

/// Everything a request handler may use.
#[derive(Clone)]
pub struct AppState {
    pub runtime: Runtime,
    pub auth: Arc<Auth>,
    pub max_body_bytes: usize,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Long-term memory for `/ai/memory/*`; `None` answers those with 503.
    pub memory: Option<Arc<dyn keel_memory::Memory>>,
    /// The chat channels; `None` when none are configured.
    pub gateway: Option<Arc<gateway::Gateway>>,
}

pub fn router(state: AppState) -> Router {
    routes::router().with_state(state)
}

/// The OpenAPI 3.1 document of every route [`router`] serves (also served
/// at `GET /openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    routes::api().into_openapi()
}

/// Serves until `shutdown` resolves, then waits for open connections to
/// finish their requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // One router for every connection: a `Router` is cheap to clone, and
    // each open event stream keeps only its clone.
    serve::serve(listener, router(state), shutdown).await
}
