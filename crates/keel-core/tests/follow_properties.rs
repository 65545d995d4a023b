//! Following a run (what the SSE endpoint streams, resuming after
//! `Last-Event-ID`): from any seq, at any point of the run, every later
//! event arrives exactly once and in order, up to the terminal one, while
//! the run keeps committing and publishing live.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::plant;
use keel_core::follow::follow;
use keel_protocol::RunStatus;
use keel_test_support::scripted::{Gate, ScriptedModel, Step, call_tool, reply_text, when_open};
use proptest::prelude::*;
use serde_json::json;

/// A run of `calls` tool calls and an answer, held before model turn
/// `pause` until the gate opens.
fn script(calls: usize, pause: usize, gate: &Gate) -> ScriptedModel {
    let mut steps: Vec<Step> = (0..calls)
        .map(|i| call_tool("furnace_status", json!({"furnace_id": format!("F{i}")})).into())
        .collect();
    steps.push(reply_text("All furnaces are running.").into());
    let held = steps.remove(pause);
    steps.insert(pause, when_open(gate, held));
    ScriptedModel::new(steps).streaming(true)
}

/// With `racing`, the run goes on while the follower subscribes and reads
/// the backlog, so live events and stored ones overlap.
async fn check(calls: usize, pause: usize, at: f64, racing: bool) {
    let gate = Gate::new();
    let rt = plant(script(calls, pause, &gate)).build().await;
    let id = rt.start("How are the furnaces?").await;
    rt.wait_until("the model reaches the held turn", || {
        rt.model().request_count() > pause
    })
    .await;
    // Resume from anywhere in what is stored so far.
    let stored = rt.run(&id).await.last_seq;
    let after = (stored as f64 * at).floor() as u64;
    if racing {
        gate.open();
    }
    let mut rx = follow(rt.runtime().clone(), id.clone(), after);
    gate.open();
    let mut seqs = Vec::new();
    let mut followed = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
        seqs.push(e.seq);
        followed.push((*e).clone());
    }
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    let expected: Vec<u64> = (after + 1..=run.last_seq).collect();
    assert_eq!(seqs, expected, "followed from {after} of {stored}");
    let all = rt.events(&id).await;
    assert_eq!(followed, all[after as usize..].to_vec());
    assert!(followed.last().is_some_and(|e| e.is_terminal()));
    rt.finish();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn following_from_any_seq_gives_every_later_event_once(
        calls in 0usize..4,
        pause in 0usize..4,
        at in 0.0f64..=1.0,
        racing in any::<bool>(),
    ) {
        let pause = pause.min(calls);
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(check(calls, pause, at, racing));
    }
}
