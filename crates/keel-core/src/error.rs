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
    #[error("store: {0}")]
    Store(#[from] StoreError),
}
