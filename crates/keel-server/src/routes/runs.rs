//! `/ai/runs`: start, inspect, stream and steer runs. Every lookup is scoped
//! by the caller's tenant; another tenant's run is a plain 404.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use keel_core::StartRun;
use keel_core::runtime::MAX_INPUT_BYTES;
use keel_protocol::{RunFilter, RunStatus};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::from_core;
use crate::{ApiError, AppState, sse};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    input: String,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    metadata: Option<serde_json::Map<String, Value>>,
}

#[derive(Deserialize, Default)]
pub struct StreamQuery {
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    after: Option<String>,
}

pub async fn create(
    State(s): State<AppState>,
    Caller(p): Caller,
    Query(q): Query<StreamQuery>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CreateRun>,
) -> Result<Response, ApiError> {
    if body.input.len() > MAX_INPUT_BYTES {
        return Err(ApiError::too_large(format!(
            "input: {} bytes exceeds the {MAX_INPUT_BYTES}-byte limit",
            body.input.len()
        )));
    }
    check_key("session", body.session.as_deref())?;
    check_key("idempotency_key", body.idempotency_key.as_deref())?;
    let req = StartRun {
        input: body.input,
        session: body.session,
        agent: body.agent,
        idempotency_key: body.idempotency_key,
        metadata: body.metadata.map(Value::Object).unwrap_or(Value::Null),
        client_tools: Vec::new(),
    };
    let run = s
        .runtime
        .start_run(&p, req)
        .await
        .map_err(|e| from_core(e, "agent"))?;
    if wants_stream(&headers, &q) {
        return Ok(sse::stream(s.runtime.clone(), run.id, 0).into_response());
    }
    Ok((StatusCode::CREATED, Json(run)).into_response())
}

fn check_key(field: &str, v: Option<&str>) -> Result<(), ApiError> {
    match v {
        Some(k) if k.is_empty() || k.len() > 200 => Err(ApiError::bad_request(format!(
            "{field}: must be 1 to 200 characters"
        ))),
        _ => Ok(()),
    }
}

fn wants_stream(headers: &HeaderMap, q: &StreamQuery) -> bool {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"));
    accept || matches!(q.stream.as_deref(), Some("true" | "1"))
}

pub async fn get(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
) -> Result<Json<keel_protocol::RunRecord>, ApiError> {
    s.runtime
        .get_run(&p.tenant, &id)
        .await
        .map(Json)
        .map_err(|e| from_core(e, "run"))
}

#[derive(Deserialize)]
pub struct ListQuery {
    session: Option<String>,
    agent: Option<String>,
    status: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

pub async fn list(
    State(s): State<AppState>,
    Caller(p): Caller,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let status = match q.status.as_deref() {
        None | Some("") => None,
        Some(v) => Some(RunStatus::parse(v).ok_or_else(|| {
            ApiError::bad_request(format!(
                "status: `{v}` is not one of queued, running, waiting_input, waiting_approval, completed, failed, cancelled"
            ))
        })?),
    };
    let limit = match q.limit.as_deref() {
        None | Some("") => 20,
        Some(v) => match v.parse::<u32>() {
            Ok(n) if (1..=100).contains(&n) => n,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "limit: `{v}` is not a number from 1 to 100"
                )));
            }
        },
    };
    let filter = RunFilter {
        session: q.session.filter(|s| !s.is_empty()),
        agent: q.agent.filter(|a| !a.is_empty()),
        status,
        limit,
        cursor: q.cursor.filter(|c| !c.is_empty()),
    };
    let page = s
        .runtime
        .list_runs(&p.tenant, &filter)
        .await
        .map_err(|e| match e {
            keel_core::CoreError::Store(keel_protocol::StoreError::Conflict(m)) => {
                ApiError::bad_request(format!("cursor: {m}"))
            }
            other => from_core(other, "run"),
        })?;
    Ok(Json(
        json!({"runs": page.runs, "next_cursor": page.next_cursor}),
    ))
}

pub async fn events(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    Query(q): Query<StreamQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let run = s
        .runtime
        .get_run(&p.tenant, &id)
        .await
        .map_err(|e| from_core(e, "run"))?;
    let header_after = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let after = match header_after.or(q.after.as_deref()) {
        None | Some("") => 0,
        Some(v) => v.trim().parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "Last-Event-ID/after: `{v}` is not an event sequence number"
            ))
        })?,
    };
    Ok(sse::stream(s.runtime.clone(), run.id, after).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextBody {
    text: String,
}

fn text_of(body: TextBody) -> Result<String, ApiError> {
    if body.text.trim().is_empty() {
        return Err(ApiError::bad_request("text: must not be empty"));
    }
    if body.text.len() > MAX_INPUT_BYTES {
        return Err(ApiError::too_large(format!(
            "text: {} bytes exceeds the {MAX_INPUT_BYTES}-byte limit",
            body.text.len()
        )));
    }
    Ok(body.text)
}

fn accepted() -> (StatusCode, Json<Value>) {
    (StatusCode::ACCEPTED, Json(json!({"status": "accepted"})))
}

/// The three commands that carry a text to a run.
enum TextCommand {
    Input,
    Steer,
    FollowUp,
}

async fn send_text(
    s: AppState,
    p: keel_protocol::Principal,
    id: String,
    body: TextBody,
    command: TextCommand,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let text = text_of(body)?;
    let runtime = &s.runtime;
    let sent = match command {
        TextCommand::Input => runtime.input(&p.tenant, &id, text).await,
        TextCommand::Steer => runtime.steer(&p.tenant, &id, text).await,
        TextCommand::FollowUp => runtime.follow_up(&p.tenant, &id, text).await,
    };
    sent.map_err(|e| from_core(e, "run"))?;
    Ok(accepted())
}

pub async fn input(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<TextBody>,
) -> Result<impl IntoResponse, ApiError> {
    send_text(s, p, id, body, TextCommand::Input).await
}

pub async fn steer(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<TextBody>,
) -> Result<impl IntoResponse, ApiError> {
    send_text(s, p, id, body, TextCommand::Steer).await
}

pub async fn follow_up(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<TextBody>,
) -> Result<impl IntoResponse, ApiError> {
    send_text(s, p, id, body, TextCommand::FollowUp).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreBody {
    checkpoint_id: String,
}

/// `POST /ai/runs/{id}/restore {checkpoint_id}`.
pub async fn restore(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<RestoreBody>,
) -> Result<impl IntoResponse, ApiError> {
    if body.checkpoint_id.trim().is_empty() {
        return Err(ApiError::bad_request("checkpoint_id: must not be empty"));
    }
    s.runtime
        .restore(&p.tenant, &id, &body.checkpoint_id)
        .await
        .map_err(|e| from_core(e, "run"))?;
    Ok(accepted())
}

pub async fn cancel(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    s.runtime
        .cancel(&p.tenant, &id, &p.id)
        .await
        .map_err(|e| from_core(e, "run"))?;
    Ok(accepted())
}
