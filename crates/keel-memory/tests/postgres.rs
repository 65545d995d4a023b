#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The memory on a real PostgreSQL server: each test creates its own
//! database (`keel_test_<random>`) and drops it afterwards. The server is
//! `KEEL_TEST_PG_URL` (an admin URL, default
//! `postgres://postgres@127.0.0.1:5432/postgres`); one that cannot be
//! reached fails the tests rather than skipping them.

mod common;

use std::sync::Arc;

use common::CountingEmbedder;
use keel_memory::{Embedder, Memory, Settings};

use keel_test_support::pg::TestDb;

async fn memory(
    db: &TestDb,
    embedder: Option<Arc<dyn Embedder>>,
    settings: Settings,
) -> Arc<dyn Memory> {
    let notice = embedder
        .is_none()
        .then(|| "no embedding model available: memory search uses BM25 only (test)".to_owned());
    let unused = std::path::Path::new("/nonexistent-keel-data-dir");
    keel_memory::open_with(&db.url, unused, embedder, settings, notice)
        .await
        .unwrap()
}

fn counted() -> (Arc<CountingEmbedder>, Option<Arc<dyn Embedder>>) {
    let c = CountingEmbedder::new();
    let e: Arc<dyn Embedder> = c.clone();
    (c, Some(e))
}

#[tokio::test]
async fn add_search_get() {
    let db = TestDb::create().await;
    let (_, e) = counted();
    common::add_search_get(&memory(&db, e, Settings::default()).await).await;
}

#[tokio::test]
async fn tenant_and_agent_isolation() {
    let db = TestDb::create().await;
    let (_, e) = counted();
    common::tenant_and_agent_isolation(&memory(&db, e, Settings::default()).await).await;
}

#[tokio::test]
async fn vector_cache_follows_writes() {
    let db = TestDb::create().await;
    let e: Arc<dyn Embedder> = Arc::new(common::ConceptEmbedder);
    common::vector_cache_follows_writes(&memory(&db, Some(e), Settings::default()).await).await;
}

#[tokio::test]
async fn text_search_limits_after_the_scope_filter() {
    let db = TestDb::create().await;
    common::text_search_limits_after_the_scope_filter(
        &memory(&db, None, Settings::default()).await,
    )
    .await;
}

#[tokio::test]
async fn incremental_reembedding() {
    let db = TestDb::create().await;
    let (c, e) = counted();
    let settings = Settings {
        chunk_tokens: 50,
        chunk_overlap: 10,
        ..Settings::default()
    };
    common::incremental_reembedding(&memory(&db, e, settings).await, &c).await;
}

#[tokio::test]
async fn bm25_only_mode_says_so() {
    let db = TestDb::create().await;
    common::bm25_only(&memory(&db, None, Settings::default()).await).await;
}

#[tokio::test]
async fn mmr_and_decay() {
    let db = TestDb::create().await;
    let (_, e) = counted();
    let mmr = Settings {
        mmr_lambda: 0.5,
        ..Settings::default()
    };
    common::mmr_diversifies(&memory(&db, e.clone(), mmr).await).await;
    let settings = Settings {
        time_decay_half_life_days: 14.0,
        ..Settings::default()
    };
    common::time_decay(&memory(&db, e, settings).await).await;
}

/// Two nodes on one database: the second node's write reaches the first
/// node's searches (its vector cache is invalidated by the scope version),
/// and migrating twice is harmless.
#[tokio::test]
async fn two_nodes_share_memory() {
    let db = TestDb::create().await;
    let (_, e) = counted();
    let a = memory(&db, e.clone(), Settings::default()).await;
    let b = memory(&db, e, Settings::default()).await;
    a.add_document(common::doc(
        "acme",
        "ops",
        "doc:1",
        "Chiller CH2 setpoint is 6 degrees.",
    ))
    .await
    .unwrap();
    assert_eq!(
        a.search("acme", "ops", "chiller setpoint", 5)
            .await
            .unwrap()
            .len(),
        1
    );
    b.add_document(common::doc(
        "acme",
        "ops",
        "doc:2",
        "Chiller CH3 setpoint is 7 degrees.",
    ))
    .await
    .unwrap();
    assert_eq!(
        a.search("acme", "ops", "chiller setpoint", 5)
            .await
            .unwrap()
            .len(),
        2
    );
}
