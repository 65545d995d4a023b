//! `/ai/approvals`: pending human decisions of the caller's tenant.

use axum::Json;
use axum::extract::State;
use keel_protocol::{ApprovalRecord, ApprovalStatus};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::{ErrorResponse, from_core};
use crate::extract::{Path, Query};
use crate::{ApiError, AppState};

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only approvals with this status; `all` (the default) for every one.
    #[param(value_type = Option<StatusFilter>, inline)]
    status: Option<String>,
    /// At most this many, 1 to 1000 (default 100).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
}

/// The values `status` takes: an approval status, or `all`. Only described
/// here; the handler parses the text itself so that a bad value gets a
/// message listing these.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum StatusFilter {
    Pending,
    Approved,
    Denied,
    Expired,
    All,
}

#[derive(Serialize, ToSchema)]
pub struct ApprovalList {
    /// Oldest first.
    approvals: Vec<ApprovalRecord>,
}

/// The approvals of the caller's tenant.
#[utoipa::path(
    get,
    path = "/ai/approvals",
    operation_id = "listApprovals",
    tag = "approvals",
    params(ListQuery),
    responses(
        (status = 200, description = "The approvals", body = ApprovalList),
        (status = 400, description = "A malformed status or limit", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
pub async fn list(
    State(s): State<AppState>,
    Caller(p): Caller,
    Query(q): Query<ListQuery>,
) -> Result<Json<ApprovalList>, ApiError> {
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
    Ok(Json(ApprovalList { approvals: list }))
}

/// One approval of the caller's tenant.
#[utoipa::path(
    get,
    path = "/ai/approvals/{id}",
    operation_id = "getApproval",
    tag = "approvals",
    params(("id" = String, Path, description = "The approval id")),
    responses(
        (status = 200, description = "The approval", body = ApprovalRecord),
        (status = 400, description = "A malformed path", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 404, description = "No such approval in the caller's tenant", body = ErrorResponse),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
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

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    #[schema(value_type = Decision)]
    decision: String,
    /// Why, for the run's log (at most 4096 bytes).
    #[serde(default)]
    #[schema(max_length = 4096)]
    reason: String,
}

/// What the approver decides.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum Decision {
    Approve,
    Deny,
}

/// Approves or denies a pending approval.
///
/// The run waiting on it goes on. Needs an approver role; exactly one
/// decision wins.
#[utoipa::path(
    post,
    path = "/ai/approvals/{id}",
    operation_id = "decideApproval",
    tag = "approvals",
    params(("id" = String, Path, description = "The approval id")),
    request_body = DecideBody,
    responses(
        (status = 200, description = "The decided approval", body = ApprovalRecord),
        (status = 400, description = "A malformed body or decision", body = ErrorResponse),
        (status = 401, description = "No valid API key", body = ErrorResponse),
        (status = 403, description = "The caller is not an approver", body = ErrorResponse),
        (status = 404, description = "No such approval in the caller's tenant", body = ErrorResponse),
        (status = 409, description = "Already decided or expired", body = ErrorResponse),
        (status = 413, description = "The body is too large", body = ErrorResponse),
        (status = 503, description = "The store is unavailable", body = ErrorResponse),
    )
)]
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
