//! `/ai/runs`: start, inspect, stream and steer runs. Every lookup is scoped
//! by the caller's tenant; another tenant's run is a plain 404.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use keel_core::StartRun;
use keel_core::runtime::MAX_INPUT_BYTES;
use keel_protocol::{RunFilter, RunRecord, RunStatus};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::{ErrorResponse, from_core};
use crate::extract::{Path, Query};
use crate::{ApiError, AppState, sse};

/// The body of `POST /ai/runs`.
#[derive(Deserialize, ToSchema)]
#[schema(example = json!({"input": "How is furnace 2?"}))]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    /// What the user asks: not blank, at most 32 KiB. `/new` or `/reset`
    /// resets the session instead.
    #[schema(pattern = r"\S")]
    input: String,
    /// The conversation this run continues (1 to 200 characters); a new
    /// session when absent.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 200)]
    session: Option<String>,
    /// The agent to run; the configured default when absent.
    #[serde(default)]
    #[schema(min_length = 1)]
    agent: Option<String>,
    /// A second request of the tenant with the same key (1 to 200
    /// characters) returns the first run instead of starting another.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 200)]
    idempotency_key: Option<String>,
    /// Free-form data kept with the run and returned with it.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    metadata: Option<serde_json::Map<String, Value>>,
}

#[derive(Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CreateQuery {
    /// `true` (or `1`) answers with the run's event stream, as
    /// `Accept: text/event-stream` does.
    #[serde(default)]
    #[param(value_type = Option<bool>)]
    stream: Option<String>,
}

#[derive(Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Resume after this event sequence number (`Last-Event-ID` wins when
    /// both are given); from the first event when absent.
    #[serde(default)]
    #[param(value_type = Option<u64>)]
    after: Option<String>,
}

/// `{"status": "accepted"}`: the command was queued for the run.
#[derive(Serialize, ToSchema)]
pub struct Accepted {
    status: AcceptedStatus,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum AcceptedStatus {
    Accepted,
}

/// One page of runs, newest first.
#[derive(Serialize, ToSchema)]
pub struct RunList {
    runs: Vec<RunRecord>,
    /// Pass as `cursor` for the next page; `null` on the last one.
    next_cursor: Option<String>,
}

/// Starts a run.
///
/// Answers at once with the new run, or, when asked to stream, with its
/// event stream until the run stops.
#[utoipa::path(
    post,
    path = "/ai/runs",
    operation_id = "createRun",
    tag = "runs",
    params(CreateQuery),
    request_body = CreateRun,
    responses(
        (status = 201, description = "The run, started", body = RunRecord),
        (status = 200, description = "With `stream=true` or `Accept: text/event-stream`: the run's events as SSE frames until it stops", content_type = "text/event-stream", body = crate::openapi::RunEventFrame),
        (status = 400, description = "A malformed body or field", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 403, description = "The caller may not use this agent", body = ErrorResponse),
        (status = 404, description = "No such agent", body = ErrorResponse),
        (status = 409, description = "Conflicts with a run of the session", body = ErrorResponse),
        (status = 413, description = "The body or input is too large", body = ErrorResponse),
        (status = 429, description = "The tenant is at one of its quotas (`quota_exceeded`, docs/quotas.md); `quota` names the limit", body = ErrorResponse,
            headers(("Retry-After" = u64, description = "Seconds until the limit frees up"))),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
pub async fn create(
    State(s): State<AppState>,
    Caller(p): Caller,
    Query(q): Query<CreateQuery>,
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
    if wants_stream(&headers, &q) {
        let (_, events) = s
            .runtime
            .start_run_followed(&p, req)
            .await
            .map_err(|e| from_core(e, "agent"))?;
        return Ok(sse::frames(events));
    }
    let run = s
        .runtime
        .start_run(&p, req)
        .await
        .map_err(|e| from_core(e, "agent"))?;
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

fn wants_stream(headers: &HeaderMap, q: &CreateQuery) -> bool {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"));
    accept || matches!(q.stream.as_deref(), Some("true" | "1"))
}

/// One run of the caller's tenant.
#[utoipa::path(
    get,
    path = "/ai/runs/{id}",
    operation_id = "getRun",
    tag = "runs",
    params(("id" = String, Path, description = "The run id (`run_…`)")),
    responses(
        (status = 200, description = "The run", body = RunRecord),
        (status = 400, description = "A malformed path", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 404, description = "No such run in the caller's tenant", body = ErrorResponse),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
pub async fn get(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
) -> Result<Json<RunRecord>, ApiError> {
    s.runtime
        .get_run(&p.tenant, &id)
        .await
        .map(Json)
        .map_err(|e| from_core(e, "run"))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only the runs of this session.
    session: Option<String>,
    /// Only the runs of this agent.
    agent: Option<String>,
    /// Only the runs with this status.
    #[param(value_type = Option<RunStatus>)]
    status: Option<String>,
    /// Runs per page, 1 to 100 (default 20).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 100)]
    limit: Option<String>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// The caller's tenant's runs, newest first, a page at a time.
#[utoipa::path(
    get,
    path = "/ai/runs",
    operation_id = "listRuns",
    tag = "runs",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of runs", body = RunList),
        (status = 400, description = "A malformed filter, limit or cursor", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
pub async fn list(
    State(s): State<AppState>,
    Caller(p): Caller,
    Query(q): Query<ListQuery>,
) -> Result<Json<RunList>, ApiError> {
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
    Ok(Json(RunList {
        runs: page.runs,
        next_cursor: page.next_cursor,
    }))
}

/// Streams a run's events.
///
/// The run's event log as Server-Sent Events, from the start or after a
/// sequence number, live until the run stops. Each frame is
/// `id: <seq>`, `event: <type>`, `data: <Event JSON>`; comment lines keep
/// an idle stream alive.
#[utoipa::path(
    get,
    path = "/ai/runs/{id}/events",
    operation_id = "streamRunEvents",
    tag = "runs",
    params(
        ("id" = String, Path, description = "The run id (`run_…`)"),
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event sequence number (what an `EventSource` sends when it reconnects)"),
        EventsQuery,
    ),
    responses(
        (status = 200, description = "The event stream", content_type = "text/event-stream", body = crate::openapi::RunEventFrame),
        (status = 400, description = "A malformed `Last-Event-ID` or `after`, or one past the run's last event", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 404, description = "No such run in the caller's tenant", body = ErrorResponse),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
pub async fn events(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
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
    // Events are stored before anyone sees them, so a client cannot have
    // seen one past the run's last: following from there would wait for
    // numbers the run may never reach (forever, once it has ended).
    if after > run.last_seq {
        return Err(ApiError::bad_request(format!(
            "Last-Event-ID/after: {after} is past the run's last event ({})",
            run.last_seq
        )));
    }
    // A run that has ended writes nothing more: after its last event, the
    // stream is empty and closes at once instead of idling on heartbeats.
    if run.status.is_terminal() && after == run.last_seq {
        return Ok(sse::ended().into_response());
    }
    Ok(sse::stream(s.runtime.clone(), run.id, after).into_response())
}

/// A text for a run: an answer, a steering note or a follow-up.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TextBody {
    /// Not blank, at most 32 KiB.
    #[schema(pattern = r"\S")]
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

fn accepted() -> (StatusCode, Json<Accepted>) {
    (
        StatusCode::ACCEPTED,
        Json(Accepted {
            status: AcceptedStatus::Accepted,
        }),
    )
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
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
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

/// Answers the question a run waits on (`waiting_input`).
#[utoipa::path(
    post,
    path = "/ai/runs/{id}/input",
    operation_id = "answerRun",
    tag = "runs",
    params(("id" = String, Path, description = "The run id (`run_…`)")),
    request_body = TextBody,
    responses(
        (status = 202, description = "Queued for the run", body = Accepted),
        (status = 400, description = "A malformed body, or a blank text", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 404, description = "No such run in the caller's tenant", body = ErrorResponse),
        (status = 409, description = "The run is not in a state that takes this", body = ErrorResponse),
        (status = 413, description = "The body or text is too large", body = ErrorResponse),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
pub async fn input(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<TextBody>,
) -> Result<impl IntoResponse, ApiError> {
    send_text(s, p, id, body, TextCommand::Input).await
}

/// A note the running run takes into account at its next step.
#[utoipa::path(
    post,
    path = "/ai/runs/{id}/steer",
    operation_id = "steerRun",
    tag = "runs",
    params(("id" = String, Path, description = "The run id (`run_…`)")),
    request_body = TextBody,
    responses(
        (status = 202, description = "Queued for the run", body = Accepted),
        (status = 400, description = "A malformed body, or a blank text", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 404, description = "No such run in the caller's tenant", body = ErrorResponse),
        (status = 409, description = "The run is not in a state that takes this", body = ErrorResponse),
        (status = 413, description = "The body or text is too large", body = ErrorResponse),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
pub async fn steer(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<TextBody>,
) -> Result<impl IntoResponse, ApiError> {
    send_text(s, p, id, body, TextCommand::Steer).await
}

/// A message the run handles after its current answer, in the same run.
#[utoipa::path(
    post,
    path = "/ai/runs/{id}/follow_up",
    operation_id = "followUpRun",
    tag = "runs",
    params(("id" = String, Path, description = "The run id (`run_…`)")),
    request_body = TextBody,
    responses(
        (status = 202, description = "Queued for the run", body = Accepted),
        (status = 400, description = "A malformed body, or a blank text", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 404, description = "No such run in the caller's tenant", body = ErrorResponse),
        (status = 409, description = "The run is not in a state that takes this", body = ErrorResponse),
        (status = 413, description = "The body or text is too large", body = ErrorResponse),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
pub async fn follow_up(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<TextBody>,
) -> Result<impl IntoResponse, ApiError> {
    send_text(s, p, id, body, TextCommand::FollowUp).await
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreBody {
    /// A `checkpoint` event's `checkpoint_id`.
    #[schema(pattern = r"\S")]
    checkpoint_id: String,
}

/// Takes the run back to one of its checkpoints and goes on from there.
#[utoipa::path(
    post,
    path = "/ai/runs/{id}/restore",
    operation_id = "restoreRun",
    tag = "runs",
    params(("id" = String, Path, description = "The run id (`run_…`)")),
    request_body = RestoreBody,
    responses(
        (status = 202, description = "Queued for the run", body = Accepted),
        (status = 400, description = "A malformed body, or an unknown checkpoint", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 404, description = "No such run or checkpoint in the caller's tenant", body = ErrorResponse),
        (status = 409, description = "The run is not in a state that can be restored", body = ErrorResponse),
        (status = 413, description = "The body is too large", body = ErrorResponse),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
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

/// Cancels a run.
#[utoipa::path(
    post,
    path = "/ai/runs/{id}/cancel",
    operation_id = "cancelRun",
    tag = "runs",
    params(("id" = String, Path, description = "The run id (`run_…`)")),
    responses(
        (status = 202, description = "Queued for the run", body = Accepted),
        (status = 400, description = "A malformed path", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 404, description = "No such run in the caller's tenant", body = ErrorResponse),
        (status = 409, description = "The run already stopped", body = ErrorResponse),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
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
