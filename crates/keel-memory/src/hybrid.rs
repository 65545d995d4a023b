//! The memory itself: chunking and incremental embedding on write; on
//! search, BM25 and vector candidates fused by weight, time-decayed, and
//! re-ranked with MMR.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use chrono::Utc;

use crate::chunk::chunk;
use crate::embed::Embedder;
use crate::index::{DocRow, FoundChunk, Index, NewChunk, Written};
use crate::rank::{decay, dot, fuse, mmr, scale_to_best, sort_desc, word_overlap};
use crate::vectors::VectorSet;
use crate::{Memory, MemoryDocument, MemoryError, MemoryHit, MemoryStatus, Settings};

/// Longest snippet returned per hit, in characters.
const SNIPPET_CHARS: usize = 700;

/// Most hits one search returns.
pub const MAX_K: usize = 50;

/// Largest query accepted, in bytes.
const MAX_QUERY_BYTES: usize = 4096;

/// A term found in more than this share of all chunks says almost nothing
/// about relevance (its BM25 weight is near zero) yet costs a score for
/// every chunk holding it: such terms are left out of the text query.
const COMMON_TERM_SHARE: f64 = 0.05;

/// Below this many matches a term is always kept: scoring them is cheap.
const COMMON_TERM_FLOOR: usize = 2_000;

/// How many approximate (int8) vector candidates are re-scored exactly
/// per vector candidate kept: the quantized ranking can swap near-ties, so
/// a margin of more candidates than needed are re-scored with the stored
/// full-precision vectors.
const RESCORE_FACTOR: usize = 4;

/// Vectors of one (tenant, agent), as of a scope version.
struct Cached {
    version: i64,
    vectors: Arc<VectorSet>,
}

pub(crate) struct HybridMemory {
    index: Arc<dyn Index>,
    embedder: Option<Arc<dyn Embedder>>,
    settings: Settings,
    notice: Option<String>,
    cache: Mutex<HashMap<(String, String), Cached>>,
}

impl HybridMemory {
    pub(crate) fn new(
        index: Arc<dyn Index>,
        embedder: Option<Arc<dyn Embedder>>,
        settings: Settings,
        notice: Option<String>,
    ) -> Self {
        Self {
            index,
            embedder,
            settings,
            notice,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Chunks `doc` and stores it, embedding only chunks whose text (or
    /// whose embedder) changed since it was last stored; `force` re-embeds all.
    async fn store(&self, doc: DocRow, force: bool) -> Result<(String, usize), MemoryError> {
        let chunks = chunk(
            &doc.text,
            self.settings.chunk_tokens,
            self.settings.chunk_overlap,
        );
        let model = self.embedder.as_ref().map(|e| e.name().to_owned());
        let mut reusable: HashMap<String, Vec<f32>> = HashMap::new();
        if !force && model.is_some() {
            for old in self
                .index
                .existing(&doc.tenant, &doc.agent, &doc.source)
                .await?
            {
                if let (Some(m), Some(v)) = (old.model, old.embedding)
                    && Some(&m) == model.as_ref()
                {
                    reusable.insert(old.hash, v);
                }
            }
        }
        let mut embeddings: Vec<Option<Vec<f32>>> = chunks
            .iter()
            .map(|c| reusable.get(&c.hash).cloned())
            .collect();
        if let Some(embedder) = &self.embedder {
            let missing: Vec<usize> = (0..chunks.len())
                .filter(|i| embeddings[*i].is_none())
                .collect();
            if !missing.is_empty() {
                let texts: Vec<String> = missing.iter().map(|i| chunks[*i].text.clone()).collect();
                match embedder.embed(&texts).await {
                    Ok(vectors) if vectors.len() == texts.len() => {
                        for (i, v) in missing.iter().zip(vectors) {
                            embeddings[*i] = Some(v);
                        }
                    }
                    // The text is still worth keeping and BM25 still finds it;
                    // the next write or a reindex fills the vectors in.
                    Ok(vectors) => tracing::warn!(
                        expected = texts.len(),
                        got = vectors.len(),
                        "embedder returned the wrong number of vectors; stored without them"
                    ),
                    Err(e) => tracing::warn!(error = %e, source = %doc.source,
                        "embedding failed; chunks stored for text search only"),
                }
            }
            tracing::debug!(
                source = %doc.source,
                chunks = chunks.len(),
                embedded = missing.len(),
                "memory document indexed"
            );
        }
        let count = chunks.len();
        // Kept for the vector cache, which follows the write (see `follow`).
        let vectors = if self.embedder.is_some() {
            embeddings.clone()
        } else {
            Vec::new()
        };
        let rows: Vec<NewChunk> = chunks
            .into_iter()
            .zip(embeddings)
            .map(|(chunk, embedding)| NewChunk {
                chunk,
                model: embedding.as_ref().and(model.clone()),
                embedding,
            })
            .collect();
        let (tenant, agent) = (doc.tenant.clone(), doc.agent.clone());
        let written = self.index.put(doc, rows).await?;
        if self.embedder.is_some() {
            self.follow(&tenant, &agent, &written, vectors).await;
        }
        Ok((written.id, count))
    }

    /// Brings the scope's cached vectors forward by one write, so that the
    /// next search neither misses the new chunks nor reloads every vector
    /// (seconds at 100k chunks). Only a cache exactly one version behind is
    /// updated: any other writer in between (another process, another
    /// node) also bumped the version, and the next search reloads.
    async fn follow(
        &self,
        tenant: &str,
        agent: &str,
        written: &Written,
        vectors: Vec<Option<Vec<f32>>>,
    ) {
        let key = (tenant.to_owned(), agent.to_owned());
        let behind = {
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            match cache.get(&key) {
                Some(c) if c.version == written.version - 1 => cache.remove(&key),
                _ => None,
            }
        };
        let Some(behind) = behind else { return };
        let removed = written.removed.clone();
        let added: Vec<(i64, Vec<f32>)> = written
            .added
            .iter()
            .zip(vectors)
            .filter_map(|(id, v)| Some((*id, v?)))
            .collect();
        let updated = tokio::task::spawn_blocking(move || {
            // A search still scanning the old set keeps it; then this copies.
            let mut set = Arc::try_unwrap(behind.vectors).unwrap_or_else(|s| (*s).clone());
            set.apply(&removed, &added);
            set
        })
        .await;
        match updated {
            Ok(set) => {
                let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
                // A search may have loaded the scope meanwhile: keep the newest.
                if cache.get(&key).is_none_or(|c| c.version < written.version) {
                    cache.insert(
                        key,
                        Cached {
                            version: written.version,
                            vectors: Arc::new(set),
                        },
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "updating the vector cache failed; it reloads"),
        }
    }

    /// The scope's vectors, reloaded when another writer (another process,
    /// another node) has changed the scope since they were loaded.
    async fn vectors(
        &self,
        tenant: &str,
        agent: &str,
        model: &str,
    ) -> Result<Arc<VectorSet>, MemoryError> {
        let version = self.index.version(tenant, agent).await?;
        let key = (tenant.to_owned(), agent.to_owned());
        if let Some(c) = self
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .filter(|c| c.version == version)
        {
            return Ok(Arc::clone(&c.vectors));
        }
        let (version, set) = self.index.vectors(tenant, agent, model).await?;
        tracing::debug!(
            tenant,
            agent,
            vectors = set.len(),
            bytes = set.len() * set.bytes_per_vector(),
            "memory vectors loaded"
        );
        let vectors = Arc::new(set);
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.get(&key).is_none_or(|c| c.version < version) {
            cache.insert(
                key,
                Cached {
                    version,
                    vectors: Arc::clone(&vectors),
                },
            );
        }
        Ok(vectors)
    }

    /// `terms` without those too common to rank by (see
    /// [`COMMON_TERM_SHARE`]). With no embedder to fall back on, the least
    /// common term is kept even so, so that a query never finds nothing
    /// just because its words are everywhere.
    async fn selective_terms(&self, terms: Vec<String>) -> Result<Vec<String>, MemoryError> {
        if terms.is_empty() {
            return Ok(terms);
        }
        let total = self.index.chunk_count().await?;
        let cap = ((total as f64 * COMMON_TERM_SHARE) as usize).max(COMMON_TERM_FLOOR);
        if total <= cap {
            return Ok(terms);
        }
        let counts = self.index.term_counts(&terms, cap + 1).await?;
        let rarest = terms
            .iter()
            .zip(&counts)
            .min_by_key(|(_, n)| **n)
            .map(|(t, _)| t.clone());
        let kept: Vec<String> = terms
            .into_iter()
            .zip(counts)
            .filter(|(_, n)| *n <= cap)
            .map(|(t, _)| t)
            .collect();
        if kept.is_empty() && self.embedder.is_none() {
            return Ok(rarest.into_iter().collect());
        }
        Ok(kept)
    }

    /// Vector candidates: `(rowid, cosine)`, best first. The int8 scan
    /// picks `RESCORE_FACTOR × limit` candidates; their stored f32 vectors
    /// give the exact scores the best `limit` are kept by.
    async fn vector_candidates(
        &self,
        embedder: &Arc<dyn Embedder>,
        tenant: &str,
        agent: &str,
        query: &str,
        limit: usize,
    ) -> Result<Vec<(i64, f32)>, MemoryError> {
        let q = embedder
            .embed(&[query.to_owned()])
            .await?
            .into_iter()
            .next()
            .unwrap_or_default();
        let set = self.vectors(tenant, agent, embedder.name()).await?;
        // Milliseconds of CPU: kept off the async workers.
        let (q, approx) = tokio::task::spawn_blocking(move || {
            let approx = set.top(&q, limit * RESCORE_FACTOR);
            (q, approx)
        })
        .await
        .map_err(|e| MemoryError::Backend(format!("vector scan failed: {e}")))?;
        if approx.is_empty() {
            return Ok(approx);
        }
        let ids: Vec<i64> = approx.iter().map(|a| a.0).collect();
        let mut exact: Vec<(i64, f32)> = self
            .index
            .embeddings(tenant, agent, embedder.name(), &ids)
            .await?
            .into_iter()
            .filter(|(_, v)| v.len() == q.len())
            .map(|(id, v)| (id, dot(&v, &q)))
            .collect();
        sort_desc(&mut exact);
        exact.truncate(limit);
        Ok(exact)
    }
}

/// Search terms: lowercase words of the query without common English
/// function words, which would otherwise match nearly every chunk.
pub(crate) fn query_terms(query: &str) -> Vec<String> {
    const STOP: &[&str] = &[
        "a", "an", "and", "are", "as", "at", "be", "by", "did", "do", "does", "for", "from", "had",
        "has", "have", "how", "i", "in", "is", "it", "its", "of", "on", "or", "that", "the",
        "this", "to", "was", "we", "were", "what", "when", "where", "which", "who", "why", "with",
        "you", "our", "my", "me", "about",
    ];
    let mut terms: Vec<String> = Vec::new();
    for word in query.split(|c: char| !c.is_alphanumeric()) {
        let w = word.to_lowercase();
        if !w.is_empty() && !STOP.contains(&w.as_str()) && !terms.contains(&w) {
            terms.push(w);
        }
    }
    terms
}

fn snippet(text: &str) -> String {
    if text.chars().count() <= SNIPPET_CHARS {
        return text.to_owned();
    }
    let mut s: String = text.chars().take(SNIPPET_CHARS).collect();
    s.push('…');
    s
}

/// A chunk's public id: `<doc id>#<ordinal>`, stable while its document is
/// re-added with the same chunking.
fn chunk_id(c: &FoundChunk) -> String {
    format!("{}#{}", c.doc_id, c.ordinal)
}

#[async_trait]
impl Memory for HybridMemory {
    async fn add_document(&self, doc: MemoryDocument) -> Result<String, MemoryError> {
        if doc.tenant.is_empty() || doc.agent.is_empty() {
            return Err(MemoryError::Invalid(
                "tenant and agent must not be empty".into(),
            ));
        }
        if doc.text.trim().is_empty() {
            return Err(MemoryError::Invalid("text: must not be empty".into()));
        }
        let source = if doc.source.is_empty() {
            format!("doc:{}", doc.title)
        } else {
            doc.source
        };
        let row = DocRow {
            id: keel_protocol::new_id("mem"),
            tenant: doc.tenant,
            agent: doc.agent,
            source,
            title: doc.title,
            text: doc.text,
            created_at: doc.created_at,
        };
        Ok(self.store(row, false).await?.0)
    }

    async fn search(
        &self,
        tenant: &str,
        agent: &str,
        query: &str,
        k: usize,
    ) -> Result<Vec<MemoryHit>, MemoryError> {
        let query = query.trim();
        if query.is_empty() {
            return Err(MemoryError::Invalid("query: must not be empty".into()));
        }
        if query.len() > MAX_QUERY_BYTES {
            return Err(MemoryError::Invalid(format!(
                "query: longer than {MAX_QUERY_BYTES} bytes"
            )));
        }
        let k = k.clamp(1, MAX_K);
        let pool = (k * 5).max(50);
        let s = &self.settings;
        // Text and vector candidates are independent: look for both at once.
        let text_side = async {
            let terms = self.selective_terms(query_terms(query)).await?;
            self.index.text_search(tenant, agent, &terms, pool).await
        };
        let vector_side = async {
            match &self.embedder {
                Some(embedder) => Some(
                    self.vector_candidates(embedder, tenant, agent, query, pool)
                        .await,
                ),
                None => None,
            }
        };
        let (text, vector) = tokio::join!(text_side, vector_side);
        let mut text = text?;
        scale_to_best(&mut text);
        // The model whose vectors ranked this search, if any did.
        let mut model = None;
        let mut vector_hits = Vec::new();
        match (vector, &self.embedder) {
            (Some(Ok(hits)), Some(embedder)) => {
                vector_hits = hits;
                model = Some(embedder.name());
            }
            (Some(Err(e)), _) => {
                tracing::warn!(error = %e, "vector search failed; using BM25 only")
            }
            _ => {}
        }
        let fused = if model.is_some() {
            fuse(&[(&text, s.text_weight), (&vector_hits, s.vector_weight)])
        } else {
            fuse(&[(&text, 1.0)])
        };
        if fused.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = fused.iter().map(|f| f.0).collect();
        let found: HashMap<i64, FoundChunk> = self
            .index
            .chunks(tenant, agent, &ids, model)
            .await?
            .into_iter()
            .map(|c| (c.rowid, c))
            .collect();
        let now = Utc::now();
        let mut scored: Vec<(i64, f32)> = fused
            .into_iter()
            .filter_map(|(id, score)| {
                let c = found.get(&id)?;
                let age = (now - c.created_at).num_seconds() as f64 / 86_400.0;
                Some((id, score * decay(age, s.time_decay_half_life_days)))
            })
            .collect();
        sort_desc(&mut scored);
        // Cosine of the stored vectors when both chunks have one (they come
        // only when the vector search succeeded), else shared words.
        let similarity = |a: i64, b: i64| -> f32 {
            match (found.get(&a), found.get(&b)) {
                (Some(x), Some(y)) => match (&x.embedding, &y.embedding) {
                    (Some(u), Some(v)) if u.len() == v.len() => dot(u, v).max(0.0),
                    _ => word_overlap(&x.text, &y.text),
                },
                _ => 0.0,
            }
        };
        let picked = mmr(&scored, k, s.mmr_lambda, similarity);
        Ok(picked
            .into_iter()
            .filter_map(|(id, score)| {
                let c = found.get(&id)?;
                Some(MemoryHit {
                    id: chunk_id(c),
                    source: c.source.clone(),
                    snippet: snippet(&c.text),
                    score,
                })
            })
            .collect())
    }

    async fn get(
        &self,
        tenant: &str,
        agent: &str,
        id: &str,
        from: usize,
        lines: usize,
    ) -> Result<Option<String>, MemoryError> {
        let (doc_id, ordinal) = match id.split_once('#') {
            Some((doc, n)) => match n.parse::<usize>() {
                Ok(n) => (doc, Some(n)),
                Err(_) => return Ok(None),
            },
            None => (id, None),
        };
        let Some((text, first)) = self
            .index
            .document_text(tenant, agent, doc_id, ordinal)
            .await?
        else {
            return Ok(None);
        };
        // `from` counts from the item's own first line: 1 (or 0) is where
        // the chunk starts, or the document's first line for a document id.
        let skip = first - 1 + from.max(1) - 1;
        let take = if lines == 0 { usize::MAX } else { lines };
        let selected: Vec<&str> = text.lines().skip(skip).take(take).collect();
        Ok(Some(selected.join("\n")))
    }

    async fn reindex(&self) -> Result<usize, MemoryError> {
        // Nothing cached to follow write by write: searches reload once.
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        let mut total = 0;
        for doc in self.index.all_documents().await? {
            total += self.store(doc, true).await?.1;
        }
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        Ok(total)
    }

    fn status(&self) -> MemoryStatus {
        MemoryStatus {
            embedder: self.embedder.as_ref().map(|e| e.name().to_owned()),
            notice: self.notice.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_terms_drop_function_words() {
        assert_eq!(
            query_terms("What is the temperature of Furnace F2? the F2!"),
            ["temperature", "furnace", "f2"]
        );
        assert!(query_terms("what is the").is_empty());
    }

    /// Letter counts: enough to tell texts apart.
    struct Letters;

    #[async_trait]
    impl Embedder for Letters {
        fn name(&self) -> &str {
            "test/letters"
        }

        fn dim(&self) -> usize {
            26
        }

        async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, crate::embed::EmbedError> {
            Ok(texts
                .iter()
                .map(|t| {
                    let mut v = vec![0.0_f32; 26];
                    for b in t
                        .to_ascii_lowercase()
                        .bytes()
                        .filter(u8::is_ascii_lowercase)
                    {
                        v[usize::from(b - b'a')] += 1.0;
                    }
                    crate::rank::normalize(v)
                })
                .collect())
        }
    }

    fn note(tenant: &str, source: &str, text: &str) -> MemoryDocument {
        MemoryDocument {
            tenant: tenant.into(),
            agent: "ops".into(),
            source: source.into(),
            title: source.into(),
            text: text.into(),
            created_at: Utc::now(),
        }
    }

    /// Writes through this memory update its cached vectors in place: the
    /// cache stays at the scope's current version (no reload on the next
    /// search) and holds exactly the scope's chunks.
    #[tokio::test]
    async fn cache_follows_writes_without_reloading() {
        let dir = tempfile::tempdir().unwrap();
        let index: Arc<dyn Index> =
            Arc::new(crate::sqlite::SqliteIndex::open(&dir.path().join("memory.db")).unwrap());
        let settings = Settings {
            chunk_tokens: 4,
            chunk_overlap: 0,
            ..Settings::default()
        };
        let memory = HybridMemory::new(Arc::clone(&index), Some(Arc::new(Letters)), settings, None);
        let cached = || {
            let cache = memory.cache.lock().unwrap();
            cache
                .get(&("acme".to_owned(), "ops".to_owned()))
                .map(|c| (c.version, c.vectors.len()))
        };
        memory
            .add_document(note("acme", "doc:a", "alpha beta gamma delta"))
            .await
            .unwrap();
        assert_eq!(cached(), None);
        memory.search("acme", "ops", "alpha", 5).await.unwrap();
        assert_eq!(cached(), Some((1, 1)));
        // Added: two chunks more, same set.
        memory
            .add_document(note("acme", "doc:b", "one two three four five six"))
            .await
            .unwrap();
        assert_eq!(cached(), Some((2, 3)));
        // Replaced: doc:a's one chunk becomes three.
        memory
            .add_document(note("acme", "doc:a", "a b c d e f g h i j"))
            .await
            .unwrap();
        assert_eq!(cached(), Some((3, 5)));
        assert_eq!(index.version("acme", "ops").await.unwrap(), 3);
        // Another scope's writes leave this one alone.
        memory
            .add_document(note("globex", "doc:a", "alpha beta gamma delta"))
            .await
            .unwrap();
        assert_eq!(cached(), Some((3, 5)));
        // What the cache holds is what a reload gives.
        let (version, fresh) = index.vectors("acme", "ops", "test/letters").await.unwrap();
        assert_eq!(version, 3);
        let q = Letters.embed(&["alpha".into()]).await.unwrap().remove(0);
        let held = memory.cache.lock().unwrap()[&("acme".to_owned(), "ops".to_owned())]
            .vectors
            .top(&q, 10);
        assert_eq!(held, fresh.top(&q, 10));
        // A write this memory did not make (another process): reloaded.
        let other = HybridMemory::new(
            Arc::clone(&index),
            Some(Arc::new(Letters)),
            Settings::default(),
            None,
        );
        other
            .add_document(note("acme", "doc:c", "zeta"))
            .await
            .unwrap();
        memory
            .add_document(note("acme", "doc:d", "theta"))
            .await
            .unwrap();
        assert_eq!(
            cached(),
            Some((3, 5)),
            "a cache two versions behind is left to reload"
        );
        let hits = memory.search("acme", "ops", "zeta", 10).await.unwrap();
        assert!(hits.iter().any(|h| h.snippet == "zeta"), "{hits:?}");
        assert_eq!(cached(), Some((5, 7)));
    }

    #[test]
    fn snippets_are_capped() {
        let long = "x".repeat(SNIPPET_CHARS + 10);
        assert_eq!(snippet(&long).chars().count(), SNIPPET_CHARS + 1);
        assert_eq!(snippet("short"), "short");
    }
}
