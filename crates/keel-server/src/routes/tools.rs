use axum::Json;
use axum::extract::{Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::error::from_core;
use crate::{ApiError, AppState};

#[derive(Deserialize)]
pub struct ToolsQuery {
    agent: Option<String>,
}

pub async fn list(
    State(s): State<AppState>,
    Caller(p): Caller,
    Query(q): Query<ToolsQuery>,
) -> Result<Json<Value>, ApiError> {
    let tools = s
        .runtime
        .visible_tools(&p, q.agent.as_deref())
        .map_err(|e| from_core(e, "agent"))?;
    let list: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "risk": t.risk,
                "requires_approval": t.requires_approval,
                // What the operator wants to know: does every call wait?
                "needs_approval": s.runtime.always_asks(t),
                "source": t.source,
            })
        })
        .collect();
    Ok(Json(json!({"tools": list})))
}
