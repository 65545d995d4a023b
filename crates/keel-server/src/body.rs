//! JSON bodies with errors that name the offending field, and a size limit
//! answered in the API's own error format.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use crate::{ApiError, AppState};

pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.max_body_bytes;
        let declared = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let too_large = || ApiError::too_large(format!("body: larger than the {limit}-byte limit"));
        if declared.is_some_and(|n| n > limit) {
            drain(req.into_body()).await;
            return Err(too_large());
        }
        let bytes: Bytes = axum::body::to_bytes(req.into_body(), limit)
            .await
            .map_err(|_| too_large())?;
        parse(&bytes).map(JsonBody)
    }
}

/// Bodies up to this size are read and discarded before a 413 is sent, so
/// that a client still writing sees the answer instead of a broken pipe.
const DRAIN_CAP: usize = 16 * 1024 * 1024;

async fn drain(body: axum::body::Body) {
    use futures::StreamExt;
    let mut stream = body.into_data_stream();
    let mut seen = 0usize;
    while let Some(Ok(chunk)) = stream.next().await {
        seen += chunk.len();
        if seen > DRAIN_CAP {
            break;
        }
    }
}

pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "body: expected a JSON object, got an empty body",
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            ApiError::bad_request(format!("body: {inner}"))
        } else {
            ApiError::bad_request(format!("{path}: {inner}"))
        }
    })
}
