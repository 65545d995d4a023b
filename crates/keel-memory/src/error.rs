//! Errors of the memory port.

/// Why a memory operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MemoryError {
    /// The request itself is wrong (empty query, empty document, bad id).
    #[error("invalid memory request: {0}")]
    Invalid(String),
    /// The database failed or could not be reached.
    #[error("memory store error: {0}")]
    Backend(String),
    /// The embedder failed; searches fall back to BM25, writes fail so
    /// that no chunk is stored without the vector its model would give.
    #[error("embedding failed: {0}")]
    Embed(#[from] EmbedError),
}

/// Why an embedder could not load or embed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EmbedError {
    /// The model files are missing or unreadable; the message says where
    /// they were looked for and how to install them.
    #[error("embedding model unavailable: {0}")]
    Unavailable(String),
    /// The model ran but failed on this input.
    #[error("embedding model failed: {0}")]
    Model(String),
    /// A remote embeddings endpoint failed.
    #[error("embeddings endpoint failed: {0}")]
    Remote(String),
}

/// Maps a database error, naming what was being done.
pub(crate) fn backend<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> MemoryError {
    move |e| MemoryError::Backend(format!("{what}: {e}"))
}
