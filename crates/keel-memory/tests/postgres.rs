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
use sqlx::Connection;
use sqlx::postgres::PgConnection;

const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

fn admin_url() -> String {
    std::env::var("KEEL_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_ADMIN_URL.to_owned())
}

/// `url` with its database name replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let root = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{root}/{database}?{query}"),
        None => format!("{root}/{database}"),
    }
}

async fn admin_connection(admin: &str) -> PgConnection {
    PgConnection::connect(admin).await.unwrap_or_else(|e| {
        panic!(
            "PostgreSQL is required for these tests and is not reachable at {admin} ({e}). \
             Start it, or point KEEL_TEST_PG_URL at an admin URL of a server that is up."
        )
    })
}

struct TestDb {
    admin: String,
    name: String,
    url: String,
}

impl TestDb {
    async fn create() -> Self {
        let admin = admin_url();
        let name = keel_protocol::new_id("keel_test");
        let mut conn = admin_connection(&admin).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("creating test database {name}: {e}"));
        conn.close().await.unwrap();
        let url = with_database(&admin, &name);
        Self { admin, name, url }
    }

    async fn memory(
        &self,
        embedder: Option<Arc<dyn Embedder>>,
        settings: Settings,
    ) -> Arc<dyn Memory> {
        let notice = embedder.is_none().then(|| {
            "no embedding model available: memory search uses BM25 only (test)".to_owned()
        });
        let unused = std::path::Path::new("/nonexistent-keel-data-dir");
        keel_memory::open_with(&self.url, unused, embedder, settings, notice)
            .await
            .unwrap()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        // Drop runs outside any runtime's async context: use a thread of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok(mut conn) = PgConnection::connect(&admin).await {
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        })
        .join();
    }
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
    common::add_search_get(&db.memory(e, Settings::default()).await).await;
}

#[tokio::test]
async fn tenant_and_agent_isolation() {
    let db = TestDb::create().await;
    let (_, e) = counted();
    common::tenant_and_agent_isolation(&db.memory(e, Settings::default()).await).await;
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
    common::incremental_reembedding(&db.memory(e, settings).await, &c).await;
}

#[tokio::test]
async fn bm25_only_mode_says_so() {
    let db = TestDb::create().await;
    common::bm25_only(&db.memory(None, Settings::default()).await).await;
}

#[tokio::test]
async fn mmr_and_decay() {
    let db = TestDb::create().await;
    let (_, e) = counted();
    let mmr = Settings {
        mmr_lambda: 0.5,
        ..Settings::default()
    };
    common::mmr_diversifies(&db.memory(e.clone(), mmr).await).await;
    let settings = Settings {
        time_decay_half_life_days: 14.0,
        ..Settings::default()
    };
    common::time_decay(&db.memory(e, settings).await).await;
}

/// Two nodes on one database: the second node's write reaches the first
/// node's searches (its vector cache is invalidated by the scope version),
/// and migrating twice is harmless.
#[tokio::test]
async fn two_nodes_share_memory() {
    let db = TestDb::create().await;
    let (_, e) = counted();
    let a = db.memory(e.clone(), Settings::default()).await;
    let b = db.memory(e, Settings::default()).await;
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
