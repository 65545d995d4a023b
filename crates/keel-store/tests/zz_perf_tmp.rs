#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::sync::Arc;
use std::time::Instant;
use keel_protocol::*;
use keel_store::SqliteStore;
use keel_test_support::store_suite;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perf() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("k.db")).unwrap());
    let (run, _) = store.create_run(store_suite::new_run("t", "s")).await.unwrap();
    let n = 5000;
    let t = Instant::now();
    for i in 0..n {
        store.commit(&run.id, Commit {
            events: vec![EventKind::MessageDelta{text: format!("{i}")}, EventKind::ToolCall{step: 1, call_id: "c".into(), tool: "x".into(), arguments: serde_json::json!({"a": i})}],
            messages: vec![Message::user("hello there"), Message::user("and more")],
            patch: Some(RunPatch{steps: Some(i), ..Default::default()}),
        }).await.unwrap();
    }
    eprintln!("sequential commit: {:?}/op", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n { store.get_run("t", &run.id).await.unwrap(); }
    eprintln!("get_run: {:?}/op", t.elapsed() / n);
    let t = Instant::now();
    for i in 0..1000 { store.events_after(&run.id, i * 5, 10).await.unwrap(); }
    eprintln!("events_after(10): {:?}/op", t.elapsed() / 1000);
    let t = Instant::now();
    for _ in 0..1000 { store.create_run(store_suite::new_run("t", "s2")).await.unwrap(); }
    eprintln!("create_run: {:?}/op", t.elapsed() / 1000);
    // concurrent: 64 tasks x 500 commits to separate runs
    let mut runs = vec![];
    for _ in 0..64 { runs.push(store.create_run(store_suite::new_run("t", "s3")).await.unwrap().0.id); }
    let t = Instant::now();
    let mut hs = vec![];
    for id in runs { let s = store.clone(); hs.push(tokio::spawn(async move { for i in 0..500u32 { s.commit(&id, Commit{events: vec![EventKind::MessageDelta{text: format!("{i}")}], messages: vec![], patch: Some(RunPatch{steps: Some(i), ..Default::default()})}).await.unwrap(); } })); }
    for h in hs { h.await.unwrap(); }
    eprintln!("concurrent 64x500 commits: {:?} total, {:?}/commit", t.elapsed(), t.elapsed() / 32000);
}
