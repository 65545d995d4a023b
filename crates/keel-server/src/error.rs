//! The error body of SPEC §2: `{"error":{"code","message"}}` with an HTTP status.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use keel_core::{CoreError, QuotaRejection};
use keel_protocol::{ErrorBody, QuotaLimit};
use serde::Serialize;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// A tenant quota refused the request (429, with `Retry-After`).
    pub quota: Option<QuotaExceeded>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            quota: None,
        }
    }

    /// 429: the tenant is at one of its quotas; `Retry-After` says when it frees.
    pub fn quota(r: QuotaRejection) -> Self {
        let message = r.to_string();
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "quota_exceeded",
            message,
            quota: Some(QuotaExceeded {
                tenant: r.tenant,
                limit: r.limit,
                value: r.limit.readable_value(r.value),
                retry_after_s: r.retry_after_s,
            }),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }
}

/// The body of every error of keel's own routes (all but `/v1/*`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorResponse {
    /// `code` is a stable machine-readable word (`invalid_request`,
    /// `unauthorized`, `not_found`, `conflict`, `forbidden`,
    /// `payload_too_large`, `store_unavailable`, `memory_unavailable`, …);
    /// `message` says what went wrong and, for a bad field, names it.
    pub error: ErrorBody,
    /// With `quota_exceeded` (429): which tenant limit refused the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaExceeded>,
}

/// The tenant limit that refused a request (docs/quotas.md).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct QuotaExceeded {
    pub tenant: String,
    /// The limit's config key under `[[tenants]]`.
    pub limit: QuotaLimit,
    /// The configured value of the limit: a count, or USD for a spend limit.
    #[schema(value_type = f64)]
    pub value: serde_json::Number,
    /// Seconds until the limit frees up, as in the `Retry-After` header.
    pub retry_after_s: u64,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry_after = self.quota.as_ref().map(|q| q.retry_after_s);
        let body = ErrorResponse {
            error: ErrorBody::new(self.code, self.message),
            quota: self.quota,
        };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// Maps core errors; `what` names the resource for a 404 (never revealing
/// whether it exists for another tenant).
pub fn from_core(e: CoreError, what: &str) -> ApiError {
    match e {
        CoreError::NotFound => ApiError::not_found(what),
        CoreError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
        CoreError::BadRequest(m) => ApiError::bad_request(m),
        CoreError::Forbidden(m) => ApiError::new(StatusCode::FORBIDDEN, "forbidden", m),
        CoreError::Config(m) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "config_error", m),
        CoreError::Quota(r) => ApiError::quota(r),
        CoreError::Store(e) => {
            tracing::error!(error = %e, "store error while serving a request");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "the store is unavailable; try again",
            )
        }
    }
}
