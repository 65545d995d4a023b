//! Memory with secrets kept out: what is stored (documents added through
//! the API or the command line, session summaries) and what is sent to an
//! embeddings endpoint is redacted first, and what comes back is checked
//! again, for documents stored before a secret was known.

use std::sync::Arc;

use async_trait::async_trait;
use keel_protocol::Redactor;

use crate::{Memory, MemoryDocument, MemoryError, MemoryHit, MemoryStatus};

/// [`Memory`] whose every write and read passes a [`Redactor`].
pub struct RedactedMemory {
    inner: Arc<dyn Memory>,
    redactor: Redactor,
}

impl RedactedMemory {
    /// `inner` itself when there is nothing to redact.
    pub fn wrap(inner: Arc<dyn Memory>, redactor: &Redactor) -> Arc<dyn Memory> {
        if redactor.is_empty() {
            return inner;
        }
        Arc::new(Self {
            inner,
            redactor: redactor.clone(),
        })
    }

    fn clean(&self, text: &mut String) {
        self.redactor.redact_string(text);
    }
}

#[async_trait]
impl Memory for RedactedMemory {
    async fn add_document(&self, mut doc: MemoryDocument) -> Result<String, MemoryError> {
        self.clean(&mut doc.title);
        self.clean(&mut doc.text);
        self.clean(&mut doc.source);
        self.inner.add_document(doc).await
    }

    async fn search(
        &self,
        tenant: &str,
        agent: &str,
        query: &str,
        k: usize,
    ) -> Result<Vec<MemoryHit>, MemoryError> {
        let query = self.redactor.redact(query);
        let mut hits = self.inner.search(tenant, agent, &query, k).await?;
        for hit in &mut hits {
            self.clean(&mut hit.snippet);
            self.clean(&mut hit.source);
        }
        Ok(hits)
    }

    async fn get(
        &self,
        tenant: &str,
        agent: &str,
        id: &str,
        from: usize,
        lines: usize,
    ) -> Result<Option<String>, MemoryError> {
        let mut text = self.inner.get(tenant, agent, id, from, lines).await?;
        if let Some(text) = &mut text {
            self.clean(text);
        }
        Ok(text)
    }

    async fn reindex(&self) -> Result<usize, MemoryError> {
        self.inner.reindex().await
    }

    fn status(&self) -> MemoryStatus {
        self.inner.status()
    }
}
