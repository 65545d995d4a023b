//! `/ai/memory`: the same hybrid search the `memory_search` tool runs, and
//! adding documents (manuals, notes) for agents to search. Always scoped by
//! the caller's tenant and one of its agents.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use keel_memory::{MAX_K, Memory, MemoryDocument, MemoryError};
use serde::Deserialize;
use serde_json::json;

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::{ApiError, AppState};

/// Hits returned when `k` is absent.
const DEFAULT_K: usize = 5;

/// Longest title accepted; the text is bounded by the body size limit.
const MAX_TITLE_CHARS: usize = 500;

#[derive(Deserialize)]
pub struct SearchQuery {
    #[serde(default)]
    q: Option<String>,
    #[serde(default)]
    k: Option<String>,
    #[serde(default)]
    agent: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewDocument {
    title: String,
    text: String,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    source: Option<String>,
}

fn memory(s: &AppState) -> Result<Arc<dyn Memory>, ApiError> {
    s.memory.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "memory_unavailable",
            "long-term memory is not enabled on this server",
        )
    })
}

/// The agent named, or the default one; an unknown agent is a 400 naming
/// the known ones.
fn agent(s: &AppState, requested: Option<String>) -> Result<String, ApiError> {
    let agent = requested.unwrap_or_else(|| s.runtime.default_agent().to_owned());
    let known = s.runtime.agent_ids();
    if !known.contains(&agent) {
        return Err(ApiError::bad_request(format!(
            "agent: no agent named `{agent}` (known: {})",
            known.join(", ")
        )));
    }
    Ok(agent)
}

fn from_memory(e: MemoryError) -> ApiError {
    match e {
        MemoryError::Invalid(m) => ApiError::bad_request(m),
        other => {
            tracing::error!(error = %other, "memory error while serving a request");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "memory_unavailable",
                "memory is unavailable; try again",
            )
        }
    }
}

pub async fn search(
    State(s): State<AppState>,
    Caller(p): Caller,
    Query(q): Query<SearchQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let memory = memory(&s)?;
    let query = q.q.unwrap_or_default();
    if query.trim().is_empty() {
        return Err(ApiError::bad_request(
            "q: a non-empty search query is required",
        ));
    }
    let k = match q.k.as_deref() {
        None | Some("") => DEFAULT_K,
        Some(k) => match k.parse::<usize>() {
            Ok(k) if (1..=MAX_K).contains(&k) => k,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "k: must be a whole number from 1 to {MAX_K}"
                )));
            }
        },
    };
    let agent = agent(&s, q.agent)?;
    let hits = memory
        .search(&p.tenant, &agent, &query, k)
        .await
        .map_err(from_memory)?;
    Ok(Json(json!({"query": query, "agent": agent, "hits": hits})))
}

pub async fn add_document(
    State(s): State<AppState>,
    Caller(p): Caller,
    JsonBody(body): JsonBody<NewDocument>,
) -> Result<impl IntoResponse, ApiError> {
    let memory = memory(&s)?;
    if body.title.trim().is_empty() || body.title.chars().count() > MAX_TITLE_CHARS {
        return Err(ApiError::bad_request(format!(
            "title: must be 1 to {MAX_TITLE_CHARS} characters"
        )));
    }
    if body.text.trim().is_empty() {
        return Err(ApiError::bad_request("text: must not be empty"));
    }
    if body
        .source
        .as_deref()
        .is_some_and(|src| src.trim().is_empty() || src.len() > 200)
    {
        return Err(ApiError::bad_request("source: must be 1 to 200 characters"));
    }
    let agent = agent(&s, body.agent)?;
    let source = body
        .source
        .unwrap_or_else(|| format!("doc:{}", body.title.trim()));
    let id = memory
        .add_document(MemoryDocument {
            tenant: p.tenant,
            agent: agent.clone(),
            source: source.clone(),
            title: body.title,
            text: body.text,
            created_at: chrono::Utc::now(),
        })
        .await
        .map_err(from_memory)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "agent": agent, "source": source})),
    ))
}
