#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The memory on real SQLite files.

mod common;

use std::sync::Arc;

use common::{CountingEmbedder, doc};
use keel_memory::{Embedder, Memory, Settings};

fn small_chunks() -> Settings {
    Settings {
        chunk_tokens: 50,
        chunk_overlap: 10,
        ..Settings::default()
    }
}

async fn with_embedder(
    dir: &std::path::Path,
    settings: Settings,
) -> (Arc<dyn Memory>, Arc<CountingEmbedder>) {
    let counter = CountingEmbedder::new();
    let embedder: Arc<dyn Embedder> = counter.clone();
    let memory = keel_memory::open_with("", dir, Some(embedder), settings, None)
        .await
        .unwrap();
    (memory, counter)
}

#[tokio::test]
async fn add_search_get() {
    let dir = tempfile::tempdir().unwrap();
    let (memory, _) = with_embedder(dir.path(), Settings::default()).await;
    common::add_search_get(&memory).await;
    // Memory lives in its own file, beside (not inside) keel.db.
    assert!(dir.path().join("memory.db").is_file());
}

#[tokio::test]
async fn tenant_and_agent_isolation() {
    let dir = tempfile::tempdir().unwrap();
    let (memory, _) = with_embedder(dir.path(), Settings::default()).await;
    common::tenant_and_agent_isolation(&memory).await;
}

#[tokio::test]
async fn vector_cache_follows_writes() {
    let dir = tempfile::tempdir().unwrap();
    let embedder: Arc<dyn Embedder> = Arc::new(common::ConceptEmbedder);
    let memory = keel_memory::open_with("", dir.path(), Some(embedder), Settings::default(), None)
        .await
        .unwrap();
    common::vector_cache_follows_writes(&memory).await;
}

#[tokio::test]
async fn text_search_limits_after_the_scope_filter() {
    let dir = tempfile::tempdir().unwrap();
    let memory = keel_memory::open("", dir.path(), None).await.unwrap();
    common::text_search_limits_after_the_scope_filter(&memory).await;
}

#[tokio::test]
async fn incremental_reembedding() {
    let dir = tempfile::tempdir().unwrap();
    let (memory, counter) = with_embedder(dir.path(), small_chunks()).await;
    common::incremental_reembedding(&memory, &counter).await;
}

#[tokio::test]
async fn bm25_only_mode_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let memory = keel_memory::open("sqlite://ignored", dir.path(), None)
        .await
        .unwrap();
    common::bm25_only(&memory).await;
}

#[tokio::test]
async fn mmr_diversifies() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        mmr_lambda: 0.5,
        ..Settings::default()
    };
    let (memory, _) = with_embedder(dir.path(), settings).await;
    common::mmr_diversifies(&memory).await;
    // λ = 1 is relevance only: the duplicate comes back.
    let relevance_only = Settings {
        mmr_lambda: 1.0,
        ..Settings::default()
    };
    let (memory, _) = with_embedder(dir.path(), relevance_only).await;
    let hits = memory
        .search(
            "acme",
            "mmr",
            "compressor K4 oil pressure alarm tripped at night",
            2,
        )
        .await
        .unwrap();
    let sources: Vec<&str> = hits.iter().map(|h| h.source.as_str()).collect();
    assert!(
        sources.contains(&"doc:d1") && sources.contains(&"doc:d2"),
        "{sources:?}"
    );
}

#[tokio::test]
async fn time_decay() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        time_decay_half_life_days: 14.0,
        ..Settings::default()
    };
    let (memory, _) = with_embedder(dir.path(), settings).await;
    common::time_decay(&memory).await;
}

/// A second process (here: a second handle on the same file, as `keel
/// memory add` next to a running server) sees the first one's writes, and
/// the first one's vector cache notices the other's.
#[tokio::test]
async fn writes_from_another_handle_are_seen() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = with_embedder(dir.path(), Settings::default()).await;
    let (b, _) = with_embedder(dir.path(), Settings::default()).await;
    a.add_document(doc(
        "acme",
        "ops",
        "doc:one",
        "Chiller CH2 setpoint is 6 degrees.",
    ))
    .await
    .unwrap();
    // Warm a's vector cache, then write through b.
    assert_eq!(
        a.search("acme", "ops", "chiller setpoint", 5)
            .await
            .unwrap()
            .len(),
        1
    );
    b.add_document(doc(
        "acme",
        "ops",
        "doc:two",
        "Chiller CH3 setpoint is 7 degrees.",
    ))
    .await
    .unwrap();
    let hits = a
        .search("acme", "ops", "chiller setpoint", 5)
        .await
        .unwrap();
    assert_eq!(hits.len(), 2);
    drop(a);
    drop(b);
    // And everything is still there after reopening.
    let (c, _) = with_embedder(dir.path(), Settings::default()).await;
    assert_eq!(
        c.search("acme", "ops", "chiller", 5).await.unwrap().len(),
        2
    );
}

/// Without an embedder, documents are stored for text search; once one is
/// configured, a reindex gives them vectors.
#[tokio::test]
async fn reindex_adds_vectors_to_text_only_documents() {
    let dir = tempfile::tempdir().unwrap();
    let plain = keel_memory::open("", dir.path(), None).await.unwrap();
    plain
        .add_document(doc("acme", "ops", "doc:x", "Kiln K1 door seal replaced."))
        .await
        .unwrap();
    drop(plain);
    let (memory, counter) = with_embedder(dir.path(), Settings::default()).await;
    assert_eq!(memory.reindex().await.unwrap(), 1);
    assert_eq!(counter.count(), 1);
    assert_eq!(
        memory.status().embedder.as_deref(),
        Some("test/bag-of-words")
    );
    assert!(memory.status().notice.is_none());
}

/// Past 2,000 chunks, a word found in nearly every chunk is left out of the
/// text query (it would cost a BM25 score per chunk and rank nothing);
/// results stay right, and a query made only of such words still answers.
#[tokio::test]
async fn words_found_everywhere_do_not_break_text_search() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        chunk_tokens: 4,
        chunk_overlap: 0,
        ..Settings::default()
    };
    let notice = Some("no embedding model available: memory search uses BM25 only (test)".into());
    let memory = keel_memory::open_with("", dir.path(), None, settings, notice)
        .await
        .unwrap();
    let text: Vec<String> = (0..2500)
        .map(|i| format!("plant log{i} entry{i} ok{i}"))
        .collect();
    memory
        .add_document(doc("acme", "ops", "doc:log", &text.join("\n")))
        .await
        .unwrap();
    memory
        .add_document(doc(
            "acme",
            "ops",
            "doc:zebra",
            "plant zebra crossing painted",
        ))
        .await
        .unwrap();
    let hits = memory
        .search("acme", "ops", "plant zebra", 3)
        .await
        .unwrap();
    assert_eq!(hits[0].source, "doc:zebra", "{hits:?}");
    let hits = memory.search("acme", "ops", "plant", 3).await.unwrap();
    assert_eq!(hits.len(), 3);
    assert!(
        memory
            .search("globex", "ops", "plant", 3)
            .await
            .unwrap()
            .is_empty()
    );
}
