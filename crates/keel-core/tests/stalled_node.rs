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
    Commit, Coordination, Event, EventKind, Notices, QueuedCommand, RunRecord, RunStatus,
    SingleNode, Store, StoreError,
};
use keel_test_support::harness::{TestRuntime, tool};
use keel_test_support::scripted::{ScriptedModel, Step, call_tools, reply_text};
use serde_json::{Value, json};

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
struct StallingNode {
    inner: SingleNode,
    stall_on: &'static str,
    phase: Mutex<Phase>,
}

impl StallingNode {
    fn phase(&self) -> Phase {
        *self.phase.lock().unwrap()
    }
}

#[async_trait::async_trait]
impl Coordination for StallingNode {
    fn node_id(&self) -> &str {
        "node-a"
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn lease(&self) -> Duration {
        LEASE
    }

    async fn acquire(&self, run_id: &str) -> Result<bool, StoreError> {
        self.inner.acquire(run_id).await
    }

    async fn renew(&self, run_ids: &[String]) -> Result<Vec<String>, StoreError> {
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

    async fn claim(&self, limit: u32) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.claim(limit).await
    }

    async fn release_all(&self) -> Result<(), StoreError> {
        self.inner.release_all().await
    }

    async fn owned_count(&self) -> Result<u64, StoreError> {
        self.inner.owned_count().await
    }

    async fn commit(&self, run_id: &str, commit: Commit) -> Result<Vec<Event>, StoreError> {
        if self.phase() == Phase::Lost {
            return Err(StoreError::LeaseLost(format!(
                "run {run_id}: another node took it over"
            )));
        }
        let starts_the_call = commit.events.iter().any(
            |e| matches!(e, EventKind::ToolCall { tool, .. } if tool.as_str() == self.stall_on),
        );
        let events = self.inner.commit(run_id, commit).await?;
        if starts_the_call {
            *self.phase.lock().unwrap() = Phase::Stalled;
            tokio::time::sleep(LEASE * 2).await;
            *self.phase.lock().unwrap() = Phase::Lost;
        }
        Ok(events)
    }

    async fn post_command(
        &self,
        run_id: &str,
        tenant: &str,
        body: &Value,
    ) -> Result<(), StoreError> {
        self.inner.post_command(run_id, tenant, body).await
    }

    async fn take_commands(&self) -> Result<Vec<QueuedCommand>, StoreError> {
        self.inner.take_commands().await
    }

    async fn listen(&self) -> Result<Box<dyn Notices>, StoreError> {
        self.inner.listen().await
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
    let phase = Arc::new(Mutex::new(None::<Arc<StallingNode>>));
    let seen = phase.clone();
    let rt = TestRuntime::builder(model)
        .tool(charge)
        .coordination(move |store: Arc<dyn Store>| {
            let node = Arc::new(StallingNode {
                inner: SingleNode::new(store),
                stall_on: "charge",
                phase: Mutex::new(Phase::Running),
            });
            *seen.lock().unwrap() = Some(node.clone());
            node
        })
        .build()
        .await;
    let node = phase.lock().unwrap().clone().unwrap();
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
