//! `/ai/memory`: the same hybrid search the `memory_search` tool runs, and
//! adding documents (manuals, notes) for agents to search. Always scoped by
//! the caller's tenant and one of its agents.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use keel_memory::{MAX_K, Memory, MemoryDocument, MemoryError, MemoryHit};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::ErrorResponse;
use crate::extract::Query;
use crate::{ApiError, AppState};

/// Hits returned when `k` is absent.
const DEFAULT_K: usize = 5;

/// Longest title accepted; the text is bounded by the body size limit.
const MAX_TITLE_CHARS: usize = 500;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SearchQuery {
    /// What to search for (required, not blank).
    #[serde(default)]
    #[param(required = true, pattern = r"\S")]
    q: Option<String>,
    /// How many hits, 1 to 50 (`keel_memory::MAX_K`; default 5).
    #[serde(default)]
    #[param(value_type = Option<u32>, minimum = 1, maximum = 50)]
    k: Option<String>,
    /// Whose memory to search; the default agent when absent.
    #[serde(default)]
    #[param(min_length = 1)]
    agent: Option<String>,
}

/// A document for agents to search.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewDocument {
    /// 1 to 500 characters, not blank.
    #[schema(max_length = 500, pattern = r"\S")]
    title: String,
    /// Markdown; not blank.
    #[schema(pattern = r"\S")]
    text: String,
    /// The agent whose memory it joins; the default agent when absent.
    #[serde(default)]
    #[schema(min_length = 1)]
    agent: Option<String>,
    /// Where it comes from (1 to 200 characters), `doc:<title>` when
    /// absent. A document with the same source replaces the earlier one.
    #[serde(default)]
    #[schema(max_length = 200, pattern = r"\S")]
    source: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct SearchResult {
    query: String,
    agent: String,
    /// Best first.
    hits: Vec<MemoryHit>,
}

#[derive(Serialize, ToSchema)]
pub struct DocumentAdded {
    /// The document id (`mem_…`).
    id: String,
    agent: String,
    source: String,
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

/// Searches an agent's long-term memory.
///
/// The same hybrid (keyword and vector) search the `memory_search` tool
/// runs, over the caller's tenant's memory of one agent.
#[utoipa::path(
    get,
    path = "/ai/memory/search",
    operation_id = "searchMemory",
    tag = "memory",
    params(SearchQuery),
    responses(
        (status = 200, description = "The best hits", body = SearchResult),
        (status = 400, description = "A blank query, a bad `k` or an unknown agent", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 503, description = "Memory is disabled or unavailable", body = ErrorResponse),
    )
)]
pub async fn search(
    State(s): State<AppState>,
    Caller(p): Caller,
    Query(q): Query<SearchQuery>,
) -> Result<Json<SearchResult>, ApiError> {
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
    Ok(Json(SearchResult { query, agent, hits }))
}

/// Adds a document (a manual, a note) to an agent's memory.
#[utoipa::path(
    post,
    path = "/ai/memory/documents",
    operation_id = "addMemoryDocument",
    tag = "memory",
    request_body = NewDocument,
    responses(
        (status = 201, description = "Stored and indexed", body = DocumentAdded),
        (status = 400, description = "A malformed body or field, or an unknown agent", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 413, description = "The body is too large", body = ErrorResponse),
        (status = 503, description = "Memory is disabled or unavailable", body = ErrorResponse),
    )
)]
pub async fn add_document(
    State(s): State<AppState>,
    Caller(p): Caller,
    JsonBody(body): JsonBody<NewDocument>,
) -> Result<(StatusCode, Json<DocumentAdded>), ApiError> {
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
        Json(DocumentAdded { id, agent, source }),
    ))
}
