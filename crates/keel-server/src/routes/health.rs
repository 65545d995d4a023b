use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::json;

use crate::{ApiError, AppState};

pub async fn healthz() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// Store health, and which node this is with how many runs it owns (with
/// several nodes on one database, the load balancer's view of each).
pub async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    let node = s.runtime.node_id().to_owned();
    // Memory degrades (BM25 only without an embedding model) but never silently.
    let memory = s.memory.as_ref().map(|m| {
        let st = m.status();
        json!({"embedder": st.embedder, "notice": st.notice})
    });
    match s.runtime.store().ping().await {
        Ok(()) => {
            let owned = s.runtime.owned_runs().await.ok();
            (
                StatusCode::OK,
                Json(json!({
                    "status": "ready",
                    "checks": {"store": "ok"},
                    "node": {"id": node, "owned_runs": owned},
                    "memory": memory,
                })),
            )
        }
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "not_ready",
                "checks": {"store": e.to_string()},
                "node": {"id": node},
            })),
        ),
    }
}

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
