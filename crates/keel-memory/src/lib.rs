//! Long-term memory for keel agents (SPEC §6): documents and session
//! summaries, chunked and indexed for hybrid search — BM25 (SQLite FTS5 or
//! PostgreSQL tsvector) fused with vectors from a sentence-embedding model
//! run in-process — and the `memory_search` / `memory_get` tools over it.
//!
//! Every read and write is scoped by tenant and agent inside the SQL. With
//! no embedding model, memory still works on BM25 alone and
//! [`Memory::status`] says so.

mod chunk;
pub mod embed;
mod error;
mod hybrid;
mod index;
mod open;
mod postgres;
mod rank;
mod redacted;
mod settings;
mod sqlite;
mod tools;
mod vectors;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use chunk::{Chunk, chunk, count_tokens};
pub use embed::{EmbedError, Embedder, LocalEmbedder, OpenAiEmbedder};
pub use error::MemoryError;
pub use hybrid::MAX_K;
pub use open::{build_embedder, from_config, open, open_with, settings_of};
pub use rank::{decay, fuse, mmr};
pub use redacted::RedactedMemory;
pub use settings::Settings;
pub use tools::{MemoryGetTool, MemorySearchTool};

/// A document to remember: a session summary, a manual, a note.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryDocument {
    pub tenant: String,
    pub agent: String,
    /// What the document is, e.g. `session:<key>` or `doc:<name>`. Adding
    /// a document with the same (tenant, agent, source) replaces it,
    /// re-embedding only the chunks that changed.
    pub source: String,
    pub title: String,
    /// Markdown.
    pub text: String,
    /// When the facts were stated; drives time decay.
    pub created_at: DateTime<Utc>,
}

/// One search result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MemoryHit {
    /// A chunk id (`<doc id>#<n>`) that [`Memory::get`] accepts.
    pub id: String,
    pub source: String,
    pub snippet: String,
    /// Fused relevance in [0, 1], higher is better.
    pub score: f32,
}

/// How searches are being answered, for startup logs and `/readyz`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MemoryStatus {
    /// The embedding model in use; `None` when search is BM25 only.
    pub embedder: Option<String>,
    /// Something the operator should know, e.g. that there is no embedding
    /// model and search uses BM25 only.
    pub notice: Option<String>,
}

#[async_trait]
pub trait Memory: Send + Sync {
    /// Stores `doc` (replacing an earlier one with the same tenant, agent
    /// and source) and returns its id.
    async fn add_document(&self, doc: MemoryDocument) -> Result<String, MemoryError>;

    /// The `k` best chunks for `query` among the tenant's and agent's.
    async fn search(
        &self,
        tenant: &str,
        agent: &str,
        query: &str,
        k: usize,
    ) -> Result<Vec<MemoryHit>, MemoryError>;

    /// Lines of a document (by document id) or of the document around a
    /// chunk (by chunk id): `lines` lines (0 = all) starting at line `from`
    /// (1-based; 0 counts as 1) counted from the item's first line. `None`
    /// when the id is unknown in this tenant and agent.
    async fn get(
        &self,
        tenant: &str,
        agent: &str,
        id: &str,
        from: usize,
        lines: usize,
    ) -> Result<Option<String>, MemoryError>;

    /// Re-chunks and re-embeds every document; returns the number of chunks.
    async fn reindex(&self) -> Result<usize, MemoryError>;

    fn status(&self) -> MemoryStatus;
}
