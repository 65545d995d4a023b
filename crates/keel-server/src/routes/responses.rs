//! OpenAI Responses compatibility (SPEC §7): `POST /v1/responses` and
//! `GET /v1/models`, so the official OpenAI SDKs can drive keel agents.
//!
//! A response is a stretch of a keel run (see `responses/ids.rs`):
//! - no `previous_response_id` and no replayed keel items: a new run in a
//!   new session;
//! - the previous response ended with function calls, and `input` has a
//!   `function_call_output` for each: the outputs go to the SAME run, which
//!   verifies them like any tool result and continues;
//! - the previous response asked the user a question: the new user message
//!   answers it and the same run continues;
//! - the previous run has ended: a new run in the same keel session, so the
//!   conversation continues with its history.
//!
//! `instructions` are prepended to a new run's input as context (keel's
//! agent keeps its own system prompt); a continued run already has them.
//! `store` is accepted but keel stores every run regardless: the event log
//! is its audit trail and what crash recovery resumes from. The response
//! says `store: true`, and its id stays usable as `previous_response_id`.
//! Sampling fields (`temperature`, `top_p`, `max_output_tokens`, …) are
//! echoed, not applied: the agent's configuration decides. A run that waits
//! for a human approval keeps the request open until it is decided.

mod driver;
mod encoder;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod ids;
mod request;
mod schema;

use std::sync::OnceLock;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use keel_core::{ClientToolOutput, StartRun};
use keel_protocol::{Principal, RunRecord, RunStatus};
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use utoipa::ToSchema;

use crate::AppState;
use driver::{Segment, drive, pending_calls};
use encoder::Encoder;
use error::{OaiError, OaiErrorResponse};
use request::{CreateResponse, FunctionTool, Item, Role};
use schema::ResponseObject;
pub use schema::ResponseStreamEvent;

/// Comment lines keep idle streams (a run waiting for an approval) alive.
const HEARTBEAT: Duration = Duration::from_secs(10);

fn caller(s: &AppState, headers: &HeaderMap) -> Result<Principal, OaiError> {
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    s.auth.principal_for(header).map_err(OaiError::from_api)
}

/// Creates a model response (OpenAI Responses API).
///
/// Starts or continues a keel run of the agent named by `model`. The
/// request stays open until the
/// response is complete (including while a tool call waits for a person's
/// approval); with `stream: true` its events come as SSE frames
/// (`event: response.*`, `data: <JSON>`).
#[utoipa::path(
    post,
    path = "/v1/responses",
    operation_id = "createResponse",
    tag = "openai",
    request_body = CreateResponse,
    responses(
        (status = 200, description = "The response; with `stream: true`, its events as SSE frames", content(
            (ResponseObject = "application/json"),
            (crate::openapi::ResponseEventFrame = "text/event-stream"),
        )),
        (status = 400, description = "A malformed body or field (`param` names it), or an unknown model", body = OaiErrorResponse),
        (status = 401, description = "No valid API key", body = OaiErrorResponse),
        (status = 403, description = "The caller may not do this", body = OaiErrorResponse),
        (status = 404, description = "`previous_response_id` or a replayed item names no response of the caller", body = OaiErrorResponse),
        (status = 409, description = "The conversation's run is not waiting for this", body = OaiErrorResponse),
        (status = 413, description = "The body is too large", body = OaiErrorResponse),
        (status = 429, description = "A new conversation's run is refused by a tenant quota (`code`: `quota_exceeded`, docs/quotas.md)", body = OaiErrorResponse,
            headers(("Retry-After" = u64, description = "Seconds until the limit frees up"))),
        (status = 503, description = "The store is unavailable", body = OaiErrorResponse),
    )
)]
pub async fn create(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, OaiError> {
    let principal = caller(&s, &headers)?;
    if body.len() > s.max_body_bytes {
        return Err(OaiError::invalid(
            "",
            format!(
                "the body is larger than the {}-byte limit",
                s.max_body_bytes
            ),
        )
        .with_status(axum::http::StatusCode::PAYLOAD_TOO_LARGE));
    }
    let req = request::parse_body(&body)?;
    request::check_choices(&req)?;
    let model = match req.model.as_deref() {
        Some(m) if !m.is_empty() => m.to_owned(),
        _ => {
            return Err(OaiError::invalid(
                "model",
                format!(
                    "required: a keel agent id (known: {})",
                    s.runtime.agent_ids().join(", ")
                ),
            ));
        }
    };
    if !s.runtime.agent_ids().contains(&model) {
        return Err(OaiError::invalid(
            "model",
            format!(
                "no agent named `{model}`; the models of this server are keel agents: {}",
                s.runtime.agent_ids().join(", ")
            ),
        )
        .with_code("model_not_found"));
    }
    let items = request::parse_input(req.input.as_ref())?;
    let tools = request::parse_tools(req.tools.as_deref())?;
    let seg = begin(&s, &principal, &req, &model, &items, &tools).await?;
    let base = base_response(&req, &model, &seg, &tools);
    let runtime = s.runtime.clone();
    let server_side = s.runtime.clone();
    let mut enc = Encoder::new(&seg.run_id, seg.start, base, move |tool| {
        server_side.tools().get(tool).is_none() && tool != keel_core::clarify::CLARIFY_TOOL
    });
    if req.stream != Some(true) {
        let response = drive(&runtime, &seg, &mut enc, None)
            .await
            .map_err(|_| OaiError::server("the response was abandoned"))?;
        return Ok(Json(response).into_response());
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Value>(64);
    tokio::spawn(async move {
        // A client that disconnects stops the stream, not the run.
        if drive(&runtime, &seg, &mut enc, Some(&tx)).await.is_err() {
            tracing::debug!(run = %seg.run_id, "responses stream client went away");
        }
    });
    let frames = ReceiverStream::new(rx).map(|e| {
        let kind = e
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("response.unknown")
            .to_owned();
        Ok::<_, std::convert::Infallible>(SseEvent::default().event(kind).data(e.to_string()))
    });
    Ok(Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(HEARTBEAT))
        .into_response())
}

/// Decides what the request continues or starts, and sets the run going.
async fn begin(
    s: &AppState,
    principal: &Principal,
    req: &CreateResponse,
    model: &str,
    items: &[Item],
    tools: &[FunctionTool],
) -> Result<Segment, OaiError> {
    let tenant = &principal.tenant;
    let (anchor, new_items) = anchor(s, tenant, req, items).await?;
    let outputs: Vec<ClientToolOutput> = new_items
        .iter()
        .filter_map(|i| match i {
            Item::FunctionCallOutput { call_id, output } => Some(ClientToolOutput {
                call_id: call_id.clone(),
                output: output.clone(),
            }),
            _ => None,
        })
        .collect();
    let messages: Vec<(Role, &str)> = new_items
        .iter()
        .filter_map(|i| match i {
            Item::Message { role, text, .. } => Some((*role, text.as_str())),
            _ => None,
        })
        .collect();
    let Some(run) = anchor else {
        if !outputs.is_empty() {
            return Err(OaiError::invalid(
                "input",
                "function_call_output items need the response that asked for them: set \
                 `previous_response_id`, or replay that response's function_call items \
                 (their ids name the keel run)",
            ));
        }
        return start(s, principal, req, model, tools, &messages, None).await;
    };
    let waiting_calls = pending_calls(&run);
    let waits_for_client = run.status == RunStatus::WaitingInput && !waiting_calls.is_empty();
    let seg = Segment {
        tenant: tenant.clone(),
        run_id: run.id.clone(),
        start: run.last_seq,
        baseline: run.usage,
    };
    if !outputs.is_empty() {
        if !waits_for_client {
            return Err(OaiError::conflict(
                "input",
                format!(
                    "the run of this conversation is {}, not waiting for function call outputs",
                    run.status.as_str()
                ),
            ));
        }
        check_outputs(&outputs, &waiting_calls)?;
        let said = user_text(&messages);
        if !said.is_empty() {
            // Processed when the run would otherwise finish.
            s.runtime
                .follow_up(tenant, &run.id, said)
                .await
                .map_err(|e| OaiError::from_core(e, "input"))?;
        }
        s.runtime
            .submit_tool_outputs(tenant, &run.id, outputs)
            .await
            .map_err(|e| OaiError::from_core(e, "input"))?;
        return Ok(seg);
    }
    if waits_for_client {
        let ids: Vec<&str> = waiting_calls.iter().map(|c| c.0.as_str()).collect();
        return Err(OaiError::invalid(
            "input",
            format!(
                "the previous response ended with function calls; send a function_call_output \
                 item for each of: {}",
                ids.join(", ")
            ),
        ));
    }
    if messages.is_empty() {
        return Err(OaiError::invalid(
            "input",
            "required: at least one message to continue the conversation",
        ));
    }
    match run.status {
        RunStatus::WaitingInput => {
            // The run asked the user a question; this message answers it.
            s.runtime
                .input(tenant, &run.id, user_text(&messages))
                .await
                .map_err(|e| OaiError::from_core(e, "input"))?;
            Ok(seg)
        }
        status if status.is_terminal() => {
            start(
                s,
                principal,
                req,
                model,
                tools,
                &messages,
                Some(run.session),
            )
            .await
        }
        status => Err(OaiError::conflict(
            "previous_response_id",
            format!(
                "the run of this conversation is still {}; wait for it to stop",
                status.as_str()
            ),
        )),
    }
}

/// The run the request continues, and the items that are new to it.
/// With `previous_response_id` every item is new; otherwise the last
/// replayed item keel issued marks where the run's own history ends.
async fn anchor<'a>(
    s: &AppState,
    tenant: &str,
    req: &CreateResponse,
    items: &'a [Item],
) -> Result<(Option<RunRecord>, &'a [Item]), OaiError> {
    if let Some(prev) = req.previous_response_id.as_deref() {
        let param = "previous_response_id";
        let (run_id, _) = ids::parse_response_id(prev)
            .ok_or_else(|| OaiError::response_not_found(param, prev))?;
        let run = s
            .runtime
            .get_run(tenant, &run_id)
            .await
            .map_err(|e| match e {
                keel_core::CoreError::NotFound => OaiError::response_not_found(param, prev),
                other => OaiError::from_core(other, param),
            })?;
        return Ok((Some(run), items));
    }
    let last = items
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, item)| Some((i, ids::run_of_item(item.id()?)?)));
    let Some((i, run_id)) = last else {
        return Ok((None, items));
    };
    let param = format!("input[{i}].id");
    let run = s
        .runtime
        .get_run(tenant, &run_id)
        .await
        .map_err(|e| match e {
            keel_core::CoreError::NotFound => OaiError::invalid(
                &param,
                format!(
                    "item `{}` belongs to a response that was not found",
                    items[i].id().unwrap_or_default()
                ),
            )
            .with_status(axum::http::StatusCode::NOT_FOUND)
            .with_code("not_found"),
            other => OaiError::from_core(other, &param),
        })?;
    Ok((Some(run), &items[i + 1..]))
}

/// Every waiting call needs exactly the outputs it asked for.
fn check_outputs(
    outputs: &[ClientToolOutput],
    waiting: &[(String, String, String)],
) -> Result<(), OaiError> {
    for o in outputs {
        if !waiting.iter().any(|w| w.0 == o.call_id) {
            return Err(OaiError::invalid(
                "input",
                format!(
                    "function_call_output for `{}`: the run does not wait for that call (it waits for: {})",
                    o.call_id,
                    waiting
                        .iter()
                        .map(|w| w.0.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    let missing: Vec<&str> = waiting
        .iter()
        .filter(|w| !outputs.iter().any(|o| o.call_id == w.0))
        .map(|w| w.0.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(OaiError::invalid(
            "input",
            format!("no function_call_output for: {}", missing.join(", ")),
        ));
    }
    Ok(())
}

async fn start(
    s: &AppState,
    principal: &Principal,
    req: &CreateResponse,
    model: &str,
    tools: &[FunctionTool],
    messages: &[(Role, &str)],
    session: Option<String>,
) -> Result<Segment, OaiError> {
    if messages.is_empty() {
        return Err(OaiError::invalid(
            "input",
            "required: a string or at least one message",
        ));
    }
    let input = compose(req.instructions.as_deref(), messages);
    if input.len() > keel_core::runtime::MAX_INPUT_BYTES {
        return Err(OaiError::invalid(
            "input",
            format!(
                "{} bytes exceeds the {}-byte limit",
                input.len(),
                keel_core::runtime::MAX_INPUT_BYTES
            ),
        ));
    }
    let run = s
        .runtime
        .start_run(
            principal,
            StartRun {
                input,
                session,
                agent: Some(model.to_owned()),
                idempotency_key: None,
                metadata: req
                    .metadata
                    .clone()
                    .map(Value::Object)
                    .unwrap_or(Value::Null),
                client_tools: tools.iter().map(FunctionTool::schema).collect(),
            },
        )
        .await
        .map_err(|e| {
            let param = match &e {
                keel_core::CoreError::BadRequest(m) if m.starts_with("tools") => "tools",
                _ => "input",
            };
            OaiError::from_core(e, param)
        })?;
    Ok(Segment {
        tenant: principal.tenant.clone(),
        run_id: run.id,
        start: 0,
        baseline: keel_protocol::Usage::default(),
    })
}

/// A new run's input: one user message as it is; otherwise the client's
/// instructions and messages as a labelled transcript, the last one last.
fn compose(instructions: Option<&str>, messages: &[(Role, &str)]) -> String {
    let instructions = instructions.filter(|i| !i.trim().is_empty());
    if let ([(Role::User, text)], None) = (messages, instructions) {
        return (*text).to_owned();
    }
    let mut parts = Vec::with_capacity(messages.len() + 1);
    if let Some(i) = instructions {
        parts.push(format!("[instructions]\n{i}"));
    }
    for (role, text) in messages {
        parts.push(format!("[{}]\n{text}", role.as_str()));
    }
    parts.join("\n\n")
}

/// What the user said in the new messages (answers and follow-ups).
fn user_text(messages: &[(Role, &str)]) -> String {
    messages
        .iter()
        .filter(|(r, _)| *r == Role::User)
        .map(|(_, t)| *t)
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// The fields of the response object that do not change while it runs.
fn base_response(
    req: &CreateResponse,
    model: &str,
    seg: &Segment,
    tools: &[FunctionTool],
) -> Map<String, Value> {
    let text = match &req.text {
        Some(t) if t.contains_key("format") => Value::Object(t.clone()),
        Some(t) => {
            let mut t = t.clone();
            t.insert("format".into(), json!({"type": "text"}));
            Value::Object(t)
        }
        None => json!({"format": {"type": "text"}}),
    };
    let reasoning = req.reasoning.as_ref().map(|r| {
        json!({
            "effort": r.get("effort").cloned().unwrap_or(Value::Null),
            "summary": r.get("summary").cloned().unwrap_or(Value::Null),
        })
    });
    let fields = json!({
        "id": ids::response_id(&seg.run_id, seg.start),
        "object": "response",
        "created_at": chrono::Utc::now().timestamp(),
        "model": model,
        "previous_response_id": req.previous_response_id,
        "instructions": req.instructions,
        "incomplete_details": null,
        "tools": tools.iter().map(FunctionTool::to_json).collect::<Vec<_>>(),
        "tool_choice": req.tool_choice.clone().filter(|v| !v.is_null()).unwrap_or(json!("auto")),
        "truncation": req.truncation.as_deref().unwrap_or("disabled"),
        "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
        "text": text,
        "temperature": req.temperature.unwrap_or(1.0),
        "top_p": req.top_p.unwrap_or(1.0),
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_logprobs": req.top_logprobs.unwrap_or(0),
        "reasoning": reasoning,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "store": true,
        "background": false,
        "service_tier": req.service_tier.as_deref().unwrap_or("default"),
        "metadata": req.metadata.clone().unwrap_or_default(),
        "safety_identifier": req.safety_identifier,
        "prompt_cache_key": req.prompt_cache_key,
        "user": req.user,
    });
    match fields {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// When this process first listed its models: agents carry no creation time.
fn models_created() -> i64 {
    static CREATED: OnceLock<i64> = OnceLock::new();
    *CREATED.get_or_init(|| chrono::Utc::now().timestamp())
}

fn model_of(id: &str) -> Model {
    Model {
        id: id.to_owned(),
        object: ModelKind::Model,
        created: models_created(),
        owned_by: "keel".into(),
    }
}

/// `GET /v1/models/{id}`: a keel agent, as a model.
#[derive(Serialize, ToSchema)]
pub struct Model {
    /// The agent id.
    pub id: String,
    pub object: ModelKind,
    /// Unix seconds: when this process first listed its models.
    pub created: i64,
    pub owned_by: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    Model,
}

/// `GET /v1/models`: the agents of this server.
#[derive(Serialize, ToSchema)]
pub struct ModelList {
    pub object: ListKind,
    pub data: Vec<Model>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ListKind {
    List,
}

/// Lists the models: the agents, which are what `model` names here.
#[utoipa::path(
    get,
    path = "/v1/models",
    operation_id = "listModels",
    tag = "openai",
    responses(
        (status = 200, description = "The models", body = ModelList),
        (status = 401, description = "No valid API key", body = OaiErrorResponse),
    )
)]
pub async fn models(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<ModelList>, OaiError> {
    caller(&s, &headers)?;
    let data = s
        .runtime
        .agent_ids()
        .iter()
        .map(|id| model_of(id))
        .collect();
    Ok(Json(ModelList {
        object: ListKind::List,
        data,
    }))
}

/// One model: an agent.
#[utoipa::path(
    get,
    path = "/v1/models/{id}",
    operation_id = "getModel",
    tag = "openai",
    params(("id" = String, Path, description = "The agent id")),
    responses(
        (status = 200, description = "The model", body = Model),
        (status = 400, description = "A malformed path", body = OaiErrorResponse),
        (status = 401, description = "No valid API key", body = OaiErrorResponse),
        (status = 404, description = "No such model", body = OaiErrorResponse),
    )
)]
pub async fn model(
    State(s): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Model>, OaiError> {
    caller(&s, &headers)?;
    // axum's own rejection is plain text; the `/v1` routes answer in OpenAI's shape.
    let Path(id) = id.map_err(|e| OaiError::invalid("id", e.body_text()))?;
    if s.runtime.agent_ids().contains(&id) {
        return Ok(Json(model_of(&id)));
    }
    Err(
        OaiError::invalid("model", format!("the model `{id}` does not exist"))
            .with_status(axum::http::StatusCode::NOT_FOUND)
            .with_code("model_not_found"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_user_message_is_the_input_as_is() {
        assert_eq!(compose(None, &[(Role::User, "hi")]), "hi");
    }

    #[test]
    fn instructions_and_history_become_a_transcript() {
        let s = compose(
            Some("Be brief."),
            &[(Role::Developer, "Plant 4."), (Role::User, "Status?")],
        );
        assert_eq!(
            s,
            "[instructions]\nBe brief.\n\n[developer]\nPlant 4.\n\n[user]\nStatus?"
        );
    }

    /// Whole responses and the snapshots in stream events, for every way a
    /// response ends, match the `ResponseObject` the document describes.
    #[test]
    fn encoded_responses_match_the_documented_schema() {
        use encoder::End;
        use keel_protocol::{Event, EventKind, Usage};

        let doc = serde_json::to_value(crate::openapi()).unwrap();
        let schema = json!({
            "$ref": "#/components/schemas/ResponseObject",
            "components": doc["components"],
        });
        let validator = jsonschema::validator_for(&schema).unwrap();
        let check = |v: &Value| {
            let errors: Vec<String> = validator.iter_errors(v).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{v}\n{errors:#?}");
        };
        let event_schema = json!({
            "$ref": "#/components/schemas/ResponseStreamEvent",
            "components": doc["components"],
        });
        let event_validator = jsonschema::validator_for(&event_schema).unwrap();
        let check_event = |v: &Value| {
            let errors: Vec<String> = event_validator
                .iter_errors(v)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "{v}\n{errors:#?}");
        };
        let req = request::parse_body(
            br#"{"model": "default", "input": "hi", "metadata": {"a": "b"},
                 "reasoning": {"effort": "low"}, "previous_response_id": "resp_run_ab_0"}"#,
        )
        .unwrap();
        let tools =
            request::parse_tools(Some(&[json!({"type": "function", "name": "get_temp"})])).unwrap();
        let seg = Segment {
            tenant: "t".into(),
            run_id: "run_ab".into(),
            start: 0,
            baseline: Usage::default(),
        };
        let base = base_response(&req, "default", &seg, &tools);
        let ev = |seq, kind| Event::new("run_ab", seq, chrono::Utc::now(), kind);
        let ends = [
            End::Completed,
            End::Failed {
                code: "model_error".into(),
                message: "refused".into(),
            },
            End::Cancelled { by: "alice".into() },
        ];
        for end in ends {
            let mut enc = Encoder::new("run_ab", 0, base.clone(), |t| t == "get_temp");
            let mut events = enc.begin();
            events.extend(enc.on_event(&ev(1, EventKind::MessageDelta { text: "Hel".into() })));
            events.extend(enc.on_event(&ev(
                2,
                EventKind::ToolCall {
                    step: 1,
                    call_id: "call_1".into(),
                    tool: "get_temp".into(),
                    arguments: json!({"city": "Oslo"}),
                },
            )));
            let (last, response) = enc.finish(&end, Usage::default());
            events.extend(last);
            check(&response);
            for e in &events {
                check_event(e);
            }
        }
    }

    #[test]
    fn outputs_must_match_the_waiting_calls() {
        let waiting = vec![
            ("c1".to_owned(), "f".to_owned(), "{}".to_owned()),
            ("c2".to_owned(), "f".to_owned(), "{}".to_owned()),
        ];
        let out = |id: &str| ClientToolOutput {
            call_id: id.into(),
            output: "x".into(),
        };
        assert!(check_outputs(&[out("c1"), out("c2")], &waiting).is_ok());
        let e = check_outputs(&[out("c1")], &waiting).unwrap_err();
        assert!(e.message.contains("c2"), "{}", e.message);
        let e = check_outputs(&[out("c1"), out("c2"), out("c9")], &waiting).unwrap_err();
        assert!(e.message.contains("c9"), "{}", e.message);
    }
}
