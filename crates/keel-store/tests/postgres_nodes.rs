#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Run ownership across nodes over a real PostgreSQL (`PgNode`): leases
//! fence writes, expired leases are claimed, mailboxes reach only the
//! owner, and commits are announced. Each test has a database of its own
//! (`KEEL_TEST_PG_URL`, an admin URL, default
//! `postgres://postgres@127.0.0.1:5432/postgres`).

use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::PgConnection;

use keel_protocol::{
    Commit, Coordination, EventKind, Notice, RunPatch, RunStatus, Store, StoreError,
};
use keel_store::{PgNode, PostgresStore};
use keel_test_support::store_suite;

const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

struct TestDb {
    admin: String,
    name: String,
    url: String,
}

impl TestDb {
    async fn create() -> Self {
        let admin =
            std::env::var("KEEL_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_ADMIN_URL.to_owned());
        let name = keel_protocol::new_id("keel_nodes");
        let mut conn = PgConnection::connect(&admin).await.unwrap_or_else(|e| {
            panic!("PostgreSQL is required and not reachable at {admin} ({e})")
        });
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        let (base, _) = admin.rsplit_once('/').unwrap();
        let url = format!("{base}/{name}");
        Self { admin, name, url }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut conn = PgConnection::connect(&admin).await?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                )))
                .execute(&mut conn)
                .await?;
                conn.close().await
            })
        });
        if !matches!(cleanup.join(), Ok(Ok(()))) {
            eprintln!("could not drop test database {}", self.name);
        }
    }
}

fn event(text: &str) -> Commit {
    Commit {
        events: vec![EventKind::MessageDelta { text: text.into() }],
        ..Commit::default()
    }
}

async fn setup(lease: Duration) -> (TestDb, Arc<dyn Store>, PgNode, PgNode) {
    let db = TestDb::create().await;
    let store = PostgresStore::connect(&db.url).await.unwrap();
    let a = store.node("node-a", lease);
    let b = store.node("node-b", lease);
    (db, Arc::new(store), a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_fences_writes_until_it_expires_and_is_claimed() {
    let (_db, store, a, b) = setup(Duration::from_millis(800)).await;
    let run = store_suite::create(&store, "t", "s").await;
    assert!(a.acquire(&run.id).await.unwrap());
    assert!(
        !b.acquire(&run.id).await.unwrap(),
        "a live lease is exclusive"
    );
    a.commit(&run.id, event("a1")).await.unwrap();
    assert!(matches!(
        b.commit(&run.id, event("b1")).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert!(b.claim(10).await.unwrap().is_empty(), "not expired yet");
    assert_eq!(a.owned_count().await.unwrap(), 1);

    tokio::time::sleep(Duration::from_millis(1000)).await;
    // Expired: a's writes are refused even before anyone claims the run.
    assert!(matches!(
        a.commit(&run.id, event("a2")).await,
        Err(StoreError::LeaseLost(_))
    ));
    let claimed = b.claim(10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, run.id);
    assert_eq!(claimed[0].last_seq, 1, "resumes from what was persisted");
    assert!(b.claim(10).await.unwrap().is_empty(), "claimed once");
    assert!(
        a.renew(std::slice::from_ref(&run.id))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        b.renew(std::slice::from_ref(&run.id)).await.unwrap(),
        vec![run.id.clone()]
    );
    b.commit(&run.id, event("b2")).await.unwrap();
    let seqs: Vec<u64> = store
        .events_after(&run.id, 0, 10)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, [1, 2], "only the owners' commits, gap-free");

    // A terminal commit gives the run up: nothing left to claim or renew.
    let end = Commit {
        events: vec![EventKind::RunCancelled { by: "x".into() }],
        patch: Some(RunPatch {
            status: Some(RunStatus::Cancelled),
            ..RunPatch::default()
        }),
        ..Commit::default()
    };
    b.commit(&run.id, end).await.unwrap();
    assert_eq!(b.owned_count().await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(a.claim(10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_keeps_numbering_right_after_its_run_was_written_past_it() {
    let (_db, store, a, _b) = setup(Duration::from_secs(30)).await;
    let run = store_suite::create(&store, "t", "s").await;
    assert!(a.acquire(&run.id).await.unwrap());
    a.commit(&run.id, event("a1")).await.unwrap();
    a.commit(&run.id, event("a2")).await.unwrap();
    // Written by someone else while the node holds the run: the node's
    // next commit must number after it, and write its messages once.
    store.commit(&run.id, event("other")).await.unwrap();
    let written = a
        .commit(
            &run.id,
            Commit {
                events: vec![
                    EventKind::MessageDelta { text: "a3".into() },
                    EventKind::MessageDelta { text: "a4".into() },
                ],
                messages: vec![keel_protocol::Message::user("once")],
                patch: Some(RunPatch {
                    steps: Some(3),
                    ..RunPatch::default()
                }),
                ..Commit::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(written.iter().map(|e| e.seq).collect::<Vec<_>>(), [4, 5]);
    a.commit(&run.id, event("a5")).await.unwrap();

    let texts: Vec<(u64, String)> = store
        .events_after(&run.id, 0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| match e.kind {
            EventKind::MessageDelta { text } => (e.seq, text),
            other => panic!("unexpected event {other:?}"),
        })
        .collect();
    let expected = [
        (1, "a1"),
        (2, "a2"),
        (3, "other"),
        (4, "a3"),
        (5, "a4"),
        (6, "a5"),
    ];
    assert_eq!(
        texts,
        expected.map(|(seq, text)| (seq, text.to_owned())).to_vec()
    );
    let stored = store.get_run("t", &run.id).await.unwrap().unwrap();
    assert_eq!((stored.last_seq, stored.steps), (6, 3));
    assert_eq!(store.history(&run.id).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unowned_runs_wait_one_lease_and_released_runs_move_at_once() {
    let (_db, store, a, b) = setup(Duration::from_millis(600)).await;
    let unowned = store_suite::create(&store, "t", "s").await;
    assert!(
        a.claim(10).await.unwrap().is_empty(),
        "its creator may take it"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    let claimed = a.claim(10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, unowned.id);

    let released = store_suite::create(&store, "t", "s2").await;
    assert!(a.acquire(&released.id).await.unwrap());
    a.release_all().await.unwrap();
    let ids: Vec<String> = b
        .claim(10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids.len(), 2, "both of a's runs move to b at once: {ids:?}");
    assert_eq!(a.owned_count().await.unwrap(), 0);
    assert_eq!(b.owned_count().await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_reach_only_the_owner_and_commits_are_announced() {
    let (_db, store, a, b) = setup(Duration::from_secs(30)).await;
    let run = store_suite::create(&store, "t", "s").await;
    assert!(b.acquire(&run.id).await.unwrap());
    let mut notices = a.listen().await.unwrap();

    let body = serde_json::json!({"type": "input", "text": "F2"});
    assert!(matches!(
        a.post_command(&run.id, "other-tenant", &body).await,
        Err(StoreError::NotFound)
    ));
    a.post_command(&run.id, "t", &body).await.unwrap();
    let notice = tokio::time::timeout(Duration::from_secs(5), notices.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        notice,
        Notice::Command {
            run_id: run.id.clone(),
            owner: Some("node-b".into())
        }
    );
    assert!(a.take_commands().await.unwrap().is_empty(), "not a's run");
    let taken = b.take_commands().await.unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].run_id, run.id);
    assert_eq!(taken[0].tenant, "t");
    assert_eq!(taken[0].body, body);
    assert!(b.take_commands().await.unwrap().is_empty(), "taken once");

    let events = b
        .commit(
            &run.id,
            Commit {
                events: vec![
                    EventKind::MessageDelta { text: "x".into() },
                    EventKind::MessageDelta { text: "y".into() },
                ],
                ..Commit::default()
            },
        )
        .await
        .unwrap();
    let notice = tokio::time::timeout(Duration::from_secs(5), notices.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        notice,
        Notice::Events {
            run_id: run.id.clone(),
            first: events[0].seq,
            last: events[1].seq
        }
    );
    // A refused commit announces nothing.
    assert!(a.commit(&run.id, event("z")).await.is_err());
    b.commit(&run.id, event("w")).await.unwrap();
    let notice = tokio::time::timeout(Duration::from_secs(5), notices.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            notice,
            Notice::Events {
                first: 3,
                last: 3,
                ..
            }
        ),
        "{notice:?}"
    );
}
