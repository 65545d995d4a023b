use axum::Json;
use axum::extract::State;
use keel_protocol::Message;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ErrorResponse, from_core};
use crate::extract::{Path, Query};
use crate::{ApiError, AppState};

/// A session's conversation, oldest message first.
#[derive(Serialize, ToSchema)]
pub struct SessionView {
    key: String,
    messages: Vec<SessionMessage>,
}

/// One message of a session, with the run that wrote it.
#[derive(Serialize, ToSchema)]
pub struct SessionMessage {
    run_id: String,
    #[serde(flatten)]
    message: Message,
}

/// The messages of one of the caller's tenant's sessions.
#[utoipa::path(
    get,
    path = "/ai/sessions/{key}",
    operation_id = "getSession",
    tag = "sessions",
    params(("key" = String, Path, description = "The session key (a run's `session`)")),
    responses(
        (status = 200, description = "The session", body = SessionView),
        (status = 400, description = "A malformed path", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 404, description = "No such session in the caller's tenant", body = ErrorResponse),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
pub async fn get(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(key): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    let messages = s
        .runtime
        .session(&p.tenant, &key)
        .await
        .map_err(|e| from_core(e, "session"))?;
    let messages = messages
        .into_iter()
        .map(|(run_id, message)| SessionMessage { run_id, message })
        .collect();
    Ok(Json(SessionView { key, messages }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ResetQuery {
    /// The agent whose model writes the summary; the default agent when absent.
    #[param(min_length = 1)]
    agent: Option<String>,
}

/// Archives the session and writes its summary to long-term memory.
#[utoipa::path(
    post,
    path = "/ai/sessions/{key}/reset",
    operation_id = "resetSession",
    tag = "sessions",
    params(("key" = String, Path, description = "The session key (a run's `session`)"), ResetQuery),
    responses(
        (status = 200, description = "What the reset did", body = keel_core::SessionReset),
        (status = 400, description = "A malformed path or query, or no such agent", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 404, description = "No such session in the caller's tenant", body = ErrorResponse),
        (status = 409, description = "A run of the session is still going", body = ErrorResponse),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
pub async fn reset(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(key): Path<String>,
    Query(q): Query<ResetQuery>,
) -> Result<Json<keel_core::SessionReset>, ApiError> {
    s.runtime
        .reset_session(&p, &key, q.agent.as_deref())
        .await
        .map(Json)
        .map_err(|e| from_core(e, "session"))
}
