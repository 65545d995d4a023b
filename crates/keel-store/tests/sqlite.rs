#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use keel_protocol::{Commit, EventKind, Message, RunPatch, RunStatus, Store, StoreError};
use keel_store::SqliteStore;
use keel_test_support::store_suite;

fn temp_store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("keel.db")).unwrap();
    (dir, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite() {
    let (_dir, store) = temp_store();
    store_suite::run_all(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_commits_are_gap_free() {
    let (_dir, store) = temp_store();
    let store: Arc<dyn Store> = Arc::new(store);
    store_suite::concurrent_commits_are_gap_free(&store, 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    // A nested path: open creates the directories.
    let path = dir.path().join("data").join("nested").join("keel.db");
    let (store, tenant, run) = open_with_a_run(&path).await;
    let events = store
        .commit(
            &run.id,
            Commit {
                calls: Vec::new(),
                approvals: Vec::new(),
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
                    ..RunPatch::default()
                }),
            },
        )
        .await
        .unwrap();
    let before = store.get_run(&tenant, &run.id).await.unwrap().unwrap();
    drop(store);

    let store = SqliteStore::open(&path).unwrap();
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
    let unfinished = store.unfinished_runs().await.unwrap();
    assert_eq!(unfinished.len(), 1);
    assert_eq!(unfinished[0].id, run.id);
    assert!(unfinished[0].principal.is_some());

    // Numbering continues after the reopen.
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
async fn opens_in_wal_mode_at_the_latest_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let store = SqliteStore::open(&path).unwrap();
    store.ping().await.unwrap();

    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SqliteStore::schema_version());
    drop(conn);
    drop(store);

    // Reopening does not reapply migrations.
    let store = SqliteStore::open(&path).unwrap();
    store.ping().await.unwrap();
}

#[test]
fn refuses_a_schema_newer_than_this_build() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    drop(SqliteStore::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", SqliteStore::schema_version() + 1)
        .unwrap();
    drop(conn);
    match SqliteStore::open(&path) {
        Err(StoreError::Backend(message)) => assert!(message.contains("newer"), "{message}"),
        Err(e) => panic!("unexpected error {e:?}"),
        Ok(_) => panic!("a newer schema must not be opened"),
    }
}

#[test]
fn refuses_a_path_that_is_not_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.db");
    std::fs::write(&path, vec![0x42u8; 8192]).unwrap();
    assert!(matches!(
        SqliteStore::open(&path),
        Err(StoreError::Backend(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_does_not_spoil_its_batch() {
    let (_dir, store) = temp_store();
    failed_requests_leave_their_neighbours_written(Arc::new(store)).await;
}

/// On a current-thread runtime the tasks that commit write the batches
/// themselves, with no writer thread; the same guarantees hold.
#[tokio::test(flavor = "current_thread")]
async fn on_one_thread_the_store_conforms() {
    let (_dir, store) = temp_store();
    store_suite::run_all(Arc::new(store)).await;
}

#[tokio::test(flavor = "current_thread")]
async fn on_one_thread_fifty_concurrent_commits_are_gap_free() {
    let (_dir, store) = temp_store();
    let store: Arc<dyn Store> = Arc::new(store);
    store_suite::concurrent_commits_are_gap_free(&store, 50).await;
}

#[tokio::test(flavor = "current_thread")]
async fn on_one_thread_a_failed_request_does_not_spoil_its_batch() {
    let (_dir, store) = temp_store();
    failed_requests_leave_their_neighbours_written(Arc::new(store)).await;
}

/// A caller that stops waiting for its commit (a cancelled run) once it
/// has started: the commit is written whole or not at all, and the store
/// numbers and takes the next one.
#[tokio::test(flavor = "current_thread")]
async fn on_one_thread_a_commit_its_caller_stopped_waiting_for_leaves_no_gap() {
    let (_dir, _path, store, _tenant, run) = store_with_a_run().await;
    let commit = |text: &str| Commit {
        events: vec![
            EventKind::MessageDelta { text: text.into() },
            EventKind::MessageDelta { text: text.into() },
        ],
        ..Commit::default()
    };
    // Polled once, the commit starts and yields; then its caller drops it.
    let mut abandoned = Box::pin(store.commit(&run.id, commit("abandoned")));
    let first = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::future::Future::poll(abandoned.as_mut(), cx))
    })
    .await;
    assert!(first.is_pending(), "{first:?}");
    drop(abandoned);
    // Were a request stranded, this one would wait forever.
    let next = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        store.commit(&run.id, commit("next")),
    )
    .await
    .expect("the store takes the next commit")
    .unwrap();
    let stored = store.events_after(&run.id, 0, 10).await.unwrap();
    assert_eq!(
        stored.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=stored.len() as u64).collect::<Vec<_>>()
    );
    assert!(matches!(stored.len(), 2 | 4), "{stored:?}");
    assert_eq!(stored[stored.len() - 2..], next[..]);
}

/// Writes made on one thread are on disk once the store is dropped.
#[tokio::test(flavor = "current_thread")]
async fn on_one_thread_commits_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let (store, _tenant, run) = open_with_a_run(&path).await;
    let store = Arc::new(store);
    let commits: Vec<_> = (0..20u32)
        .map(|i| {
            let store = Arc::clone(&store);
            let run_id = run.id.clone();
            tokio::spawn(async move {
                store
                    .commit(
                        &run_id,
                        Commit {
                            events: vec![EventKind::MessageDelta {
                                text: i.to_string(),
                            }],
                            messages: vec![Message::user(i.to_string())],
                            ..Commit::default()
                        },
                    )
                    .await
            })
        })
        .collect();
    for commit in commits {
        commit.await.unwrap().unwrap();
    }
    drop(store);
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.events_after(&run.id, 0, 100).await.unwrap().len(), 20);
    assert_eq!(store.history(&run.id).await.unwrap().len(), 20);
}

async fn failed_requests_leave_their_neighbours_written(store: Arc<SqliteStore>) {
    let tenant = keel_protocol::new_id("ten");
    let (run, _) = store
        .create_run(store_suite::new_run(&tenant, "s"))
        .await
        .unwrap();
    let taken = store_suite::approval(&run, "c0");
    store
        .commit(
            &run.id,
            Commit {
                approvals: vec![taken.clone()],
                ..Commit::default()
            },
        )
        .await
        .unwrap();
    // Good and bad commits raced so that they share transactions. Half of
    // the bad ones fail before writing (an unknown run), half after their
    // events and messages are written (an approval id that is taken): what
    // they wrote must be undone without undoing their neighbours.
    let mut handles = Vec::new();
    for i in 0..40u32 {
        let store = Arc::clone(&store);
        let mut commit = Commit {
            approvals: Vec::new(),
            events: vec![EventKind::MessageDelta {
                text: i.to_string(),
            }],
            messages: vec![Message::user(i.to_string())],
            patch: None,
            calls: Vec::new(),
        };
        let target = match i % 4 {
            1 => keel_protocol::new_id("run"),
            3 => {
                let mut clash = store_suite::approval(&run, &format!("c{i}"));
                clash.id = taken.id.clone();
                commit.approvals.push(clash);
                run.id.clone()
            }
            _ => run.id.clone(),
        };
        handles.push(tokio::spawn(async move {
            (i, store.commit(&target, commit).await)
        }));
    }
    for handle in handles {
        let (i, result) = handle.await.unwrap();
        match i % 4 {
            1 => assert!(matches!(result, Err(StoreError::NotFound)), "{result:?}"),
            3 => assert!(result.is_err(), "a taken approval id is refused"),
            _ => assert_eq!(result.unwrap().len(), 1),
        }
    }
    let events = store.events_after(&run.id, 0, 1000).await.unwrap();
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=20).collect::<Vec<_>>()
    );
    let texts: Vec<Option<u32>> = events
        .iter()
        .map(|e| match &e.kind {
            EventKind::MessageDelta { text } => text.parse().ok(),
            _ => None,
        })
        .collect();
    assert!(
        texts.iter().all(|i| i.is_some_and(|i| i % 2 == 0)),
        "{texts:?}"
    );
    assert_eq!(store.history(&run.id).await.unwrap().len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_5_database_keeps_its_messages_and_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let conn = database_at_version(&path, 5);
    conn.execute_batch(
        "INSERT INTO sessions VALUES ('t', 's', '2026-11-01T00:00:00Z'); \
         INSERT INTO runs (id, ord, tenant, session, agent, status, input, usage, metadata, \
           state, principal, created_at, updated_at) \
         VALUES ('run_old', 1, 't', 's', 'default', 'completed', 'hi', '{}', '{}', 'null', \
           '{\"tenant\":\"t\",\"subject\":\"u\"}', '2026-11-01T00:00:00Z', '2026-11-01T00:00:00Z');",
    )
    .unwrap();
    // Ids with a gap, as AUTOINCREMENT may leave after a rolled-back insert.
    for (id, text) in [(1, "first"), (2, "second"), (7, "third")] {
        let body = serde_json::to_string(&Message::user(text)).unwrap();
        conn.execute(
            "INSERT INTO messages (id, tenant, session, run_id, body) VALUES (?1, 't', 's', 'run_old', ?2)",
            rusqlite::params![id, body],
        )
        .unwrap();
    }
    drop(conn);

    let store = SqliteStore::open(&path).unwrap();
    let texts = old_runs_history_after(&store, [said("fourth")]).await;
    assert_eq!(
        texts,
        ["\"first\"", "\"second\"", "\"third\"", "\"fourth\""],
        "kept, in order, after the migration"
    );
    drop(store);

    let conn = rusqlite::Connection::open(&path).unwrap();
    let ids: Vec<i64> = conn
        .prepare("SELECT id FROM messages ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(ids, [1, 2, 7, 8]);
    let schema: String = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'messages'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(!schema.contains("AUTOINCREMENT"), "{schema}");
}

/// Events of a version 6 database, where they were keyed by run and
/// sequence number, are all there after the migration, in order, and the
/// run's next commit goes on from where they stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_6_database_keeps_its_events_and_their_order() {
    // Real event bodies, as a store writes them.
    let (_scratch, source) = temp_store();
    let tenant = keel_protocol::new_id("ten");
    let (run, _) = source
        .create_run(store_suite::new_run(&tenant, "s"))
        .await
        .unwrap();
    let texts = ["one", "two", "three"];
    for text in texts {
        let commit = Commit {
            events: vec![EventKind::MessageDelta { text: text.into() }],
            ..Commit::default()
        };
        source.commit(&run.id, commit).await.unwrap();
    }
    let written = source.events_after(&run.id, 0, 100).await.unwrap();
    assert_eq!(written.len(), 3);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let conn = database_at_version(&path, 6);
    conn.execute(
        "INSERT INTO sessions VALUES (?1, 's', '2026-11-01T00:00:00Z')",
        [&tenant],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO runs (id, ord, tenant, session, agent, status, input, usage, metadata, \
           state, principal, last_seq, created_at, updated_at) \
         VALUES (?1, 1, ?2, 's', 'default', 'running', 'hi', '{}', '{}', 'null', \
           '{\"tenant\":\"t\",\"subject\":\"u\"}', 3, '2026-11-01T00:00:00Z', \
           '2026-11-01T00:00:00Z')",
        [&run.id, &tenant],
    )
    .unwrap();
    // Written out of order: v6 kept them ordered by its key alone.
    for event in written.iter().rev() {
        conn.execute(
            "INSERT INTO events (run_id, seq, type, body, ts) \
             VALUES (?1, ?2, ?3, ?4, '2026-11-01T00:00:00Z')",
            rusqlite::params![
                run.id,
                event.seq as i64,
                event.type_name(),
                serde_json::to_string(event).unwrap()
            ],
        )
        .unwrap();
    }
    drop(conn);

    let store = SqliteStore::open(&path).unwrap();
    let kept = store.events_after(&run.id, 0, 100).await.unwrap();
    assert_eq!(
        kept.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3],
        "kept, in order, after the migration"
    );
    let next = Commit {
        events: vec![EventKind::MessageDelta {
            text: "four".into(),
        }],
        ..Commit::default()
    };
    let published = store.commit(&run.id, next).await.unwrap();
    assert_eq!(published[0].seq, 4);
    let tail = store.events_after(&run.id, 2, 100).await.unwrap();
    assert_eq!(tail.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4]);
    drop(store);

    // A run's sequence numbers stay unique.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let duplicate = conn.execute(
        "INSERT INTO events (run_id, seq, last_seq, body, ts) VALUES (?1, 4, 4, '{}', 'now')",
        [&run.id],
    );
    assert!(duplicate.is_err(), "a second event 4 was stored");
}

/// A tool turn's events are written as one row, and a cursor anywhere inside
/// that row resumes at the next event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_of_one_commit_are_one_row_read_from_any_point() {
    let (_dir, path, store, _tenant, run) = store_with_a_run().await;
    let deltas = |texts: &[&str]| Commit {
        events: texts
            .iter()
            .map(|t| EventKind::MessageDelta { text: (*t).into() })
            .collect(),
        ..Commit::default()
    };
    store
        .commit(&run.id, deltas(&["a", "b", "c", "d", "e", "f"]))
        .await
        .unwrap();
    store
        .commit(&run.id, deltas(&["g", "line\nbreak"]))
        .await
        .unwrap();
    let rows: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM events WHERE run_id = ?1",
            [&run.id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(rows, 2, "one row per commit");

    let seqs = |events: Vec<keel_protocol::Event>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(
        seqs(store.events_after(&run.id, 3, 2).await.unwrap()),
        [4, 5]
    );
    assert_eq!(
        seqs(store.events_after(&run.id, 5, 100).await.unwrap()),
        [6, 7, 8]
    );
    assert_eq!(seqs(store.events_after(&run.id, 6, 1).await.unwrap()), [7]);
    let last = store.events_after(&run.id, 7, 100).await.unwrap();
    assert!(
        matches!(&last[..], [e] if matches!(&e.kind, EventKind::MessageDelta { text } if text == "line\nbreak")),
        "a line break inside an event survives: {last:?}"
    );
}

/// Runs of a version 9 database that had not ended are still the ones a
/// restarted node resumes after the unfinished-runs index is rebuilt, in
/// creation order, and runs ending afterwards leave the list.
/// A tool turn's events are stored compressed, less than half their text;
/// rows an earlier version wrote as text are read beside them, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_events_are_stored_compressed_beside_rows_stored_as_text() {
    let (_dir, path, store, _tenant, run) = store_with_a_run().await;
    let output = format!(r#"{{"key":"k1","value":"{}"}}"#, "x".repeat(160));
    let turn = || Commit {
        events: vec![
            EventKind::ToolCall {
                step: 1,
                call_id: "call_1".into(),
                tool: "lookup".into(),
                arguments: serde_json::json!({"key": "k1"}),
            },
            EventKind::ToolResult {
                step: 1,
                call_id: "call_1".into(),
                tool: "lookup".into(),
                ok: true,
                duration_ms: 1,
                output: output.clone(),
                error: None,
            },
            EventKind::MessageDelta {
                text: "la\nst".into(),
            },
        ],
        ..Commit::default()
    };
    store.commit(&run.id, turn()).await.unwrap();
    let written = store.events_after(&run.id, 0, 100).await.unwrap();
    assert_eq!(written.len(), 3);

    let conn = rusqlite::Connection::open(&path).unwrap();
    let (kind, stored): (String, i64) = conn
        .query_row(
            "SELECT typeof(body), length(body) FROM events WHERE run_id = ?1",
            [&run.id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let text: usize = written.iter().map(|e| e.json().unwrap().len() + 1).sum();
    assert_eq!(kind, "blob");
    assert!(
        usize::try_from(stored).unwrap() * 2 < text,
        "{stored} bytes stored for {text} bytes of events"
    );

    // Events 4 to 6 as an earlier version stored them: text, one per line.
    let old_text = written
        .iter()
        .map(|e| {
            e.json().unwrap().replace(
                &format!(r#""seq":{}"#, e.seq),
                &format!(r#""seq":{}"#, e.seq + 3),
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    conn.execute(
        "INSERT INTO events (run_id, seq, last_seq, body, ts) VALUES (?1, 4, 6, ?2, '2026-01-01T00:00:00Z')",
        rusqlite::params![run.id, old_text],
    )
    .unwrap();
    conn.execute("UPDATE runs SET last_seq = 6 WHERE id = ?1", [&run.id])
        .unwrap();
    drop(conn);
    store.commit(&run.id, turn()).await.unwrap();

    let all = store.events_after(&run.id, 0, 100).await.unwrap();
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=9).collect::<Vec<_>>()
    );
    for (i, e) in all.iter().enumerate() {
        assert_eq!(e.kind, written[i % 3].kind, "event {}", e.seq);
    }
    // A cursor inside the text row, and inside the compressed one after it.
    let seqs = |events: Vec<keel_protocol::Event>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(
        seqs(store.events_after(&run.id, 4, 3).await.unwrap()),
        [5, 6, 7]
    );
    assert_eq!(
        seqs(store.events_after(&run.id, 7, 100).await.unwrap()),
        [8, 9]
    );
}

/// A tool turn's messages ride in its events row, compressed; a commit
/// with messages and no events writes a row of `messages`. Every read gives
/// them back one by one, in the order they were written, with the run that
/// wrote them, and archiving takes them from both places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_messages_ride_in_its_events_row_in_order_with_rows_of_their_own() {
    let (_dir, path, store, tenant, run) = store_with_a_run().await;
    let call = keel_protocol::ToolCall {
        id: "call_1".into(),
        name: "lookup".into(),
        arguments: r#"{"key":"k1"}"#.into(),
    };
    let output = format!(r#"{{"key":"k1","value":"{}"}}"#, "x".repeat(400));
    let tool_turn = |n: u32| Commit {
        events: vec![EventKind::MessageDelta {
            text: format!("turn {n}"),
        }],
        messages: vec![
            Message::Assistant {
                content: format!("turn {n}\nlooking it up"),
                tool_calls: vec![call.clone()],
            },
            Message::Tool {
                call_id: "call_1".into(),
                name: "lookup".into(),
                content: output.clone(),
                is_error: false,
            },
        ],
        ..Commit::default()
    };
    store.commit(&run.id, tool_turn(1)).await.unwrap();
    // Another run of the session writes between this run's turns.
    let (other, _) = store
        .create_run(store_suite::new_run(&tenant, "s"))
        .await
        .unwrap();
    store.commit(&other.id, tool_turn(9)).await.unwrap();
    store.commit(&run.id, said("in between")).await.unwrap();
    store.commit(&run.id, tool_turn(2)).await.unwrap();

    let conn = rusqlite::Connection::open(&path).unwrap();
    let stored: Vec<rusqlite::types::Value> = conn
        .prepare("SELECT messages FROM events WHERE run_id = ?1 ORDER BY id")
        .unwrap()
        .query_map([&run.id], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(
        stored.len() == 2
            && stored.iter().all(
                |v| matches!(v, rusqlite::types::Value::Blob(b) if b.len() > 4 && b[3] & 0x80 != 0)
            ),
        "both tool turns, compressed against their events rows' text (schema v13): {stored:?}"
    );
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        rows, 1,
        "only the commit without events has a row of its own"
    );
    drop(conn);

    let text = |messages: &[Message]| {
        messages
            .iter()
            .map(|m| serde_json::to_string(m).unwrap())
            .collect::<Vec<_>>()
    };
    let mut own = tool_turn(1).messages;
    own.push(Message::user("in between"));
    own.extend(tool_turn(2).messages);
    assert_eq!(text(&store.history(&run.id).await.unwrap()), text(&own));
    let mut others = own.clone();
    others.extend(tool_turn(9).messages);
    assert_eq!(
        text(&store.history(&other.id).await.unwrap()),
        text(&others),
        "an earlier run's messages, then the run's own"
    );
    let mut written = tool_turn(1).messages;
    written.extend(tool_turn(9).messages);
    written.push(Message::user("in between"));
    written.extend(tool_turn(2).messages);
    let listed = store.session_messages(&tenant, "s").await.unwrap().unwrap();
    let runs: Vec<&str> = listed.iter().map(|(id, _)| id.as_str()).collect();
    let (a, b) = (run.id.as_str(), other.id.as_str());
    assert_eq!(runs, [a, a, b, b, a, a, a]);
    let listed: Vec<Message> = listed.into_iter().map(|(_, m)| m).collect();
    assert_eq!(text(&listed), text(&written), "the session, as written");

    // The runs' ends let the session be archived, with every message.
    for id in [&run.id, &other.id] {
        store
            .commit(id, status_change(RunStatus::Completed))
            .await
            .unwrap();
    }
    let (key, archived) = store.archive_session(&tenant, "s").await.unwrap();
    let archived: Vec<Message> = archived.into_iter().map(|(_, m)| m).collect();
    assert_eq!(text(&archived), text(&written));
    let kept = store
        .session_messages(&tenant, &key)
        .await
        .unwrap()
        .unwrap();
    let kept: Vec<Message> = kept.into_iter().map(|(_, m)| m).collect();
    assert_eq!(
        text(&kept),
        text(&written),
        "the archive reads back in order"
    );
    assert_eq!(
        store.session_messages(&tenant, "s").await.unwrap(),
        Some(vec![])
    );
    let (later, _) = store
        .create_run(store_suite::new_run(&tenant, "s"))
        .await
        .unwrap();
    assert!(store.history(&later.id).await.unwrap().is_empty());
    let conn = rusqlite::Connection::open(&path).unwrap();
    let left: i64 = conn
        .query_row(
            "SELECT count(*) FROM events WHERE messages IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0, "no events row keeps an archived message");
}

/// Messages a version 11 database keeps in rows of `messages`, one commit's
/// to a row, come before those that later commits write, in both places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_11_database_keeps_its_messages_first_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let conn = database_with_a_running_run(&path, 11);
    let line = |text: &str| serde_json::to_string(&Message::user(text)).unwrap();
    for (seq, body) in [
        (1, format!("{}\n{}", line("first"), line("second"))),
        (2, line("third")),
    ] {
        conn.execute(
            "INSERT INTO events (run_id, seq, last_seq, body, ts) \
             VALUES ('run_old', ?1, ?1, ?2, '2026-11-01T00:00:00Z')",
            rusqlite::params![
                seq,
                format!(r#"{{"run_id":"run_old","seq":{seq},"ts":"2026-11-01T00:00:00Z","type":"message_delta","text":"t"}}"#)
            ],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO messages (tenant, session, run_id, body) VALUES ('t', 's', 'run_old', ?1)",
            [body],
        )
        .unwrap();
    }
    conn.execute("UPDATE runs SET last_seq = 2 WHERE id = 'run_old'", [])
        .unwrap();
    drop(conn);

    let store = SqliteStore::open(&path).unwrap();
    let texts = old_runs_history_after(&store, [turn(4, None), said("turn 5")]).await;
    assert_eq!(
        texts,
        [
            "\"first\"",
            "\"second\"",
            "\"third\"",
            "\"turn 4\"",
            "\"turn 5\""
        ]
    );
    let events = store.events_after("run_old", 0, 10).await.unwrap();
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3],
        "the old events rows read as before"
    );
}

/// Messages a version 12 database keeps in its events rows, compressed
/// on their own or as text, read as before beside the ones compressed
/// against their events since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_12_database_reads_its_messages_as_they_were_stored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let conn = database_with_a_running_run(&path, 12);
    let line = |text: &str| serde_json::to_string(&Message::user(text)).unwrap();
    let packed = lz4_flex::block::compress_prepend_size(
        format!("{}\n{}", line(&"first ".repeat(100)), line("second")).as_bytes(),
    );
    for (seq, messages) in [
        (1, rusqlite::types::Value::Blob(packed)),
        (2, rusqlite::types::Value::Text(line("third"))),
    ] {
        conn.execute(
            "INSERT INTO events (run_id, seq, last_seq, body, ts, messages) \
             VALUES ('run_old', ?1, ?1, ?2, '2026-11-01T00:00:00Z', ?3)",
            rusqlite::params![
                seq,
                format!(r#"{{"run_id":"run_old","seq":{seq},"ts":"2026-11-01T00:00:00Z","type":"message_delta","text":"t"}}"#),
                messages
            ],
        )
        .unwrap();
    }
    conn.execute("UPDATE runs SET last_seq = 2 WHERE id = 'run_old'", [])
        .unwrap();
    drop(conn);

    let store = SqliteStore::open(&path).unwrap();
    let long = "turn 3 ".repeat(100);
    let tool_turn = Commit {
        events: vec![EventKind::MessageDelta { text: long.clone() }],
        ..said(&long)
    };
    let texts = old_runs_history_after(&store, [tool_turn]).await;
    assert_eq!(
        texts,
        [
            format!("{:?}", "first ".repeat(100)),
            "\"second\"".to_owned(),
            "\"third\"".to_owned(),
            format!("{long:?}"),
        ]
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    let newest: Vec<u8> = conn
        .query_row(
            "SELECT messages FROM events ORDER BY id DESC LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_ne!(newest[3] & 0x80, 0, "the new row's, against its events");
}

/// Call records a version 10 database keeps in `run_calls` stay readable
/// beside the ones later commits store in their events rows, and their
/// places stay taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_10_database_keeps_its_call_records_and_their_places() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let conn = database_with_a_running_run(&path, 10);
    let call = |n: u64| keel_protocol::StoredCall {
        n,
        record: format!(r#"{{"tool":"lookup","call":"c{n}"}}"#),
    };
    for n in 1..=3 {
        conn.execute(
            "INSERT INTO run_calls (run_id, n, record) VALUES ('run_old', ?1, ?2)",
            rusqlite::params![n as i64, call(n).record],
        )
        .unwrap();
    }
    drop(conn);

    let store = SqliteStore::open(&path).unwrap();
    let turn = |calls: Vec<keel_protocol::StoredCall>| Commit {
        events: vec![EventKind::MessageDelta {
            text: "turn".into(),
        }],
        calls,
        ..Commit::default()
    };
    store
        .commit("run_old", turn(vec![call(4), call(5)]))
        .await
        .unwrap();
    let e = store
        .commit("run_old", turn(vec![call(3)]))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("place 3"), "{e}");
    store.commit("run_old", turn(vec![call(6)])).await.unwrap();
    assert_eq!(
        store.call_records("run_old", 10).await.unwrap(),
        (1..=6).map(call).collect::<Vec<_>>()
    );
    assert_eq!(
        store.call_records("run_old", 4).await.unwrap(),
        (3..=6).map(call).collect::<Vec<_>>()
    );
    assert!(store.call_records("run_old", 0).await.unwrap().is_empty());
    // The refused commit wrote nothing: two events rows, no new table rows.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let rows: Vec<(i64, Option<String>)> = conn
        .prepare("SELECT last_seq, calls FROM events WHERE run_id = 'run_old' ORDER BY last_seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        rows,
        [
            (
                1,
                Some(format!("4 {}\n5 {}", call(4).record, call(5).record))
            ),
            (2, Some(format!("6 {}", call(6).record))),
        ]
    );
    let table: i64 = conn
        .query_row("SELECT count(*) FROM run_calls", [], |r| r.get(0))
        .unwrap();
    assert_eq!(table, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_9_database_keeps_its_unfinished_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let conn = database_at_version(&path, 9);
    conn.execute_batch("INSERT INTO sessions VALUES ('t', 's', '2026-11-01T00:00:00Z');")
        .unwrap();
    let usage = serde_json::to_string(&keel_protocol::Usage::default()).unwrap();
    let principal = serde_json::to_string(&store_suite::new_run("t", "s").principal).unwrap();
    let statuses = [
        "completed",
        "running",
        "failed",
        "waiting_approval",
        "cancelled",
        "queued",
        "waiting_input",
    ];
    for (ord, status) in statuses.iter().enumerate() {
        conn.execute(
            "INSERT INTO runs (id, ord, tenant, session, agent, status, input, usage, metadata, \
               state, principal, created_at, updated_at) \
             VALUES (?1, ?2, 't', 's', 'default', ?3, 'hi', ?4, '{}', 'null', ?5, \
               '2026-11-01T00:00:00Z', '2026-11-01T00:00:00Z')",
            rusqlite::params![
                format!("run_{ord}"),
                ord as i64 + 1,
                status,
                usage,
                principal
            ],
        )
        .unwrap();
    }
    drop(conn);

    let store = SqliteStore::open(&path).unwrap();
    let unfinished = |runs: Vec<keel_protocol::RunRecord>| -> Vec<String> {
        runs.into_iter().map(|r| r.id).collect()
    };
    assert_eq!(
        unfinished(store.unfinished_runs().await.unwrap()),
        ["run_1", "run_3", "run_5", "run_6"]
    );

    // A run that ends leaves the index; one that starts enters it.
    store
        .commit("run_3", status_change(RunStatus::Cancelled))
        .await
        .unwrap();
    let (fresh, _) = store
        .create_run(store_suite::new_run("t", "s"))
        .await
        .unwrap();
    assert_eq!(
        unfinished(store.unfinished_runs().await.unwrap()),
        ["run_1", "run_5", "run_6", fresh.id.as_str()]
    );
    drop(store);

    let conn = rusqlite::Connection::open(&path).unwrap();
    let index: String = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'runs_unfinished'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(!index.contains(" IN "), "{index}");
}

/// A database file at schema `version`, as a build of that version left it.
fn database_at_version(path: &std::path::Path, version: usize) -> rusqlite::Connection {
    const MIGRATIONS: [&str; 12] = [
        include_str!("../migrations/sqlite/0001_init.sql"),
        include_str!("../migrations/sqlite/0002_approvals.sql"),
        include_str!("../migrations/sqlite/0003_leases.sql"),
        include_str!("../migrations/sqlite/0004_channel_messages.sql"),
        include_str!("../migrations/sqlite/0005_quotas.sql"),
        include_str!("../migrations/sqlite/0006_message_ids.sql"),
        include_str!("../migrations/sqlite/0007_events_appended.sql"),
        include_str!("../migrations/sqlite/0008_run_calls.sql"),
        include_str!("../migrations/sqlite/0009_event_batches.sql"),
        include_str!("../migrations/sqlite/0010_unfinished_without_in_list.sql"),
        include_str!("../migrations/sqlite/0011_rows_per_commit.sql"),
        include_str!("../migrations/sqlite/0012_messages_in_events.sql"),
    ];
    let conn = rusqlite::Connection::open(path).unwrap();
    for sql in &MIGRATIONS[..version] {
        conn.execute_batch(sql).unwrap();
    }
    conn.pragma_update(None, "user_version", version as i64)
        .unwrap();
    conn
}

/// A database file at schema `version` holding one running run, `run_old`,
/// of tenant `t` in session `s`.
fn database_with_a_running_run(path: &std::path::Path, version: usize) -> rusqlite::Connection {
    let conn = database_at_version(path, version);
    let usage = serde_json::to_string(&keel_protocol::Usage::default()).unwrap();
    let principal = serde_json::to_string(&store_suite::new_run("t", "s").principal).unwrap();
    conn.execute_batch("INSERT INTO sessions VALUES ('t', 's', '2026-11-01T00:00:00Z');")
        .unwrap();
    conn.execute(
        "INSERT INTO runs (id, ord, tenant, session, agent, status, input, usage, metadata, \
           state, principal, created_at, updated_at) \
         VALUES ('run_old', 1, 't', 's', 'default', 'running', 'hi', ?1, '{}', 'null', ?2, \
           '2026-11-01T00:00:00Z', '2026-11-01T00:00:00Z')",
        rusqlite::params![usage, principal],
    )
    .unwrap();
    conn
}

/// A commit of one message from the user.
fn said(text: &str) -> Commit {
    Commit {
        messages: vec![Message::user(text)],
        ..Commit::default()
    }
}

/// Makes `commits` to the old database's run, then reads its history's
/// contents (`contents`).
async fn old_runs_history_after<const N: usize>(
    store: &SqliteStore,
    commits: [Commit; N],
) -> Vec<String> {
    for commit in commits {
        store.commit("run_old", commit).await.unwrap();
    }
    contents(&store.history("run_old").await.unwrap())
}

/// Each message's `content`, as JSON.
fn contents(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .map(|m| serde_json::to_value(m).unwrap()["content"].to_string())
        .collect()
}

/// A store in a temporary directory, with the database's path and one run.
async fn store_with_a_run() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    SqliteStore,
    String,
    keel_protocol::RunRecord,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let (store, tenant, run) = open_with_a_run(&path).await;
    (dir, path, store, tenant, run)
}

/// Opens (creating it) the store at `path` and starts a run of a new tenant there.
async fn open_with_a_run(
    path: &std::path::Path,
) -> (SqliteStore, String, keel_protocol::RunRecord) {
    let store = SqliteStore::open(path).unwrap();
    let tenant = keel_protocol::new_id("ten");
    let (run, _) = store
        .create_run(store_suite::new_run(&tenant, "s"))
        .await
        .unwrap();
    (store, tenant, run)
}

/// A commit that only moves its run to `status`.
fn status_change(status: RunStatus) -> Commit {
    Commit {
        patch: Some(RunPatch {
            status: Some(status),
            ..RunPatch::default()
        }),
        ..Commit::default()
    }
}

/// The commit of turn `i`: a delta and a message, and the run's state when given.
fn turn(i: u32, state: Option<String>) -> Commit {
    Commit {
        events: vec![EventKind::MessageDelta {
            text: format!("turn {i}"),
        }],
        messages: vec![Message::user(format!("turn {i}"))],
        patch: state.map(|state| RunPatch {
            state: Some(state),
            ..RunPatch::default()
        }),
        ..Commit::default()
    }
}

/// A steady stream of commits, each rewriting a run's 6 KB state as a tool
/// turn does, writes about 25 times the WAL's restart size in all; with
/// checkpoints that only ever copy, the WAL grew by all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_starts_over_under_a_steady_stream_of_commits() {
    let (dir, _path, store, tenant, run) = store_with_a_run().await;
    let wal = dir.path().join("keel.db-wal");
    let mut largest = 0;
    for i in 0..4_000u32 {
        let state = serde_json::json!({ "turn": i, "pad": "x".repeat(6_000) }).to_string();
        store.commit(&run.id, turn(i, Some(state))).await.unwrap();
        largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
    }
    // The restart size is 4,096 frames (of 2 KiB pages, 4 KiB in a file
    // made with SQLite's default); the loop writes some 80 MB of frames.
    let bound = 3 * 4_096 * 4_120;
    assert!(
        largest < bound,
        "the WAL reached {largest} bytes (bound {bound})"
    );
    let last = store.get_run(&tenant, &run.id).await.unwrap().unwrap();
    assert_eq!(last.state["turn"], 3_999);
    assert_eq!(store.history(&run.id).await.unwrap().len(), 4_000);
}

/// A store opens with its WAL written ahead, to the length at which the
/// checkpoint makes it start over, so that its first commits write over
/// blocks the file has. Files copied while the store runs are what a
/// process killed at that moment leaves on disk: committed frames in the
/// WAL, not yet in the database. Opening the copy must fold those frames
/// in before anything is written over them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_is_written_ahead_without_losing_a_killed_process_commits() {
    let (dir, path, store, tenant, run) = store_with_a_run().await;
    let wal = dir.path().join("keel.db-wal");
    let ahead = std::fs::metadata(&wal).unwrap().len();
    assert!(
        ahead >= 4_096 * (24 + 2_048),
        "the WAL holds {ahead} bytes after opening"
    );
    for i in 0..50u32 {
        store.commit(&run.id, turn(i, None)).await.unwrap();
    }
    // Every commit so far sits in the WAL (the checkpoint thread may have
    // copied some of it), and the file did not grow past what was written ahead.
    assert_eq!(std::fs::metadata(&wal).unwrap().len(), ahead);

    let history = store.history(&run.id).await.unwrap();
    let before = store.get_run(&tenant, &run.id).await.unwrap().unwrap();
    assert!(history.ends_with(&[Message::user("turn 49")]));

    let copy = tempfile::tempdir().unwrap();
    let copied = copy.path().join("keel.db");
    std::fs::copy(&path, &copied).unwrap();
    std::fs::copy(&wal, copy.path().join("keel.db-wal")).unwrap();
    drop(store);

    let reopened = SqliteStore::open(&copied).unwrap();
    assert_eq!(reopened.history(&run.id).await.unwrap(), history);
    let after = reopened.get_run(&tenant, &run.id).await.unwrap().unwrap();
    assert_eq!(after.last_seq, before.last_seq);
    let events = reopened.events_after(&run.id, 0, 1_000).await.unwrap();
    assert_eq!(events.len() as u64, before.last_seq);
    assert!(
        std::fs::metadata(copy.path().join("keel.db-wal"))
            .unwrap()
            .len()
            >= ahead
    );
}

/// While another connection (a checkpoint, another process) holds the
/// database's write lock, a commit waits for it off the caller's thread:
/// on a single-threaded runtime, other tasks still run meanwhile.
#[tokio::test(flavor = "current_thread")]
async fn a_commit_waiting_for_the_write_lock_does_not_hold_up_its_thread() {
    let (_dir, path, store, _tenant, run) = store_with_a_run().await;

    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(400));
        other.execute_batch("COMMIT").unwrap();
    });
    let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let ticker = tokio::spawn({
        let ticks = Arc::clone(&ticks);
        async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    let events = store
        .commit(
            &run.id,
            Commit {
                events: vec![EventKind::MessageDelta {
                    text: "after the lock".into(),
                }],
                ..Commit::default()
            },
        )
        .await
        .unwrap();
    ticker.abort();
    holder.join().unwrap();
    assert_eq!(events.len(), 1);
    let ticked = ticks.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        ticked >= 5,
        "other tasks ran {ticked} times while the commit waited"
    );
    assert_eq!(store.events_after(&run.id, 0, 10).await.unwrap(), events);
}

/// A new file gets keel's smaller pages; a file made with SQLite's default
/// 4 KiB pages (by an earlier keel) keeps them, migrates and takes commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_files_get_small_pages_and_older_files_keep_theirs() {
    let page_size = |path: &std::path::Path| -> i64 {
        rusqlite::Connection::open(path)
            .unwrap()
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .unwrap()
    };
    let (dir, path, store, _tenant, _run) = store_with_a_run().await;
    drop(store);
    assert_eq!(page_size(&path), 2048);

    let older = dir.path().join("older.db");
    rusqlite::Connection::open(&older)
        .unwrap()
        .execute_batch(
            "PRAGMA page_size = 4096; CREATE TABLE made_before (x); DROP TABLE made_before;",
        )
        .unwrap();
    let (store, _tenant, run) = open_with_a_run(&older).await;
    let events = store
        .commit(
            &run.id,
            Commit {
                events: vec![EventKind::MessageDelta {
                    text: "in an older file".into(),
                }],
                messages: vec![Message::user("in an older file")],
                ..Commit::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(store.events_after(&run.id, 0, 10).await.unwrap(), events);
    assert_eq!(store.history(&run.id).await.unwrap().len(), 1);
    drop(store);
    assert_eq!(page_size(&older), 4096);
}
