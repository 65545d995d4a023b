#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The PostgreSQL store against a real server: each test creates its own
//! database (`keel_test_<random>`) and drops it afterwards.
//!
//! The server is taken from `KEEL_TEST_PG_URL` (an admin URL, default
//! `postgres://postgres@127.0.0.1:5432/postgres`). A server that cannot be
//! reached fails the tests: CI has one, and a silent pass would hide that
//! nothing was tested.

use std::sync::Arc;

use sqlx::Connection;
use sqlx::postgres::PgConnection;

use keel_protocol::{
    ApprovalStore, Commit, EventKind, Message, RunPatch, RunStatus, Store, StoreError,
};
use keel_store::PostgresStore;
use keel_test_support::pg::{TestDb, with_database};
use keel_test_support::store_suite;

async fn connect(db: &TestDb) -> PostgresStore {
    PostgresStore::connect(&db.url).await.unwrap()
}

#[test]
fn database_urls_are_rewritten() {
    assert_eq!(
        with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
        "postgres://postgres@127.0.0.1:5432/x"
    );
    assert_eq!(
        with_database("postgresql://u:p@h/postgres?sslmode=disable", "x"),
        "postgresql://u:p@h/x?sslmode=disable"
    );
    assert_eq!(with_database("postgres://h:1", "x"), "postgres://h:1/x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite() {
    let db = TestDb::create().await;
    let store = connect(&db).await;
    store_suite::run_all(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_commits_are_gap_free() {
    let db = TestDb::create().await;
    let store: Arc<dyn Store> = Arc::new(connect(&db).await);
    store_suite::concurrent_commits_are_gap_free(&store, 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opened_by_url_through_keel_store_open() {
    let db = TestDb::create().await;
    let store = keel_store::open(&db.url).await.unwrap();
    store.ping().await.unwrap();
    let postgresql = db.url.replacen("postgres://", "postgresql://", 1);
    let again = keel_store::open(&postgresql).await.unwrap();
    let (run, _) = store
        .create_run(store_suite::new_run("t", "s"))
        .await
        .unwrap();
    assert_eq!(again.get_run("t", &run.id).await.unwrap(), Some(run));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_reconnect() {
    let db = TestDb::create().await;
    let tenant = keel_protocol::new_id("ten");

    let store = connect(&db).await;
    let (run, _) = store
        .create_run(store_suite::new_run(&tenant, "s"))
        .await
        .unwrap();
    let pending = store_suite::approval(&run, "c1");
    let events = store
        .commit(
            &run.id,
            Commit {
                calls: Vec::new(),
                approvals: vec![pending.clone()],
                events: vec![
                    EventKind::MessageDelta { text: "hi".into() },
                    EventKind::Final {
                        answer: "hello".into(),
                    },
                ],
                messages: vec![Message::user("hi"), Message::user("again")],
                patch: Some(RunPatch {
                    status: Some(RunStatus::WaitingInput),
                    pending: Some(Some(keel_protocol::Pending::Input {
                        question: "which city?".into(),
                        tool: "weather".into(),
                        missing_slots: vec!["city".into()],
                        round: 1,
                        handoff: false,
                    })),
                    steps: Some(2),
                    state: Some(serde_json::json!({"counters": {"repeat": 1}}).to_string()),
                    ..RunPatch::default()
                }),
            },
        )
        .await
        .unwrap();
    let before = store.get_run(&tenant, &run.id).await.unwrap().unwrap();
    store.close().await;
    drop(store);

    let store = connect(&db).await;
    let after = store.get_run(&tenant, &run.id).await.unwrap().unwrap();
    assert_eq!(after, before);
    assert_eq!(after.principal, before.principal);
    assert_eq!(after.state, before.state);
    assert_eq!(after.last_seq, 2);
    assert_eq!(store.events_after(&run.id, 0, 100).await.unwrap(), events);
    assert_eq!(
        store.history(&run.id).await.unwrap(),
        vec![Message::user("hi"), Message::user("again")]
    );
    assert_eq!(
        store.get_approval(&tenant, &pending.id).await.unwrap(),
        Some(pending)
    );
    let unfinished = store.unfinished_runs().await.unwrap();
    assert_eq!(unfinished.len(), 1);
    assert_eq!(unfinished[0].id, run.id);
    assert!(unfinished[0].principal.is_some());

    // Numbering continues after the reconnect.
    let next = store
        .commit(
            &run.id,
            Commit {
                events: vec![EventKind::RunCancelled { by: "user".into() }],
                ..Commit::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(next[0].seq, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrates_once_and_concurrent_connects_agree() {
    let db = TestDb::create().await;
    // Several nodes starting at once against a fresh database.
    let connects: Vec<_> = (0..4)
        .map(|_| {
            let url = db.url.clone();
            tokio::spawn(async move { PostgresStore::connect(&url).await })
        })
        .collect();
    for connect in connects {
        connect.await.unwrap().unwrap().ping().await.unwrap();
    }
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM keel_schema_version ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        versions,
        (1..=PostgresStore::schema_version()).collect::<Vec<_>>(),
        "each migration is applied exactly once"
    );

    // A database migrated by a newer build is refused.
    sqlx::query("INSERT INTO keel_schema_version (version) VALUES ($1)")
        .bind(PostgresStore::schema_version() + 1)
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    match PostgresStore::connect(&db.url).await {
        Err(StoreError::Backend(message)) => assert!(message.contains("newer"), "{message}"),
        Err(e) => panic!("unexpected error {e:?}"),
        Ok(_) => panic!("a newer schema must not be used"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_a_backend_error() {
    // Port 1 on loopback: nothing listens there.
    match PostgresStore::connect("postgres://postgres@127.0.0.1:1/keel").await {
        Err(StoreError::Backend(message)) => {
            assert!(message.contains("connecting"), "{message}")
        }
        Err(e) => panic!("unexpected error {e:?}"),
        Ok(_) => panic!("connected to a server that does not exist"),
    }
    assert!(matches!(
        keel_store::open("mysql://localhost/keel").await,
        Err(StoreError::Backend(_))
    ));
}

/// Two stores with pools of their own, as two nodes have, taking from one
/// counter and one tenant's run slots at once: never more than the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_never_together_pass_a_quota() {
    use keel_protocol::{QuotaKey, QuotaLimit};
    let db = TestDb::create().await;
    let a: Arc<dyn Store> = Arc::new(connect(&db).await);
    let b: Arc<dyn Store> = Arc::new(connect(&db).await);
    let key = QuotaKey {
        tenant: keel_protocol::new_id("ten"),
        limit: QuotaLimit::RunsPerMinute,
        period: "2026-01-01T00:00".into(),
    };
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let key = key.clone();
            tokio::spawn(async move { store.quota_take(&key, 1, 9).await.unwrap() })
        })
        .collect();
    let mut granted = 0;
    for t in tasks {
        if t.await.unwrap().is_some() {
            granted += 1;
        }
    }
    assert_eq!(granted, 9);
    assert_eq!(a.quota_used(&key).await.unwrap(), 9);

    let tenant = keel_protocol::new_id("ten");
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let tenant = tenant.clone();
            tokio::spawn(async move {
                let run = keel_protocol::new_id("run");
                store.take_run_slot(&tenant, &run, 4).await.unwrap()
            })
        })
        .collect();
    let mut slots = 0;
    for t in tasks {
        if t.await.unwrap() {
            slots += 1;
        }
    }
    assert_eq!(slots, 4);
}
