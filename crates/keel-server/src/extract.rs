//! `Query` and `Path` whose rejections are answered in the API's own error
//! format. axum's own answer a malformed query string or path segment with a
//! `text/plain` body, which no client of a JSON API expects (and which the
//! OpenAPI document does not describe).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::ApiError;

pub struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(|e| ApiError::bad_request(format!("query: {}", e.body_text())))
    }
}

pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Path(p.0))
            .map_err(|e| {
                // A route whose handler wants other parameters than its path
                // has is a bug here, not a bad request.
                if e.status().is_server_error() {
                    ApiError::new(e.status(), "internal", e.body_text())
                } else {
                    ApiError::bad_request(format!("path: {}", e.body_text()))
                }
            })
    }
}
