//! The error body of SPEC §2: `{"error":{"code","message"}}` with an HTTP status.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use keel_core::CoreError;
use keel_protocol::ErrorBody;
use serde::Serialize;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
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
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorResponse {
            error: ErrorBody::new(self.code, self.message),
        };
        (self.status, Json(body)).into_response()
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
