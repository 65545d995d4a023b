use keel_protocol::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("configuration: {0}")]
    Config(String),
    /// The tenant is at one of its quotas (`[[tenants]]`).
    #[error("{0}")]
    Quota(crate::quota::QuotaRejection),
    #[error("store: {0}")]
    Store(#[from] StoreError),
}
