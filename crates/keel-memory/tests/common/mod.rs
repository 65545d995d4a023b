//! Shared by the SQLite and PostgreSQL tests: a deterministic embedder that
//! counts what it embeds, and the behaviour suite every backend must pass.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use chrono::{Duration, Utc};
use keel_memory::{EmbedError, Embedder, Memory, MemoryDocument};

/// Bag-of-words vectors (each lowercase word hashed into one of 64
/// dimensions), normalized. Not semantic: it stands in for a model where a
/// test is about *which* chunks get embedded, not about meaning (the real
/// model has its own test).
pub struct CountingEmbedder {
    pub embedded: AtomicUsize,
}

impl CountingEmbedder {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            embedded: AtomicUsize::new(0),
        })
    }

    pub fn count(&self) -> usize {
        self.embedded.load(Ordering::SeqCst)
    }
}

fn bucket(word: &str) -> usize {
    word.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) as usize
        % 64
}

#[async_trait]
impl Embedder for CountingEmbedder {
    fn name(&self) -> &str {
        "test/bag-of-words"
    }

    fn dim(&self) -> usize {
        64
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embedded.fetch_add(texts.len(), Ordering::SeqCst);
        Ok(texts
            .iter()
            .map(|t| {
                let mut v = vec![0.0_f32; 64];
                for w in t
                    .split(|c: char| !c.is_alphanumeric())
                    .filter(|w| !w.is_empty())
                {
                    v[bucket(&w.to_lowercase())] += 1.0;
                }
                let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-9);
                v.iter().map(|x| x / n).collect()
            })
            .collect())
    }
}

pub fn doc(tenant: &str, agent: &str, source: &str, text: &str) -> MemoryDocument {
    MemoryDocument {
        tenant: tenant.into(),
        agent: agent.into(),
        source: source.into(),
        title: source.into(),
        text: text.into(),
        created_at: Utc::now(),
    }
}

/// Numbered filler lines, so a document spans several chunks.
pub fn filler(prefix: &str, lines: usize) -> String {
    (0..lines)
        .map(|i| format!("{prefix} line {i} mentions routine inspection number {i}"))
        .collect::<Vec<_>>()
        .join("\n")
}

pub async fn add_search_get(memory: &Arc<dyn Memory>) {
    let id = memory
        .add_document(doc(
            "acme",
            "ops",
            "doc:furnace",
            "# Furnace F2\nThe furnace F2 thermocouple was replaced on 3 March.\nSpare part number TC-448.",
        ))
        .await
        .unwrap();
    memory
        .add_document(doc(
            "acme",
            "ops",
            "doc:boiler",
            "Boiler B1 pressure valve tested fine.",
        ))
        .await
        .unwrap();
    let hits = memory
        .search("acme", "ops", "thermocouple F2", 5)
        .await
        .unwrap();
    assert!(!hits.is_empty());
    assert_eq!(hits[0].source, "doc:furnace");
    assert!(hits[0].snippet.contains("TC-448"));
    assert!(hits[0].score > 0.0 && hits[0].score <= 1.0);
    assert!(hits[0].id.starts_with(&id), "{} vs {id}", hits[0].id);
    // The whole document by its id; a window of lines by from/lines.
    let all = memory.get("acme", "ops", &id, 1, 0).await.unwrap().unwrap();
    assert!(all.starts_with("# Furnace F2") && all.ends_with("TC-448."));
    let second = memory.get("acme", "ops", &id, 2, 1).await.unwrap().unwrap();
    assert_eq!(
        second,
        "The furnace F2 thermocouple was replaced on 3 March."
    );
    // A chunk id reads from the chunk's first line.
    let by_chunk = memory
        .get("acme", "ops", &hits[0].id, 1, 1)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(by_chunk, "# Furnace F2");
    assert!(
        memory
            .get("acme", "ops", "mem_nope", 1, 0)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        memory
            .get("acme", "ops", &format!("{id}#99"), 1, 0)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        memory
            .get("acme", "ops", &format!("{id}#x"), 1, 0)
            .await
            .unwrap()
            .is_none()
    );
    // Empty queries and documents are refused, not silently ignored.
    assert!(memory.search("acme", "ops", "  ", 5).await.is_err());
    assert!(
        memory
            .add_document(doc("acme", "ops", "doc:empty", " \n"))
            .await
            .is_err()
    );
}

pub async fn tenant_and_agent_isolation(memory: &Arc<dyn Memory>) {
    let id = memory
        .add_document(doc(
            "acme",
            "ops",
            "session:s1",
            "The gate code for warehouse 7 is 4711.",
        ))
        .await
        .unwrap();
    for (tenant, agent) in [("globex", "ops"), ("acme", "sales"), ("globex", "sales")] {
        let hits = memory
            .search(tenant, agent, "gate code warehouse 4711", 10)
            .await
            .unwrap();
        assert!(hits.is_empty(), "{tenant}/{agent} saw {hits:?}");
        assert!(
            memory
                .get(tenant, agent, &id, 1, 0)
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            memory
                .get(tenant, agent, &format!("{id}#0"), 1, 0)
                .await
                .unwrap()
                .is_none()
        );
    }
    // The same source in another tenant is another document.
    let other = memory
        .add_document(doc(
            "globex",
            "ops",
            "session:s1",
            "Globex notes about lunch.",
        ))
        .await
        .unwrap();
    assert_ne!(other, id);
    let hits = memory.search("acme", "ops", "gate code", 10).await.unwrap();
    assert_eq!(hits.len(), 1);
    assert!(hits[0].snippet.contains("4711"));
    let hits = memory
        .search("globex", "ops", "gate code lunch", 10)
        .await
        .unwrap();
    assert!(hits.iter().all(|h| !h.snippet.contains("4711")));
}

/// Re-adding a document re-embeds only chunks whose text changed.
pub async fn incremental_reembedding(memory: &Arc<dyn Memory>, counter: &CountingEmbedder) {
    // 40 lines of 9 tokens = 360 tokens: with 50-token chunks and 10 overlap, 9 chunks.
    let text = filler("manual", 40);
    let before = counter.count();
    let id = memory
        .add_document(doc("acme", "ops", "doc:manual", &text))
        .await
        .unwrap();
    let first = counter.count() - before;
    assert!(first >= 5, "expected several chunks, embedded {first}");
    // Same text again: nothing to embed, same id.
    let before = counter.count();
    let again = memory
        .add_document(doc("acme", "ops", "doc:manual", &text))
        .await
        .unwrap();
    assert_eq!(again, id);
    assert_eq!(counter.count() - before, 0);
    // Change the last line only: only the chunk(s) holding it are embedded.
    let changed = format!("{text}\nmanual appendix: the vent damper is stiff");
    let before = counter.count();
    memory
        .add_document(doc("acme", "ops", "doc:manual", &changed))
        .await
        .unwrap();
    let re = counter.count() - before;
    assert!((1..=2).contains(&re), "re-embedded {re} of {first} chunks");
    let hits = memory
        .search("acme", "ops", "vent damper stiff", 3)
        .await
        .unwrap();
    assert!(hits[0].snippet.contains("vent damper"));
    // Reindex embeds everything again and reports the chunk count.
    let before = counter.count();
    let chunks = memory.reindex().await.unwrap();
    assert!(chunks >= first);
    assert_eq!(counter.count() - before, chunks);
}

pub async fn bm25_only(memory: &Arc<dyn Memory>) {
    let status = memory.status();
    assert!(status.embedder.is_none());
    let notice = status.notice.unwrap();
    assert!(notice.contains("BM25 only"), "{notice}");
    memory
        .add_document(doc(
            "acme",
            "ops",
            "doc:a",
            "Pump P3 bearing noise reported by night shift.",
        ))
        .await
        .unwrap();
    memory
        .add_document(doc("acme", "ops", "doc:b", "Conveyor belt C1 realigned."))
        .await
        .unwrap();
    let hits = memory
        .search("acme", "ops", "bearing noise on pump", 5)
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].source, "doc:a");
}

/// Near-duplicate notes do not crowd out a different relevant one (run
/// with `mmr_lambda` 0.5: an exact duplicate then gains nothing).
pub async fn mmr_diversifies(memory: &Arc<dyn Memory>) {
    let dup = "Compressor K4 oil pressure alarm tripped at night; compressor K4 restarted.";
    memory
        .add_document(doc("acme", "mmr", "doc:d1", dup))
        .await
        .unwrap();
    memory
        .add_document(doc("acme", "mmr", "doc:d2", dup))
        .await
        .unwrap();
    memory
        .add_document(doc(
            "acme",
            "mmr",
            "doc:other",
            "Oil pressure alarm on compressor K4 traced to a faulty sensor; sensor swapped.",
        ))
        .await
        .unwrap();
    let hits = memory
        .search("acme", "mmr", "compressor K4 oil pressure alarm", 2)
        .await
        .unwrap();
    let sources: Vec<&str> = hits.iter().map(|h| h.source.as_str()).collect();
    assert_eq!(sources.len(), 2);
    assert!(sources.contains(&"doc:other"), "{sources:?}");
}

/// With decay on, an old note loses to a fresh one that matches as well.
pub async fn time_decay(memory: &Arc<dyn Memory>) {
    let mut old = doc(
        "acme",
        "decay",
        "note:old",
        "Shift handover: valve V9 leaking.",
    );
    old.created_at = Utc::now() - Duration::days(90);
    memory.add_document(old).await.unwrap();
    memory
        .add_document(doc(
            "acme",
            "decay",
            "note:new",
            "Shift handover: valve V9 leaking.",
        ))
        .await
        .unwrap();
    let hits = memory
        .search("acme", "decay", "valve V9 leaking", 2)
        .await
        .unwrap();
    assert_eq!(hits[0].source, "note:new");
    assert!(hits[1].score < hits[0].score * 0.2, "{hits:?}");
}

/// Vectors by meaning for a handful of words: synonyms share a dimension,
/// so a query can match a note it shares no word with, which only the
/// vector side (and so the vector cache) can find. Other words get small
/// hashed dimensions of their own.
pub struct ConceptEmbedder;

const CONCEPTS: &[&[&str]] = &[
    &["invoice", "invoices", "bill", "bills"],
    &["approve", "approved", "sign", "signs"],
    &["badge", "badges", "pass", "passes"],
    &["issue", "issued", "hand", "hands"],
];

#[async_trait]
impl Embedder for ConceptEmbedder {
    fn name(&self) -> &str {
        "test/concepts"
    }

    fn dim(&self) -> usize {
        64
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts
            .iter()
            .map(|t| {
                let mut v = vec![0.0_f32; 64];
                for w in t
                    .split(|c: char| !c.is_alphanumeric())
                    .filter(|w| !w.is_empty())
                    .map(str::to_lowercase)
                {
                    match CONCEPTS.iter().position(|c| c.contains(&w.as_str())) {
                        Some(i) => v[i] += 1.0,
                        None => v[CONCEPTS.len() + bucket(&w) % (64 - CONCEPTS.len())] += 0.2,
                    }
                }
                let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-9);
                v.iter().map(|x| x / n).collect()
            })
            .collect())
    }
}

/// The in-memory vectors follow every write: a document added after the
/// scope's vectors were loaded is found by meaning alone (no shared word,
/// so not by BM25) on the next search; a replaced document's old text is
/// gone; another tenant never sees either; and a reindex keeps all of it.
/// Run with [`ConceptEmbedder`].
pub async fn vector_cache_follows_writes(memory: &Arc<dyn Memory>) {
    let sources = |hits: &[keel_memory::MemoryHit]| -> Vec<String> {
        hits.iter().map(|h| h.source.clone()).collect()
    };
    memory
        .add_document(doc(
            "acme",
            "ops",
            "note:invoices",
            "Invoices are approved by Maria.",
        ))
        .await
        .unwrap();
    // Loads the scope's vectors.
    let hits = memory
        .search("acme", "ops", "who signs bills", 3)
        .await
        .unwrap();
    assert_eq!(sources(&hits), ["note:invoices"]);
    // Written after the load: found through the followed cache.
    memory
        .add_document(doc(
            "acme",
            "ops",
            "note:badges",
            "Badges are issued by reception.",
        ))
        .await
        .unwrap();
    let hits = memory
        .search("acme", "ops", "who hands out passes", 3)
        .await
        .unwrap();
    assert_eq!(hits[0].source, "note:badges", "{hits:?}");
    // Another tenant, with a note of its own on the same subject.
    for query in ["who hands out passes", "who signs bills"] {
        assert!(
            memory
                .search("globex", "ops", query, 5)
                .await
                .unwrap()
                .is_empty()
        );
    }
    memory
        .add_document(doc(
            "globex",
            "ops",
            "note:passes",
            "Passes are issued by security.",
        ))
        .await
        .unwrap();
    let hits = memory
        .search("globex", "ops", "who hands out badges", 5)
        .await
        .unwrap();
    assert_eq!(sources(&hits), ["note:passes"]);
    let hits = memory
        .search("acme", "ops", "who hands out badges", 5)
        .await
        .unwrap();
    assert!(hits.iter().all(|h| h.source != "note:passes"), "{hits:?}");
    assert!(hits.iter().any(|h| h.source == "note:badges"), "{hits:?}");
    // Replaced: the old text is no longer found, the new one is.
    memory
        .add_document(doc(
            "acme",
            "ops",
            "note:badges",
            "Reception closes at six.",
        ))
        .await
        .unwrap();
    let hits = memory
        .search("acme", "ops", "who hands out passes", 5)
        .await
        .unwrap();
    assert!(
        hits.iter().all(|h| !h.snippet.contains("Badges")),
        "{hits:?}"
    );
    let hits = memory
        .search("acme", "ops", "reception closes", 5)
        .await
        .unwrap();
    assert_eq!(hits[0].snippet, "Reception closes at six.");
    // A reindex leaves every scope answering as before.
    assert_eq!(memory.reindex().await.unwrap(), 3);
    let hits = memory
        .search("acme", "ops", "who signs bills", 3)
        .await
        .unwrap();
    assert_eq!(hits[0].source, "note:invoices");
    let hits = memory
        .search("globex", "ops", "who signs bills", 3)
        .await
        .unwrap();
    assert!(hits.iter().all(|h| h.source == "note:passes"), "{hits:?}");
}

/// Another tenant's chunks that match a query better than all of this
/// tenant's still leave this tenant its own results, and only those: the
/// text search limits its candidates after the scope filter, not before.
/// Run without an embedder (BM25 only).
pub async fn text_search_limits_after_the_scope_filter(memory: &Arc<dyn Memory>) {
    for n in 0..120 {
        memory
            .add_document(doc(
                "globex",
                "ops",
                &format!("doc:v{n}"),
                "valve V7 valve V7 valve",
            ))
            .await
            .unwrap();
    }
    memory
        .add_document(doc(
            "acme",
            "ops",
            "doc:walk",
            "Walkround: the valve was checked along with the pumps, fans, \
             belts, filters, gauges and the rest of hall 3.",
        ))
        .await
        .unwrap();
    let hits = memory.search("acme", "ops", "valve V7", 5).await.unwrap();
    let sources: Vec<&str> = hits.iter().map(|h| h.source.as_str()).collect();
    assert_eq!(sources, ["doc:walk"]);
    let hits = memory.search("globex", "ops", "valve", 50).await.unwrap();
    assert_eq!(hits.len(), 50);
    assert!(
        hits.iter().all(|h| h.source.starts_with("doc:v")),
        "{hits:?}"
    );
}
