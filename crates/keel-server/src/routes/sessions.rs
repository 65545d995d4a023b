use axum::Json;
use axum::extract::{Path, State};
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::error::from_core;
use crate::{ApiError, AppState};

pub async fn get(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(key): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let messages = s
        .runtime
        .session(&p.tenant, &key)
        .await
        .map_err(|e| from_core(e, "session"))?;
    let list: Vec<Value> = messages
        .into_iter()
        .map(|(run_id, m)| {
            let mut v = serde_json::to_value(&m).unwrap_or(Value::Null);
            if let Value::Object(o) = &mut v {
                o.insert("run_id".into(), Value::String(run_id));
            }
            v
        })
        .collect();
    Ok(Json(json!({"key": key, "messages": list})))
}

#[derive(serde::Deserialize)]
pub struct ResetQuery {
    agent: Option<String>,
}

/// Archives the session and writes its summary to long-term memory.
pub async fn reset(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(key): Path<String>,
    axum::extract::Query(q): axum::extract::Query<ResetQuery>,
) -> Result<Json<keel_core::SessionReset>, ApiError> {
    s.runtime
        .reset_session(&p, &key, q.agent.as_deref())
        .await
        .map(Json)
        .map_err(|e| from_core(e, "session"))
}
