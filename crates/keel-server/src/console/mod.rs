//! The operator console: one HTML page, a script and a style sheet, built
//! into the binary so that it works offline and cannot drift from the API it
//! calls (docs/console.md).
//!
//! The pages hold no data: every run, event and approval is fetched by the
//! browser from the same API, with the API key the operator entered, so the
//! console sees exactly what that key may see and nothing more.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::ApiError;
use crate::extract::Path;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/app.css");

/// Nothing may load from elsewhere, and no inline script runs: a tool output
/// that carries markup is shown as text, and even a rendering mistake cannot
/// run it.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// The operator console's page.
#[utoipa::path(
    get,
    path = "/",
    operation_id = "console",
    tag = "console",
    security(()),
    responses((status = 200, description = "The console", content_type = "text/html", body = String))
)]
pub async fn index() -> Response {
    asset(INDEX, "text/html; charset=utf-8")
}

/// The console's script and style sheet.
#[utoipa::path(
    get,
    path = "/console/{file}",
    operation_id = "consoleFile",
    tag = "console",
    security(()),
    params(("file" = String, Path, description = "`app.js` or `app.css`")),
    responses(
        (status = 200, description = "The file", content_type = "text/javascript", body = String),
        (status = 404, description = "No such file", body = crate::ErrorResponse),
    )
)]
pub async fn file(Path(name): Path<String>) -> Result<Response, ApiError> {
    match name.as_str() {
        "app.js" => Ok(asset(SCRIPT, "text/javascript; charset=utf-8")),
        "app.css" => Ok(asset(STYLE, "text/css; charset=utf-8")),
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such console file",
        )),
    }
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // The assets change with the binary; revalidating is cheap on loopback.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
