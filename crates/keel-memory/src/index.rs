//! The storage port the hybrid search runs on; one implementation per
//! database. Every method that reads or writes chunks takes the tenant and
//! agent and puts them in the SQL itself.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::MemoryError;
use crate::chunk::Chunk;
use crate::vectors::VectorSet;

/// A document row as stored.
#[derive(Debug, Clone)]
pub(crate) struct DocRow {
    pub id: String,
    pub tenant: String,
    pub agent: String,
    pub source: String,
    pub title: String,
    pub text: String,
    pub created_at: DateTime<Utc>,
}

/// What is already stored for one chunk of a document, for reuse.
#[derive(Debug, Clone)]
pub(crate) struct StoredChunk {
    pub hash: String,
    pub model: Option<String>,
    pub embedding: Option<Vec<f32>>,
}

/// A chunk to store, with its vector when there is one.
#[derive(Debug, Clone)]
pub(crate) struct NewChunk {
    pub chunk: Chunk,
    pub model: Option<String>,
    pub embedding: Option<Vec<f32>>,
}

/// A chunk found by a search, with what the result needs.
#[derive(Debug, Clone)]
pub(crate) struct FoundChunk {
    pub rowid: i64,
    pub doc_id: String,
    pub ordinal: usize,
    pub source: String,
    pub text: String,
    pub created_at: DateTime<Utc>,
    /// The stored vector, when it was made by the model asked for.
    pub embedding: Option<Vec<f32>>,
}

/// What a [`Index::put`] changed, so that a cache of the scope's vectors
/// can follow without reloading them.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    /// The document's id.
    pub id: String,
    /// The scope's version after the write. Every write to a scope bumps
    /// its version in the same transaction, so the scope at `version` is
    /// the scope at `version - 1` with this write's changes.
    pub version: i64,
    /// Rowids of the chunks the write deleted.
    pub removed: Vec<i64>,
    /// Rowids given to the chunks written, in the order they were passed.
    pub added: Vec<i64>,
}

#[async_trait]
pub(crate) trait Index: Send + Sync {
    /// The chunks stored for the document at (tenant, agent, source).
    async fn existing(
        &self,
        tenant: &str,
        agent: &str,
        source: &str,
    ) -> Result<Vec<StoredChunk>, MemoryError>;

    /// Inserts or replaces the document at (tenant, agent, source) and all
    /// its chunks, bumping the scope's version. Keeps the id of a document
    /// already there (so ids handed out earlier stay valid).
    async fn put(&self, doc: DocRow, chunks: Vec<NewChunk>) -> Result<Written, MemoryError>;

    /// Chunk rowids matching `terms` (any of them), best BM25 first, with a
    /// score where higher is better.
    async fn text_search(
        &self,
        tenant: &str,
        agent: &str,
        terms: &[String],
        limit: usize,
    ) -> Result<Vec<(i64, f32)>, MemoryError>;

    /// In how many chunks (of all scopes) each of `terms` occurs, counting
    /// no further than `cap`.
    async fn term_counts(&self, terms: &[String], cap: usize) -> Result<Vec<usize>, MemoryError>;

    /// Chunks stored, over all scopes.
    async fn chunk_count(&self) -> Result<usize, MemoryError>;

    /// The scope's version: changes whenever its chunks do.
    async fn version(&self, tenant: &str, agent: &str) -> Result<i64, MemoryError>;

    /// Every vector of `model` in the scope, quantized, and the scope's
    /// version they are as of (read in one snapshot, so that a cache holding
    /// them can be brought forward write by write).
    async fn vectors(
        &self,
        tenant: &str,
        agent: &str,
        model: &str,
    ) -> Result<(i64, VectorSet), MemoryError>;

    /// The full-precision vectors of `model` of the chunks with these rowids
    /// that belong to the scope.
    async fn embeddings(
        &self,
        tenant: &str,
        agent: &str,
        model: &str,
        rowids: &[i64],
    ) -> Result<Vec<(i64, Vec<f32>)>, MemoryError>;

    /// The chunks with these rowids that belong to the scope, with their
    /// vectors when `model` made them.
    async fn chunks(
        &self,
        tenant: &str,
        agent: &str,
        rowids: &[i64],
        model: Option<&str>,
    ) -> Result<Vec<FoundChunk>, MemoryError>;

    /// A document's text and the first line of chunk `ordinal` in it
    /// (line 1 for the whole document), if it is in the scope.
    async fn document_text(
        &self,
        tenant: &str,
        agent: &str,
        doc_id: &str,
        ordinal: Option<usize>,
    ) -> Result<Option<(String, usize)>, MemoryError>;

    /// Every document, for a rebuild.
    async fn all_documents(&self) -> Result<Vec<DocRow>, MemoryError>;
}

/// Vectors are stored as little-endian f32 bytes.
pub(crate) fn encode_vector(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn decode_vector(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_round_trip_little_endian() {
        let v = vec![1.0_f32, -0.5, 3.25];
        let bytes = encode_vector(&v);
        assert_eq!(&bytes[..4], &1.0_f32.to_le_bytes());
        assert_eq!(decode_vector(&bytes), v);
    }
}
