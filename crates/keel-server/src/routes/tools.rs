use axum::Json;
use axum::extract::State;
use keel_protocol::{Risk, ToolSource};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ErrorResponse, from_core};
use crate::extract::Query;
use crate::{ApiError, AppState};

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ToolsQuery {
    /// The agent whose tools to list; the default agent when absent.
    #[param(min_length = 1)]
    agent: Option<String>,
}

/// A tool as the caller may see it.
#[derive(Serialize, ToSchema)]
pub struct ToolInfo {
    name: String,
    description: String,
    /// The JSON Schema of the tool's arguments.
    #[schema(value_type = Object)]
    parameters: Value,
    risk: Risk,
    /// The tool's own setting: every call waits for a person's approval.
    requires_approval: bool,
    /// Whether every call waits for a person, whatever its arguments: the
    /// tool's setting, or a risk at or above the policy's `approval_risk`.
    needs_approval: bool,
    source: ToolSource,
}

#[derive(Serialize, ToSchema)]
pub struct ToolList {
    tools: Vec<ToolInfo>,
}

/// The tools an agent may call on the caller's behalf.
///
/// The caller's roles decide which.
#[utoipa::path(
    get,
    path = "/ai/tools",
    operation_id = "listTools",
    tag = "tools",
    params(ToolsQuery),
    responses(
        (status = 200, description = "The tools", body = ToolList),
        (status = 400, description = "A malformed query", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 404, description = "No such agent", body = ErrorResponse),
    )
)]
pub async fn list(
    State(s): State<AppState>,
    Caller(p): Caller,
    Query(q): Query<ToolsQuery>,
) -> Result<Json<ToolList>, ApiError> {
    let tools = s
        .runtime
        .visible_tools(&p, q.agent.as_deref())
        .map_err(|e| from_core(e, "agent"))?;
    let tools = tools
        .into_iter()
        .map(|t| ToolInfo {
            needs_approval: s.runtime.always_asks(&t),
            name: t.name,
            description: t.description,
            parameters: t.parameters,
            risk: t.risk,
            requires_approval: t.requires_approval,
            source: t.source,
        })
        .collect();
    Ok(Json(ToolList { tools }))
}
