//! `POST /ai/channels/{channel_id}/webhook`: one request from a chat
//! service. Refused requests (bad secret or signature, stale timestamp,
//! malformed body) leave nothing behind; a message the channel delivers
//! again (its retries, or two nodes at once) is acted on once and answered
//! 200 every time.

use std::sync::Arc;
use std::time::SystemTime;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use keel_core::{CoreError, StartRun};
use keel_gateway::{
    ApprovalClick, ChatType, Command, Decision, Inbound, OutboundMessage, Webhook, WebhookError,
};
use keel_protocol::{Principal, RunFilter, RunStatus};
use secrecy::ExposeSecret;
use serde_json::{Value, json};

use super::{Channel, Gateway, deliver};
use crate::error::{ErrorResponse, from_core};
use crate::extract::Path;
use crate::{ApiError, AppState};

/// One request from a chat channel: a Telegram update, a Slack event or
/// interaction, or keel's signed JSON webhook (docs/gateway.md).
///
/// Authenticated by the channel's secret or signature, not by an API key.
#[utoipa::path(
    post,
    path = "/ai/channels/{channel_id}/webhook",
    operation_id = "channelWebhook",
    tag = "channels",
    security(()),
    params(("channel_id" = String, Path, description = "The channel's `id` in `[[channels]]`")),
    request_body(
        content = Object,
        content_type = "application/json",
        description = "The service's own payload (Slack interactions are form-encoded)"
    ),
    responses(
        (status = 200, description = "Taken in (also for a repeat of a message already taken in)", body = Object),
        (status = 400, description = "Authentic but malformed", body = ErrorResponse),
        (status = 401, description = "A missing or wrong secret or signature, or a stale timestamp", body = ErrorResponse),
        (status = 404, description = "No such channel", body = ErrorResponse),
        (status = 429, description = "The channel's tenant is at one of its quotas (`quota_exceeded`, docs/quotas.md)", body = ErrorResponse,
            headers(("Retry-After" = u64, description = "Seconds until the limit frees up"))),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
pub async fn webhook(
    State(s): State<AppState>,
    Path(channel_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let no_channel = || ApiError::not_found("channel");
    let gateway = s.gateway.clone().ok_or_else(no_channel)?;
    let channel = gateway.channels.get(&channel_id).ok_or_else(no_channel)?;
    let parsed = keel_gateway::parse(
        &channel.config,
        channel.secrets.inbound.expose_secret(),
        &headers,
        &body,
        SystemTime::now(),
    )
    .map_err(|e| match e {
        WebhookError::Unauthorized(m) => {
            tracing::info!(channel = %channel_id, reason = %m, "refused a channel request");
            ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m)
        }
        WebhookError::BadRequest(m) => ApiError::bad_request(m),
    })?;
    match parsed {
        Webhook::Challenge(challenge) => {
            Ok(Json(json!({ "challenge": challenge })).into_response())
        }
        Webhook::Ignored(reason) => Ok(ok(json!({ "ignored": reason }))),
        Webhook::Message(msg) => message(&s, &gateway, channel, *msg).await,
        Webhook::Click(click) => self::click(&s, &gateway, channel, *click).await,
    }
}

fn ok(mut extra: Value) -> Response {
    if let Value::Object(map) = &mut extra {
        map.insert("ok".into(), Value::Bool(true));
    }
    (StatusCode::OK, Json(extra)).into_response()
}

/// Who a channel message acts as: the linked person's keel principal id
/// when there is one, else the channel identity; never any role, so a chat
/// message can do no more than the policy allows anyone.
fn principal_of(msg: &Inbound, person: Option<&str>) -> Principal {
    Principal {
        tenant: msg.tenant.clone(),
        id: match person {
            Some(p) => format!("person:{p}"),
            None => format!("{}:{}", msg.channel, msg.sender),
        },
        roles: Vec::new(),
    }
}

async fn message(
    s: &AppState,
    gateway: &Arc<Gateway>,
    channel: &Channel,
    mut msg: Inbound,
) -> Result<Response, ApiError> {
    // Before the dispatch hooks see it; the runtime would redact it only
    // once the message starts a run.
    s.runtime.options().redactor.redact_string(&mut msg.text);
    let router = gateway.router();
    let Some(route) = router.route(&msg) else {
        return Ok(ok(json!({ "ignored": "no agent to route the message to" })));
    };
    let principal = principal_of(&msg, route.person.as_deref());
    let runtime = &s.runtime;
    super::hooks::message_received(
        &gateway.hooks,
        &gateway.http,
        super::hooks::payload(keel_config::HookPoint::MessageReceived, &msg, &route),
    );

    // In a direct chat the sender owns the session; in a group, only a
    // person linked to a keel principal may reset or stop the shared one.
    let authorized = msg.chat_type == ChatType::Direct
        || router
            .identities()
            .principal(&msg.channel, &msg.sender)
            .is_some();
    if let Some(command) = msg.command
        && !authorized
    {
        reply(
            gateway,
            channel,
            &msg,
            "Only a linked user may do that in a group.",
        )
        .await;
        return Ok(ok(json!({ "refused": command.as_str() })));
    }
    if msg.command == Some(Command::Stop) {
        if !first_sight(s, &msg.tenant, &msg.channel, &msg.dedupe_id).await? {
            return Ok(ok(json!({ "duplicate": true })));
        }
        let stopped = stop_session(s, &msg.tenant, &route.session_key, &principal.id).await?;
        let text = if stopped == 0 {
            "Nothing is running."
        } else {
            "Stopped."
        };
        reply(gateway, channel, &msg, text).await;
        return Ok(ok(json!({ "stopped": stopped })));
    }

    // A reply while the session's run waits for an answer is that answer.
    if msg.command.is_none()
        && let Some(waiting) = waiting_run(s, &msg.tenant, &route.session_key).await?
    {
        if !first_sight(s, &msg.tenant, &msg.channel, &msg.dedupe_id).await? {
            return Ok(ok(json!({ "duplicate": true })));
        }
        return match runtime.input(&msg.tenant, &waiting, msg.text.clone()).await {
            Ok(()) => Ok(ok(json!({ "run_id": waiting, "input": true }))),
            // Answered meanwhile (another node took the first copy): the
            // message is not lost, it starts a run of its own below.
            Err(CoreError::Conflict(_)) => start(s, gateway, &msg, route).await,
            Err(e) => Err(from_core(e, "run")),
        };
    }
    start(s, gateway, &msg, route).await
}

/// A new run for the message. Its idempotency key is the channel's message
/// id, so the same message delivered twice, to one node or to several at
/// once, starts one run: the store's unique key decides.
async fn start(
    s: &AppState,
    gateway: &Gateway,
    msg: &Inbound,
    route: keel_gateway::Route,
) -> Result<Response, ApiError> {
    let principal = principal_of(msg, route.person.as_deref());
    let input = match msg.command {
        // The runtime's own session reset, whose answer goes back to the chat.
        Some(Command::New) => "/new".to_owned(),
        Some(Command::Reset) => "/reset".to_owned(),
        _ => msg.text.clone(),
    };
    let mut metadata = json!({
        "channel": deliver::origin(msg, route.person.as_deref()),
        "matched_by": route.matched_by.as_str(),
    });
    let hook_body = super::hooks::payload(keel_config::HookPoint::BeforePromptBuild, msg, &route);
    if let Some(context) =
        super::hooks::prompt_context(&gateway.hooks, &gateway.http, &hook_body).await
    {
        metadata["prompt_context"] = Value::String(context);
    }
    let request = StartRun {
        input,
        session: Some(route.session_key.clone()),
        agent: Some(route.agent.clone()),
        idempotency_key: Some(format!("channel:{}:{}", msg.channel, msg.dedupe_id)),
        metadata,
        client_tools: Vec::new(),
    };
    let run = s
        .runtime
        .start_run(&principal, request)
        .await
        .map_err(|e| from_core(e, "agent"))?;
    Ok(ok(json!({
        "run_id": run.id,
        "session": route.session_key,
        "agent": route.agent,
        "matched_by": route.matched_by.as_str(),
    })))
}

/// Records a channel's message or click; false when it was seen before.
async fn first_sight(
    s: &AppState,
    tenant: &str,
    channel: &str,
    id: &str,
) -> Result<bool, ApiError> {
    s.runtime
        .store()
        .record_inbound(tenant, channel, id)
        .await
        .map_err(|e| from_core(e.into(), "channel"))
}

/// The newest run of the session that waits for an answer.
async fn waiting_run(
    s: &AppState,
    tenant: &str,
    session: &str,
) -> Result<Option<String>, ApiError> {
    let filter = RunFilter {
        session: Some(session.to_owned()),
        status: Some(RunStatus::WaitingInput),
        limit: 1,
        ..RunFilter::default()
    };
    let page = s
        .runtime
        .list_runs(tenant, &filter)
        .await
        .map_err(|e| from_core(e, "run"))?;
    Ok(page.runs.into_iter().next().map(|r| r.id))
}

/// Cancels every run of the session that has not ended; how many.
async fn stop_session(
    s: &AppState,
    tenant: &str,
    session: &str,
    by: &str,
) -> Result<usize, ApiError> {
    let filter = RunFilter {
        session: Some(session.to_owned()),
        limit: 100,
        ..RunFilter::default()
    };
    let page = s
        .runtime
        .list_runs(tenant, &filter)
        .await
        .map_err(|e| from_core(e, "run"))?;
    let mut stopped = 0;
    for run in page.runs.iter().filter(|r| !r.status.is_terminal()) {
        match s.runtime.cancel(tenant, &run.id, by).await {
            Ok(()) => stopped += 1,
            // Ended meanwhile.
            Err(CoreError::Conflict(_) | CoreError::NotFound) => {}
            Err(e) => return Err(from_core(e, "run")),
        }
    }
    Ok(stopped)
}

/// A short answer in the chat the message came from; failures are logged,
/// as there is no run to record them in.
async fn reply(gateway: &Gateway, channel: &Channel, msg: &Inbound, text: &str) {
    let message = OutboundMessage::Text {
        to: msg.reply.clone(),
        text: text.to_owned(),
    };
    let attempts = gateway.send(channel, &message).await;
    if !attempts.last().is_some_and(|a| a.ok) {
        let detail = attempts
            .last()
            .map(|a| a.detail.clone())
            .unwrap_or_default();
        tracing::warn!(channel = %msg.channel, detail = %detail, "could not answer in the chat");
    }
}

/// An approve or deny button pressed in a chat: decided as the keel
/// principal the clicker is linked to, with that principal's roles, through
/// the same approval the API and the console decide.
async fn click(
    s: &AppState,
    gateway: &Arc<Gateway>,
    channel: &Channel,
    click: ApprovalClick,
) -> Result<Response, ApiError> {
    if !first_sight(s, &click.tenant, &click.channel, &click.dedupe_id).await? {
        return Ok(ok(json!({ "duplicate": true })));
    }
    let principal = gateway
        .router()
        .identities()
        .principal(&click.channel, &click.sender)
        .and_then(|id| s.auth.principal_named(&click.tenant, id));
    let (text, decided) = match principal {
        None => (
            "Sorry, you are not linked to a keel user who may decide approvals.".to_owned(),
            false,
        ),
        Some(p) => {
            let approve = click.decision == Decision::Approve;
            let reason = format!("decided in {}", click.channel);
            match s
                .runtime
                .decide_approval(&p, &click.approval_id, approve, &reason)
                .await
            {
                Ok(_) => (
                    format!(
                        "{} by {}.",
                        if approve { "Approved" } else { "Denied" },
                        p.id
                    ),
                    true,
                ),
                Err(CoreError::Forbidden(_)) => {
                    ("Sorry, you may not decide approvals.".to_owned(), false)
                }
                Err(CoreError::Conflict(_)) => ("This was already decided.".to_owned(), false),
                Err(CoreError::NotFound) => ("This approval no longer exists.".to_owned(), false),
                Err(e) => return Err(from_core(e, "approval")),
            }
        }
    };
    let answer = OutboundMessage::ClickAnswer {
        answer: click.answer.clone(),
        text: text.clone(),
    };
    let attempts = gateway.send(channel, &answer).await;
    if !attempts.last().is_some_and(|a| a.ok) {
        tracing::warn!(channel = %click.channel, "could not acknowledge an approval click");
    }
    Ok(ok(json!({ "decided": decided, "answer": text })))
}
