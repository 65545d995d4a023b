//! `/ai/approvals`: pending human decisions of the caller's tenant.

use axum::Json;
use axum::extract::{Path, Query, State};
use keel_protocol::{ApprovalRecord, ApprovalStatus};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::from_core;
use crate::{ApiError, AppState};

#[derive(Deserialize)]
pub struct ListQuery {
    status: Option<String>,
    limit: Option<String>,
}

pub async fn list(
    State(s): State<AppState>,
    Caller(p): Caller,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let status = match q.status.as_deref() {
        None | Some("") | Some("all") => None,
        Some(v) => Some(ApprovalStatus::parse(v).ok_or_else(|| {
            ApiError::bad_request(format!(
                "status: `{v}` is not one of pending, approved, denied, expired, all"
            ))
        })?),
    };
    let limit = match q.limit.as_deref() {
        None | Some("") => 100,
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| {
                ApiError::bad_request(format!("limit: `{v}` is not a number from 1 to 1000"))
            })?,
    };
    let list = s
        .runtime
        .list_approvals(&p.tenant, status, limit)
        .await
        .map_err(|e| from_core(e, "approval"))?;
    Ok(Json(json!({"approvals": list})))
}

pub async fn get(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
) -> Result<Json<ApprovalRecord>, ApiError> {
    s.runtime
        .store()
        .get_approval(&p.tenant, &id)
        .await
        .map_err(|e| from_core(e.into(), "approval"))?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("approval"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    decision: String,
    #[serde(default)]
    reason: String,
}

pub async fn decide(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<DecideBody>,
) -> Result<Json<ApprovalRecord>, ApiError> {
    let approve = match body.decision.as_str() {
        "approve" => true,
        "deny" => false,
        other => {
            return Err(ApiError::bad_request(format!(
                "decision: `{other}` is not one of approve, deny"
            )));
        }
    };
    if body.reason.len() > 4096 {
        return Err(ApiError::bad_request("reason: longer than 4096 bytes"));
    }
    s.runtime
        .decide_approval(&p, &id, approve, &body.reason)
        .await
        .map(Json)
        .map_err(|e| from_core(e, "approval"))
}
