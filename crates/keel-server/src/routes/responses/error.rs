//! Errors of the `/v1` routes in OpenAI's shape, so the official SDKs raise
//! their usual exception types (`BadRequestError`, `NotFoundError`, …) with
//! the message and `param` intact. keel's own `/ai` routes keep keel's shape.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use keel_core::CoreError;
use serde::Serialize;

use crate::ApiError;

#[derive(Debug)]
pub struct OaiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<String>,
    /// Seconds for `Retry-After` (a tenant quota refused the request).
    pub retry_after: Option<u64>,
}

impl OaiError {
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        let param = param.into();
        let message = message.into();
        let message = if param.is_empty() || message.starts_with(&param) {
            message
        } else {
            format!("{param}: {message}")
        };
        Self {
            status: StatusCode::BAD_REQUEST,
            message,
            kind: "invalid_request_error",
            param: (!param.is_empty()).then_some(param),
            code: None,
            retry_after: None,
        }
    }

    pub fn with_code(mut self, code: &str) -> Self {
        self.code = Some(code.to_owned());
        self
    }

    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// Another tenant's response is reported exactly like one that never existed.
    pub fn response_not_found(param: &str, id: &str) -> Self {
        Self::invalid(param, format!("response with id `{id}` not found"))
            .with_status(StatusCode::NOT_FOUND)
            .with_code("not_found")
    }

    pub fn conflict(param: &str, message: impl Into<String>) -> Self {
        Self::invalid(param, message)
            .with_status(StatusCode::CONFLICT)
            .with_code("conflict")
    }

    pub fn server(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("server_error".into()),
            retry_after: None,
        }
    }

    /// keel's own errors (auth, body size) re-shaped; the status is kept.
    pub fn from_api(e: ApiError) -> Self {
        let kind = match e.status {
            StatusCode::UNAUTHORIZED => "invalid_request_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        let code = match e.code {
            "unauthorized" => "invalid_api_key",
            other => other,
        };
        Self {
            status: e.status,
            message: e.message,
            kind,
            param: None,
            code: Some(code.to_owned()),
            retry_after: e.quota.map(|q| q.retry_after_s),
        }
    }

    /// Core errors; `param` names the request field the failure is about.
    pub fn from_core(e: CoreError, param: &str) -> Self {
        match e {
            CoreError::BadRequest(m) => Self::invalid(param, m),
            CoreError::Conflict(m) => Self::conflict(param, m),
            CoreError::NotFound => Self::invalid(param, "not found")
                .with_status(StatusCode::NOT_FOUND)
                .with_code("not_found"),
            CoreError::Forbidden(m) => Self::invalid(param, m)
                .with_status(StatusCode::FORBIDDEN)
                .with_code("forbidden"),
            CoreError::Config(m) => Self::server(m),
            // OpenAI's SDKs raise their RateLimitError for a 429.
            CoreError::Quota(r) => Self {
                status: StatusCode::TOO_MANY_REQUESTS,
                message: r.to_string(),
                kind: "rate_limit_error",
                param: None,
                code: Some("quota_exceeded".into()),
                retry_after: Some(r.retry_after_s),
            },
            CoreError::Store(e) => {
                tracing::error!(error = %e, "store error while serving /v1/responses");
                Self::server("the store is unavailable; try again")
                    .with_status(StatusCode::SERVICE_UNAVAILABLE)
            }
        }
    }
}

/// The body of every error of the `/v1` routes, in OpenAI's shape.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OaiErrorResponse {
    pub error: OaiErrorDetail,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OaiErrorDetail {
    pub message: String,
    /// `invalid_request_error`, `rate_limit_error` (429) or `server_error`.
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    pub kind: &'static str,
    /// The request field the error is about (`model`, `input[2].call_id`, …).
    pub param: Option<String>,
    /// `model_not_found`, `not_found`, `conflict`, `invalid_api_key`, …
    pub code: Option<String>,
}

impl IntoResponse for OaiError {
    fn into_response(self) -> Response {
        let body = OaiErrorResponse {
            error: OaiErrorDetail {
                message: self.message,
                kind: self.kind,
                param: self.param,
                code: self.code,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        response
    }
}
