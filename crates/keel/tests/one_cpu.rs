//! keel with one CPU to use runs everything on one thread (tokio's
//! current-thread scheduler): runs, their streams, approvals and the
//! recovery after a crash must all work there as with a worker per CPU.
//! `TOKIO_WORKER_THREADS=1` asks for it on any machine, as a container
//! limited to one CPU or a process pinned to one gets it without asking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Env, KEY_ACME, Keel, assert_gap_free};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::sse::Frame;
use keel_test_support::tool_server::ToolServer;
use serde_json::json;

/// The server's environment with `TOKIO_WORKER_THREADS` set to `workers`.
fn with_workers(model: &FakeOpenAi, tools: &ToolServer, workers: &str) -> Env {
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.vars
        .push(("TOKIO_WORKER_THREADS".into(), workers.into()));
    // The runtime names its scheduler at start, at level info.
    env.log = "info".into();
    env
}

/// Starts keel on one thread, with API keys, against `script`.
async fn start_one_thread(script: Script) -> (FakeOpenAi, ToolServer, Keel) {
    let model = FakeOpenAi::start(script).await;
    let tools = ToolServer::start().await;
    let mut env = with_workers(&model, &tools, "1");
    env.auth = true;
    let keel = Keel::start(&env).await;
    assert_eq!(one_thread_starts(&keel), 1, "{}", keel.log());
    (model, tools, keel)
}

/// How many times the server's log (across restarts) says it started on
/// one thread.
fn one_thread_starts(keel: &Keel) -> usize {
    keel.log()
        .matches("async runtime: one thread (current-thread scheduler)")
        .count()
}

/// Approves the call `run_id` waits for, once it waits, and waits for the
/// run to complete; returns its record and events.
async fn approve_and_finish(keel: &Keel, run_id: &str) -> (serde_json::Value, Vec<Frame>) {
    let run = keel
        .wait_status(run_id, "waiting_approval", Some(KEY_ACME))
        .await;
    assert_eq!(run["pending"]["type"], "approval", "{run}");
    let aid = run["pending"]["approval_id"].as_str().unwrap().to_owned();
    let (code, list) = keel
        .get("/ai/approvals?status=pending", Some(KEY_ACME))
        .await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["approvals"][0]["id"], aid.as_str(), "{list}");
    let (code, decided) = keel
        .post(
            &format!("/ai/approvals/{aid}"),
            json!({"decision": "approve"}),
            Some(KEY_ACME),
        )
        .await;
    assert_eq!(code, 200, "{decided}");
    let run = keel.wait_status(run_id, "completed", Some(KEY_ACME)).await;
    let frames = keel.events(run_id, None, Some(KEY_ACME)).await;
    assert_gap_free(&frames, 1);
    assert_eq!(frames.last().unwrap().event, "run_completed");
    (run, frames)
}

#[tokio::test]
async fn one_thread_serves_tool_turns_approvals_and_streams() {
    let (model, tools, keel) = start_one_thread(Script::queue(vec![
        Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
        Reply::tool_call("shutdown_line", json!({"furnace_id": "F2"})),
        Reply::text("F1 runs; line F2 is shut down."),
    ]))
    .await;
    let id = keel
        .start_run("How is F1? Then shut line F2 down.", Some(KEY_ACME))
        .await;
    let (run, _) = approve_and_finish(&keel, &id).await;
    assert_eq!(run["output"], "F1 runs; line F2 is shut down.");
    assert_eq!(tools.count("furnace"), 1);
    assert_eq!(tools.count("restart"), 1, "the approved call ran once");
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn on_one_thread_a_run_awaiting_approval_survives_kill_9() {
    let (model, tools, mut keel) = start_one_thread(Script::queue(vec![
        Reply::tool_call("shutdown_line", json!({"furnace_id": "F2"})),
        Reply::text("Line F2 is shut down."),
    ]))
    .await;
    let id = keel.start_run("Shut line F2 down", Some(KEY_ACME)).await;
    keel.wait_status(&id, "waiting_approval", Some(KEY_ACME))
        .await;
    keel.kill9().await;
    keel.restart().await;
    assert_eq!(one_thread_starts(&keel), 2, "{}", keel.log());
    // Still waiting after the crash; the approval given now lets it finish.
    let (run, frames) = approve_and_finish(&keel, &id).await;
    assert_eq!(run["output"], "Line F2 is shut down.");
    assert_eq!(tools.count("restart"), 1, "the approved call ran once");
    assert_eq!(
        frames.iter().filter(|f| f.event == "run_started").count(),
        1
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn a_worker_count_that_is_not_a_number_is_named_in_the_error() {
    for bad in ["0", "two", "-1"] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("check")
            .env("TOKIO_WORKER_THREADS", bad)
            .env_remove("KEEL_CONFIG")
            .output()
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}: {err}");
        assert!(
            err.contains("TOKIO_WORKER_THREADS") && err.contains(&format!("`{bad}`")),
            "{bad}: {err}"
        );
    }
}

#[tokio::test]
async fn more_workers_use_the_work_stealing_scheduler() {
    let model = FakeOpenAi::start(Script::queue(vec![Reply::text("Hello.")])).await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&with_workers(&model, &tools, "3")).await;
    let id = keel.start_run("Hi", None).await;
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "Hello.");
    let log = keel.log();
    assert!(
        log.contains("async runtime: work-stealing scheduler") && log.contains("workers=3"),
        "{log}"
    );
    assert!(!log.contains("current-thread scheduler"), "{log}");
}
