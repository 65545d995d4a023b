//! A node that stalls (SIGSTOP, a VM paused, a long GC) right after it
//! recorded a tool call as started, past its lease, while another node takes
//! the run over. The store fences its commits, but a tool call is a side
//! effect outside the store: the woken node must not start it.
//!
//! The node's coordination here is a stand-in that owns the run like a
//! cluster node would and then loses it while the node is stalled, so the
//! moment of the stall is exact (the three-node tests in the `keel` crate
//! pause real processes, at moments they cannot choose this precisely).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_protocol::{
    Commit, Coordination, Event, EventKind, RunStatus, SingleNode, Store, StoreError,
};
use keel_test_support::harness::{TestRuntime, tool};
use keel_test_support::node::{HookedNode, Membership, NodeHooks};
use keel_test_support::scripted::{ScriptedModel, Step, call_tools, reply_text};
use serde_json::json;

const LEASE: Duration = Duration::from_millis(600);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Owns its runs; renewals succeed.
    Running,
    /// The process is stopped: nothing it started returns.
    Stalled,
    /// Woke up; another node owns the run now.
    Lost,
}

/// A cluster node over the test's store that stalls for twice its lease
/// right after committing the start of a call of `stall_on`, and has lost
/// its runs when it wakes.
struct Stalling {
    stall_on: &'static str,
    phase: Mutex<Phase>,
}

impl Stalling {
    fn phase(&self) -> Phase {
        *self.phase.lock().unwrap()
    }
}

#[async_trait::async_trait]
impl NodeHooks for Stalling {
    async fn renew(
        &self,
        _node: &SingleNode,
        run_ids: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let sent_while_stalled = self.phase() == Phase::Stalled;
        while self.phase() == Phase::Stalled {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A renewal sent before the takeover still went through; one sent
        // after it finds the run gone.
        if self.phase() == Phase::Lost && !sent_while_stalled {
            return Ok(Vec::new());
        }
        Ok(run_ids.to_vec())
    }

    async fn commit(
        &self,
        node: &SingleNode,
        run_id: &str,
        commit: Commit,
    ) -> Result<Vec<Event>, StoreError> {
        if self.phase() == Phase::Lost {
            return Err(StoreError::LeaseLost(format!(
                "run {run_id}: another node took it over"
            )));
        }
        let starts_the_call = commit.events.iter().any(
            |e| matches!(e, EventKind::ToolCall { tool, .. } if tool.as_str() == self.stall_on),
        );
        let events = node.commit(run_id, commit).await?;
        if starts_the_call {
            *self.phase.lock().unwrap() = Phase::Stalled;
            tokio::time::sleep(LEASE * 2).await;
            *self.phase.lock().unwrap() = Phase::Lost;
        }
        Ok(events)
    }
}

#[tokio::test]
async fn a_node_that_wakes_past_its_lease_starts_no_tool_call() {
    let model = ScriptedModel::new::<Step>([
        call_tools([("charge", json!({"account": "K-1", "amount": 120}))]).into(),
        reply_text("charged").into(),
    ]);
    let charge = tool(
        "charge",
        json!({"type": "object", "properties": {"account": {"type": "string"}, "amount": {"type": "number"}}}),
        |args| json!({"charged": args["account"]}),
    );
    let node = Arc::new(Stalling {
        stall_on: "charge",
        phase: Mutex::new(Phase::Running),
    });
    let hooks = node.clone();
    let rt = TestRuntime::builder(model)
        .tool(charge)
        .coordination(move |store: Arc<dyn Store>| {
            let membership = Membership::Shared {
                node_id: "node-a".into(),
                lease: LEASE,
            };
            Arc::new(HookedNode::new(store, membership, hooks))
        })
        .build()
        .await;
    let run = rt.start("Charge account K-1 120 EUR").await;
    // The start of the call was committed before the stall.
    rt.wait_event(&run, "tool_call").await;
    rt.wait_until("the node woke up without its run", || {
        node.phase() == Phase::Lost
    })
    .await;
    // Long enough for the woken actor to have called the tool, had it not
    // checked its lease first.
    tokio::time::sleep(LEASE).await;
    assert_eq!(
        rt.tool_calls_executed("charge"),
        0,
        "the woken node started a call for a run it no longer owns"
    );
    // It wrote nothing more either: the run is as the stall left it, for
    // its new owner to resume.
    let types = rt.event_types(&run).await;
    assert_eq!(types.last(), Some(&"tool_call"), "{types:?}");
    assert_eq!(rt.run(&run).await.status, RunStatus::Running);
}
