mod approvals;
mod health;
mod memory;
mod responses;
mod runs;
mod sessions;
mod tools;

use axum::Router;
use axum::routing::{get, post};

use crate::{AppState, console};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(console::index))
        .route("/console/{file}", get(console::file))
        .route("/ai/runs", post(runs::create).get(runs::list))
        .route("/ai/runs/{id}", get(runs::get))
        .route("/ai/runs/{id}/events", get(runs::events))
        .route("/ai/runs/{id}/input", post(runs::input))
        .route("/ai/runs/{id}/steer", post(runs::steer))
        .route("/ai/runs/{id}/follow_up", post(runs::follow_up))
        .route("/ai/runs/{id}/restore", post(runs::restore))
        .route("/ai/runs/{id}/cancel", post(runs::cancel))
        .route("/ai/approvals", get(approvals::list))
        .route(
            "/ai/approvals/{id}",
            get(approvals::get).post(approvals::decide),
        )
        .route("/ai/tools", get(tools::list))
        .route("/ai/sessions/{key}", get(sessions::get))
        .route("/ai/sessions/{key}/reset", post(sessions::reset))
        .route("/ai/memory/search", get(memory::search))
        .route("/ai/memory/documents", post(memory::add_document))
        .route("/v1/responses", post(responses::create))
        .route("/v1/models", get(responses::models))
        .route("/v1/models/{id}", get(responses::model))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .fallback(health::not_found)
}
