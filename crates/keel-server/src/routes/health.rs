use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use keel_memory::MemoryStatus;
use serde::Serialize;
use utoipa::ToSchema;

use crate::{ApiError, AppState};

#[derive(Serialize, ToSchema)]
pub struct Health {
    status: HealthStatus,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum HealthStatus {
    Ok,
}

/// The process is up.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "health",
    security(()),
    responses((status = 200, description = "Alive", body = Health))
)]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: HealthStatus::Ok,
    })
}

/// Whether this node can serve: its store answers.
#[derive(Serialize, ToSchema)]
pub struct Readiness {
    status: ReadyStatus,
    checks: ReadyChecks,
    node: NodeInfo,
    /// How memory search is answered; `null` without memory or when not ready.
    memory: Option<MemoryStatus>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum ReadyStatus {
    Ready,
    NotReady,
}

#[derive(Serialize, ToSchema)]
pub struct ReadyChecks {
    /// `ok`, or what failed.
    store: String,
}

#[derive(Serialize, ToSchema)]
pub struct NodeInfo {
    id: String,
    /// Runs this node owns; `null` when they could not be counted.
    owned_runs: Option<u64>,
}

/// Whether this node is ready to serve.
///
/// Store health, and which node this is with how many runs it owns (with
/// several nodes on one database, the load balancer's view of each).
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "health",
    security(()),
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "Not ready: the store does not answer", body = Readiness),
    )
)]
pub async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    let id = s.runtime.node_id().to_owned();
    // Memory degrades (BM25 only without an embedding model) but never silently.
    let memory = s.memory.as_ref().map(|m| m.status());
    match s.runtime.store().ping().await {
        Ok(()) => {
            let owned_runs = s.runtime.owned_runs().await.ok();
            (
                StatusCode::OK,
                Json(Readiness {
                    status: ReadyStatus::Ready,
                    checks: ReadyChecks { store: "ok".into() },
                    node: NodeInfo { id, owned_runs },
                    memory,
                }),
            )
        }
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Readiness {
                status: ReadyStatus::NotReady,
                checks: ReadyChecks {
                    store: e.to_string(),
                },
                node: NodeInfo {
                    id,
                    owned_runs: None,
                },
                memory: None,
            }),
        ),
    }
}

/// Prometheus metrics, in the text exposition format.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "health",
    security(()),
    responses((status = 200, description = "The metrics", content_type = "text/plain", body = String))
)]
pub async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    metrics::gauge!("keel_active_runs").set(s.runtime.active_runs() as f64);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        s.metrics.render(),
    )
}

pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}
