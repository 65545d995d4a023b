//! What one tool turn writes, and when. A turn whose first call is
//! idempotent and quick is stored in one commit: plan, decision, call and
//! result together. A call whose start must be on record before it runs
//! (not idempotent, or later in a turn whose plan is already stored) gets
//! its own commit first. A slow idempotent call still shows in the stream
//! while it runs. A turn stored in one commit is written behind the run:
//! the model is asked again while it is written, and the run's next write
//! waits for it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_protocol::{Commit, Coordination, Event, EventKind, SingleNode, Store, StoreError};
use keel_test_support::harness::{TestRuntime, async_tool, tool};
use keel_test_support::node::{HookedNode, Membership, NodeHooks};
use keel_test_support::scripted::{
    Gate, ScriptedModel, Step, call_tool, call_tools, reply_text, when_open,
};
use serde_json::{Value, json};

/// Records the event types of every commit the node writes.
struct Recording {
    commits: Commits,
    results: Results,
}

/// What the node does with a commit that holds a `tool_result`.
#[derive(Clone)]
enum Results {
    Write,
    /// Writes it once the gate opens.
    WaitFor(Gate),
    /// Refuses it, as a node refuses a run another node took over.
    Refuse,
}

#[async_trait::async_trait]
impl NodeHooks for Recording {
    async fn commit(
        &self,
        node: &SingleNode,
        run_id: &str,
        commit: Commit,
    ) -> Result<Vec<Event>, StoreError> {
        let has_result = commit
            .events
            .iter()
            .any(|e| matches!(e, EventKind::ToolResult { .. }));
        match &self.results {
            Results::WaitFor(gate) if has_result => gate.wait().await,
            Results::Refuse if has_result => {
                return Err(StoreError::LeaseLost(format!(
                    "run {run_id}: another node took it over"
                )));
            }
            _ => {}
        }
        let events = node.commit(run_id, commit).await?;
        self.commits
            .lock()
            .unwrap()
            .push(events.iter().map(Event::type_name).collect());
        Ok(events)
    }
}

type Commits = Arc<Mutex<Vec<Vec<&'static str>>>>;

/// A runtime over a node that records its commits.
async fn recorded(
    model: ScriptedModel,
    tools: Vec<keel_test_support::harness::TestTool>,
) -> (TestRuntime, Commits) {
    recorded_with(model, tools, Results::Write).await
}

async fn recorded_with(
    model: ScriptedModel,
    tools: Vec<keel_test_support::harness::TestTool>,
    results: Results,
) -> (TestRuntime, Commits) {
    let commits: Commits = Arc::default();
    let seen = commits.clone();
    let mut builder = TestRuntime::builder(model).coordination(move |store: Arc<dyn Store>| {
        let hooks = Recording {
            commits: seen,
            results: results.clone(),
        };
        Arc::new(HookedNode::new(store, Membership::Single, Arc::new(hooks)))
    });
    for t in tools {
        builder = builder.tool(t);
    }
    (builder.build().await, commits)
}

/// The recorded commits that hold a `tool_call` event.
fn commits_with_calls(commits: &Commits) -> Vec<Vec<&'static str>> {
    commits
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.contains(&"tool_call"))
        .cloned()
        .collect()
}

fn furnace_status() -> keel_test_support::harness::TestTool {
    tool(
        "furnace_status",
        json!({"type": "object", "properties": {"furnace_id": {"type": "string"}}, "required": ["furnace_id"]}),
        |args| json!({"furnace": args["furnace_id"], "state": "running"}),
    )
    .idempotent(true)
}

/// `furnace_history`, idempotent: each call answers once the gate that
/// `gate_for` picks for its arguments opens.
fn gated_history(
    gate_for: impl Fn(&Value) -> Gate + Send + Sync + 'static,
) -> keel_test_support::harness::TestTool {
    async_tool(
        "furnace_history",
        json!({"type": "object", "properties": {"furnace_id": {"type": "string"}}, "required": ["furnace_id"]}),
        move |args: Value, _ctx| {
            let gate = gate_for(&args);
            async move {
                gate.wait().await;
                json!({"furnace": args["furnace_id"], "batches": 12})
            }
        },
    )
    .idempotent(true)
}

fn restart_furnace() -> keel_test_support::harness::TestTool {
    tool(
        "restart_furnace",
        json!({"type": "object", "properties": {"furnace_id": {"type": "string"}}, "required": ["furnace_id"]}),
        |args| json!({"restarted": args["furnace_id"]}),
    )
}

#[tokio::test]
async fn each_turn_of_quick_idempotent_calls_is_stored_whole_in_one_commit() {
    let (rt, commits) = recorded(three_status_turns(), vec![furnace_status()]).await;
    let run = rt.start("How are F1, F2 and F3?").await;
    let done = rt.wait_terminal(&run).await;
    assert_eq!(done.output.as_deref(), Some("All three are running."));
    assert_eq!(rt.tool_calls_executed("furnace_status"), 3);
    // A turn made while the one before is still being written is stored
    // with the next commit (`turns_waiting_behind_a_slow_write_…`), so a
    // commit holds one or more turns; a turn is never split across two.
    let commits = commits_with_calls(&commits);
    let turns: Vec<&[&str]> = commits
        .iter()
        .flat_map(|commit| {
            assert_eq!(commit.first(), Some(&"react_plan"), "{commits:?}");
            commit.chunk_by(|_, next| *next != "react_plan")
        })
        .collect();
    assert_eq!(turns.len(), 3, "every turn stored, once: {commits:?}");
    for turn in &turns {
        // The result's checks (`verify`) follow it in the same commit.
        assert!(
            turn.starts_with(&["react_plan", "policy_decision", "tool_call", "tool_result"]),
            "the turn's plan, decision, call and result are stored together: {turn:?}"
        );
    }
    rt.model().assert_clean();
}

#[tokio::test]
async fn a_call_that_is_not_idempotent_is_on_record_before_it_runs() {
    let model = ScriptedModel::new::<Step>([
        call_tool("restart_furnace", json!({"furnace_id": "F1"})).into(),
        reply_text("F1 restarted.").into(),
    ]);
    let (rt, commits) = recorded(model, vec![restart_furnace()]).await;
    let run = rt.start("Restart F1").await;
    rt.wait_terminal(&run).await;
    assert_eq!(rt.tool_calls_executed("restart_furnace"), 1);
    let starts = commits_with_calls(&commits);
    assert_eq!(
        starts,
        vec![vec!["react_plan", "policy_decision", "tool_call"]],
        "the start is stored alone, before the result"
    );
    rt.model().assert_clean();
}

#[tokio::test]
async fn a_later_call_of_a_stored_turn_is_on_record_before_it_runs() {
    // The first call's commit stores the turn's plan; from then on a crash
    // resumes mid-turn, and a started call must be on record to be rerun.
    let model = ScriptedModel::new::<Step>([
        call_tools([
            ("furnace_status", json!({"furnace_id": "F1"})),
            ("furnace_status", json!({"furnace_id": "F2"})),
        ])
        .into(),
        reply_text("Both are running.").into(),
    ]);
    let (rt, commits) = recorded(model, vec![furnace_status()]).await;
    let run = rt.start("How are F1 and F2?").await;
    rt.wait_terminal(&run).await;
    let starts = commits_with_calls(&commits);
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert!(
        starts[0].starts_with(&["react_plan", "policy_decision", "tool_call", "tool_result"]),
        "the first call rides with the plan: {starts:?}"
    );
    assert_eq!(
        starts[1],
        ["policy_decision", "tool_call"],
        "the second is stored as started, alone"
    );
    rt.model().assert_clean();
}

#[tokio::test]
async fn a_slow_idempotent_call_shows_in_the_stream_while_it_runs() {
    let gate = Gate::new();
    let release = gate.clone();
    let slow = gated_history(move |_| gate.clone());
    let model = ScriptedModel::new::<Step>([
        call_tool("furnace_history", json!({"furnace_id": "F1"})).into(),
        reply_text("F1 ran 12 batches.").into(),
    ]);
    let (rt, commits) = recorded(model, vec![slow]).await;
    let run = rt.start("What did F1 do this week?").await;
    // The tool answers only once the stream has shown its call: held
    // until its result, the call would never show, and this wait fails.
    let call = rt.wait_event(&run, "tool_call").await;
    assert!(matches!(call.kind, EventKind::ToolCall { ref tool, .. } if tool == "furnace_history"));
    release.open();
    let done = rt.wait_terminal(&run).await;
    assert_eq!(done.output.as_deref(), Some("F1 ran 12 batches."));
    assert_eq!(
        commits_with_calls(&commits),
        vec![vec!["react_plan", "policy_decision", "tool_call"]],
        "announced on its own while it ran"
    );
    rt.model().assert_clean();
}

#[tokio::test]
async fn each_slow_call_shows_while_it_runs_and_a_quick_one_between_does_not() {
    // A slow call, a quick one, a slow one: each slow call is announced
    // on its own while it runs, and the quick one between them, though
    // it follows a call whose announcement came due, is stored with its
    // result.
    let (first, second) = (Gate::new(), Gate::new());
    let gates = [("F2", first.clone()), ("F3", second.clone())];
    let slow = gated_history(move |args| {
        gates
            .iter()
            .find(|(id, _)| args["furnace_id"] == *id)
            .map(|(_, gate)| gate.clone())
            .expect("a gate for each slow furnace")
    });
    let model = ScriptedModel::new::<Step>([
        call_tool("furnace_history", json!({"furnace_id": "F2"})).into(),
        call_tool("furnace_status", json!({"furnace_id": "F1"})).into(),
        call_tool("furnace_history", json!({"furnace_id": "F3"})).into(),
        reply_text("F2 and F3 ran 12 batches each.").into(),
    ]);
    // Quick, but not done when first asked, as a tool over the network.
    let quick = async_tool(
        "furnace_status",
        json!({"type": "object", "properties": {"furnace_id": {"type": "string"}}, "required": ["furnace_id"]}),
        |args: Value, _ctx| async move {
            tokio::task::yield_now().await;
            json!({"furnace": args["furnace_id"], "state": "running"})
        },
    )
    .idempotent(true);
    let (rt, commits) = recorded(model, vec![quick, slow]).await;
    let run = rt.start("What did F2 and F3 do this week?").await;
    // Each slow call answers only once the stream has shown it.
    for (shown, gate) in [(1, &first), (3, &second)] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while rt.events_of(&run, "tool_call").await.len() < shown {
            assert!(
                tokio::time::Instant::now() < deadline,
                "slow call {shown} never shown while it ran; events: {:?}",
                rt.event_types(&run).await
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        gate.open();
    }
    let done = rt.wait_terminal(&run).await;
    assert_eq!(
        done.output.as_deref(),
        Some("F2 and F3 ran 12 batches each.")
    );
    let with_calls = commits_with_calls(&commits);
    let announced = with_calls
        .iter()
        .filter(|c| !c.contains(&"tool_result"))
        .count();
    assert_eq!(
        (with_calls.len(), announced),
        (3, 2),
        "the quick call stored with its result, each slow one announced alone: {with_calls:?}"
    );
    rt.model().assert_clean();
}

/// A runtime with the status tool whose commits with a tool result wait
/// until the returned gate opens.
async fn gated(model: ScriptedModel) -> (TestRuntime, Commits, Gate) {
    let writes = Gate::new();
    let (rt, commits) = recorded_with(
        model,
        vec![furnace_status()],
        Results::WaitFor(writes.clone()),
    )
    .await;
    (rt, commits, writes)
}

/// Three turns of one idempotent call each, then the answer.
fn three_status_turns() -> ScriptedModel {
    ScriptedModel::new::<Step>([
        call_tool("furnace_status", json!({"furnace_id": "F1"})).into(),
        call_tool("furnace_status", json!({"furnace_id": "F2"})).into(),
        call_tool("furnace_status", json!({"furnace_id": "F3"})).into(),
        reply_text("All three are running.").into(),
    ])
}

/// Two turns of one idempotent call each, then the answer.
fn two_status_turns() -> ScriptedModel {
    ScriptedModel::new::<Step>([
        call_tool("furnace_status", json!({"furnace_id": "F1"})).into(),
        call_tool("furnace_status", json!({"furnace_id": "F2"})).into(),
        reply_text("Both are running.").into(),
    ])
}

/// Waits until the model has been asked `n` times; its `n`th request.
async fn nth_request(rt: &TestRuntime, n: usize, what: &str) -> keel_protocol::ModelRequest {
    rt.wait_until(what, || rt.model().request_count() >= n)
        .await;
    rt.model().request(n - 1).unwrap()
}

#[tokio::test]
async fn the_model_is_asked_again_while_earlier_turns_are_written() {
    let (rt, commits, writes) = gated(two_status_turns()).await;
    let run = rt.start("How are F1 and F2?").await;
    // The first turn's commit cannot finish before the gate opens; the
    // model is asked again anyway, with the turn's result.
    let second = nth_request(&rt, 2, "the model is asked a second time").await;
    let results = keel_test_support::scripted::tool_messages(&second);
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(results[0].1.contains("F1"), "{results:?}");
    // The second turn waits behind the first without holding the run up:
    // the model is asked for its answer with both results.
    let third = nth_request(&rt, 3, "the model is asked a third time").await;
    let results = keel_test_support::scripted::tool_messages(&third);
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[1].1.contains("F2"), "{results:?}");
    // Nothing of either turn is published before it is stored, and the
    // answer is not stored, nor the run ended, before both turns are.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(rt.event_types(&run).await, ["run_started"]);
    assert_eq!(rt.model().request_count(), 3);
    assert!(!rt.run(&run).await.status.is_terminal());
    writes.open();
    let done = rt.wait_terminal(&run).await;
    assert_eq!(done.output.as_deref(), Some("Both are running."));
    let turns = commits_with_calls(&commits);
    assert_eq!(
        turns.len(),
        2,
        "the first turn, then the one queued behind it: {turns:?}"
    );
    let types = rt.event_types(&run).await;
    let plans = types.iter().filter(|t| **t == "react_plan").count();
    assert_eq!(plans, 2, "{types:?}");
    assert_eq!(types.last(), Some(&"run_completed"), "{types:?}");
    rt.model().assert_clean();
}

#[tokio::test]
async fn turns_waiting_behind_a_slow_write_are_stored_in_one_commit() {
    let (rt, commits, writes) = gated(three_status_turns()).await;
    let run = rt.start("How are F1, F2 and F3?").await;
    rt.wait_until("the model is asked for its answer", || {
        rt.model().request_count() >= 4
    })
    .await;
    writes.open();
    let done = rt.wait_terminal(&run).await;
    assert_eq!(done.output.as_deref(), Some("All three are running."));
    let turns = commits_with_calls(&commits);
    let calls: Vec<usize> = turns
        .iter()
        .map(|c| c.iter().filter(|t| **t == "tool_call").count())
        .collect();
    assert_eq!(
        calls,
        [1, 2],
        "the first turn alone, then the two that waited behind it: {turns:?}"
    );
    let types = rt.event_types(&run).await;
    let results = types.iter().filter(|t| **t == "tool_result").count();
    assert_eq!(results, 3, "{types:?}");
    assert_eq!(types.last(), Some(&"run_completed"), "{types:?}");
    rt.model().assert_clean();
}

#[tokio::test]
async fn a_turn_refused_behind_the_run_stops_it() {
    let model = two_status_turns();
    let (rt, _commits) = recorded_with(model, vec![furnace_status()], Results::Refuse).await;
    let run = rt.start("How are F1 and F2?").await;
    rt.wait_until("the first tool call ran", || {
        rt.tool_calls_executed("furnace_status") >= 1
    })
    .await;
    // Time for a run that ignored the refusal to go on to its answer.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The refusal stops the run at its next write at the latest: it never
    // asks for the answer, and it stores nothing of either turn, leaving
    // the run as it was for the node that took it over.
    assert!(
        rt.model().request_count() <= 2,
        "{}",
        rt.model().request_count()
    );
    assert!(rt.tool_calls_executed("furnace_status") <= 2);
    assert_eq!(rt.event_types(&run).await, ["run_started"]);
    assert_eq!(rt.run(&run).await.status, keel_protocol::RunStatus::Running);
}

/// A new run's loop state is on record from its first commit, with the
/// client tools the run declared, while the model has not yet answered: a
/// node that takes the run over from there still hands their calls back.
#[tokio::test]
async fn a_new_runs_first_commit_stores_its_loop_state() {
    let answer = Gate::new();
    let model = ScriptedModel::new::<Step>([when_open(&answer, reply_text("Gate 3 stays shut."))]);
    let rt = TestRuntime::builder(model).build().await;
    let principal = rt.principal().clone();
    let gate_tool = keel_protocol::ToolSchema {
        name: "open_gate".into(),
        description: "Open a gate of the yard, done by the client".into(),
        parameters: Arc::new(json!({
            "type": "object",
            "properties": {"gate": {"type": "integer"}},
            "required": ["gate"]
        })),
    };
    let run = rt
        .start_as(
            &principal,
            keel_core::StartRun {
                input: "Open gate 3".into(),
                client_tools: vec![gate_tool],
                ..Default::default()
            },
        )
        .await;
    rt.wait_event(&run, "run_started").await;
    let state = rt.run(&run).await.state;
    assert_eq!(state["client_tools"][0]["name"], "open_gate", "{state}");
    assert_eq!(state["course"]["goals"], json!(["Open gate 3"]), "{state}");
    answer.open();
    let done = rt.wait_terminal(&run).await;
    assert_eq!(done.output.as_deref(), Some("Gate 3 stays shut."));
    rt.model().assert_clean();
}
