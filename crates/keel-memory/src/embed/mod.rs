//! Embedders: text → unit vectors. The local one is the default, so that
//! semantic search works offline and without an API key.

mod hub;
mod local;
mod openai;

use async_trait::async_trait;

pub use crate::error::EmbedError;
pub use hub::{DEFAULT_MODEL_REPO, download_model};
pub use local::{LocalEmbedder, MODEL_FILES, default_model_dirs, resolve_local};
pub use openai::OpenAiEmbedder;

/// A sentence-embedding model.
#[async_trait]
pub trait Embedder: Send + Sync {
    /// Names the model; stored beside each vector, so that vectors of
    /// another model are never compared with this one's.
    fn name(&self) -> &str;

    /// Length of every vector `embed` returns.
    fn dim(&self) -> usize;

    /// One vector per text, in order.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError>;
}
