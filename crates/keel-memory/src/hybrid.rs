//! The memory itself: chunking and incremental embedding on write; on
//! search, BM25 and vector candidates fused by weight, time-decayed, and
//! re-ranked with MMR.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use chrono::Utc;

use crate::chunk::chunk;
use crate::embed::Embedder;
use crate::index::{DocRow, FoundChunk, Index, NewChunk, VectorSet};
use crate::rank::{decay, fuse, mmr, scale_to_best, sort_desc, word_overlap};
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

/// Vectors of one (tenant, agent), as of a scope version.
struct Cached {
    version: i64,
    vectors: Arc<Packed>,
}

/// A scope's vectors held for brute-force search, as bfloat16: half the
/// memory of f32, and since a scan over 100k vectors is bound by memory
/// bandwidth, nearly half the time. bf16 keeps 3 significant digits, far
/// more than ranking by cosine needs.
pub(crate) struct Packed {
    rowids: Vec<i64>,
    data: Vec<u16>,
    dim: usize,
}

/// Rows scanned per thread, at least: below this, threads cost more than
/// they save.
const ROWS_PER_THREAD: usize = 20_000;

impl Packed {
    pub(crate) fn new(set: VectorSet) -> Self {
        Self {
            data: set.data.iter().map(|x| to_bf16(*x)).collect(),
            rowids: set.rowids,
            dim: set.dim,
        }
    }

    fn row(&self, i: usize) -> &[u16] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// The `limit` rows most similar to the unit vector `q`, best first,
    /// scanned on several threads when there are many.
    pub(crate) fn top(&self, q: &[f32], limit: usize) -> Vec<(i64, f32)> {
        if self.dim == 0 || q.len() != self.dim || limit == 0 {
            return Vec::new();
        }
        let rows = self.rowids.len();
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(rows / ROWS_PER_THREAD)
            .max(1);
        let per = rows.div_ceil(threads);
        let scan = |start: usize| -> Vec<(i64, f32)> {
            let end = (start + per).min(rows);
            let scored = (start..end).map(|i| (self.rowids[i], dot_bf16(self.row(i), q)));
            best(scored.collect(), limit)
        };
        let mut all: Vec<(i64, f32)> = if threads == 1 {
            scan(0)
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|t| s.spawn(move || scan(t * per)))
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap_or_default())
                    .collect()
            })
        };
        all = best(all, limit);
        sort_desc(&mut all);
        all
    }

    /// Cosine of two stored rows, by rowid position.
    fn similarity(&self, i: usize, j: usize) -> f32 {
        let b: Vec<f32> = self.row(j).iter().map(|x| from_bf16(*x)).collect();
        dot_bf16(self.row(i), &b)
    }
}

/// The `limit` best of `scored`, in no particular order.
fn best(mut scored: Vec<(i64, f32)>, limit: usize) -> Vec<(i64, f32)> {
    if scored.len() > limit {
        scored.select_nth_unstable_by(limit - 1, |a, b| b.1.total_cmp(&a.1));
        scored.truncate(limit);
    }
    scored
}

/// f32 → bfloat16, rounding to nearest even.
fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1));
    (rounded >> 16) as u16
}

fn from_bf16(x: u16) -> f32 {
    f32::from_bits(u32::from(x) << 16)
}

fn dot_bf16(a: &[u16], b: &[f32]) -> f32 {
    // Eight independent accumulators let the compiler vectorize the loop.
    let mut acc = [0.0_f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| from_bf16(*x) * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += from_bf16(x[i]) * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
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
        let rows = chunks
            .into_iter()
            .zip(embeddings)
            .map(|(chunk, embedding)| NewChunk {
                chunk,
                model: embedding.as_ref().and(model.clone()),
                embedding,
            })
            .collect();
        let (tenant, agent) = (doc.tenant.clone(), doc.agent.clone());
        let id = self.index.put(doc, rows).await?;
        self.forget(&tenant, &agent);
        Ok((id, count))
    }

    fn forget(&self, tenant: &str, agent: &str) {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(tenant.to_owned(), agent.to_owned()));
    }

    /// The scope's vectors, reloaded when another writer (another process,
    /// another node) has changed the scope since they were loaded.
    async fn vectors(
        &self,
        tenant: &str,
        agent: &str,
        model: &str,
    ) -> Result<Arc<Packed>, MemoryError> {
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
        let set = self.index.vectors(tenant, agent, model).await?;
        let vectors = Arc::new(
            tokio::task::spawn_blocking(move || Packed::new(set))
                .await
                .map_err(|e| MemoryError::Backend(format!("packing vectors: {e}")))?,
        );
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                key,
                Cached {
                    version,
                    vectors: Arc::clone(&vectors),
                },
            );
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

    /// Vector candidates: `(rowid, cosine)`, best first.
    async fn vector_candidates(
        &self,
        embedder: &Arc<dyn Embedder>,
        tenant: &str,
        agent: &str,
        query: &str,
        limit: usize,
    ) -> Result<(Vec<(i64, f32)>, Arc<Packed>), MemoryError> {
        let q = embedder
            .embed(&[query.to_owned()])
            .await?
            .into_iter()
            .next()
            .unwrap_or_default();
        let set = self.vectors(tenant, agent, embedder.name()).await?;
        let scan = Arc::clone(&set);
        // Milliseconds of CPU: kept off the async workers.
        let hits = tokio::task::spawn_blocking(move || scan.top(&q, limit))
            .await
            .map_err(|e| MemoryError::Backend(format!("vector scan failed: {e}")))?;
        Ok((hits, set))
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
        let mut vectors = None;
        let mut vector_hits = Vec::new();
        match vector {
            Some(Ok((hits, set))) => {
                vector_hits = hits;
                vectors = Some(set);
            }
            Some(Err(e)) => tracing::warn!(error = %e, "vector search failed; using BM25 only"),
            None => {}
        }
        let fused = if vectors.is_some() {
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
            .chunks(tenant, agent, &ids)
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
        // Rows of each candidate in the vector set, for MMR's similarity.
        let positions: HashMap<i64, usize> = vectors
            .as_ref()
            .map(|set| {
                let wanted: std::collections::HashSet<i64> = scored.iter().map(|c| c.0).collect();
                set.rowids
                    .iter()
                    .enumerate()
                    .filter(|(_, id)| wanted.contains(id))
                    .map(|(i, id)| (*id, i))
                    .collect()
            })
            .unwrap_or_default();
        let similarity = |a: i64, b: i64| -> f32 {
            if let (Some(set), Some(&i), Some(&j)) =
                (vectors.as_ref(), positions.get(&a), positions.get(&b))
            {
                return set.similarity(i, j).max(0.0);
            }
            match (found.get(&a), found.get(&b)) {
                (Some(x), Some(y)) => word_overlap(&x.text, &y.text),
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

    #[test]
    fn packed_scan_picks_the_nearest() {
        let set = Packed::new(VectorSet {
            rowids: vec![10, 11, 12],
            data: vec![1.0, 0.0, 0.0, 1.0, 0.6, 0.8],
            dim: 2,
        });
        let hits = set.top(&[0.0, 1.0], 2);
        assert_eq!(hits.iter().map(|h| h.0).collect::<Vec<_>>(), [11, 12]);
        assert!((hits[1].1 - 0.8).abs() < 0.01);
        assert_eq!(set.top(&[1.0, 0.0], 10).len(), 3);
        assert!(set.top(&[1.0], 10).is_empty());
        assert!((set.similarity(0, 2) - 0.6).abs() < 0.01);
    }

    #[test]
    fn packed_scan_on_threads_matches_one_thread() {
        // Enough rows for several threads; each row's best match is known.
        let dim = 16;
        let rows = ROWS_PER_THREAD * 3 + 7;
        let mut data = vec![0.0_f32; rows * dim];
        for r in 0..rows {
            data[r * dim + r % dim] = 1.0 / (1.0 + (r / dim) as f32);
        }
        let set = Packed::new(VectorSet {
            rowids: (0..rows as i64).collect(),
            data,
            dim,
        });
        let mut q = vec![0.0_f32; dim];
        q[3] = 1.0;
        let hits = set.top(&q, 5);
        assert_eq!(
            hits.iter().map(|h| h.0).collect::<Vec<_>>(),
            [3, 19, 35, 51, 67]
        );
    }

    #[test]
    fn bf16_round_trip_keeps_three_digits() {
        for x in [0.0_f32, 1.0, -0.5, 0.123_456, -0.987_654, 3.0e-5] {
            let y = from_bf16(to_bf16(x));
            assert!((x - y).abs() <= x.abs() / 256.0, "{x} -> {y}");
        }
    }

    #[test]
    fn snippets_are_capped() {
        let long = "x".repeat(SNIPPET_CHARS + 10);
        assert_eq!(snippet(&long).chars().count(), SNIPPET_CHARS + 1);
        assert_eq!(snippet("short"), "short");
    }
}
