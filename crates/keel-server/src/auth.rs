//! API keys → principals. Every handler that touches tenant data takes a
//! [`Caller`], so an unauthenticated request never reaches one.

use std::collections::HashMap;

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use keel_protocol::Principal;

use crate::{ApiError, AppState};

/// Key values (read from env at startup) and whom they stand for.
#[derive(Debug, Default)]
pub struct Auth {
    keys: HashMap<String, Principal>,
}

impl Auth {
    /// No keys: a single local tenant `default` (the server refuses to bind
    /// a non-loopback address in that case).
    pub fn open() -> Self {
        Self::default()
    }

    pub fn with_keys(keys: impl IntoIterator<Item = (String, Principal)>) -> Self {
        Self {
            keys: keys.into_iter().collect(),
        }
    }

    pub fn is_open(&self) -> bool {
        self.keys.is_empty()
    }

    /// The principal of `tenant` named `id` by some key: whom a chat user
    /// linked to that principal acts as, with its roles.
    pub fn principal_named(&self, tenant: &str, id: &str) -> Option<Principal> {
        self.keys
            .values()
            .find(|p| p.tenant == tenant && p.id == id)
            .cloned()
    }

    pub fn principal_for(&self, header: Option<&str>) -> Result<Principal, ApiError> {
        if self.is_open() {
            return Ok(Principal::local_default());
        }
        let Some(h) = header else {
            return Err(unauthorized("missing Authorization: Bearer <key> header"));
        };
        let key = h
            .strip_prefix("Bearer ")
            .or_else(|| h.strip_prefix("bearer "))
            .map(str::trim)
            .ok_or_else(|| unauthorized("Authorization header must be `Bearer <key>`"))?;
        self.keys
            .get(key)
            .cloned()
            .ok_or_else(|| unauthorized("unknown API key"))
    }
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
}

/// The authenticated principal of a request.
pub struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        state.auth.principal_for(header).map(Caller)
    }
}
