//! Resuming a run that was `running` when its node stopped.
//!
//! The calls of the last turn that have no result go through the guard
//! pipeline again, in order. A call that never started is judged like a
//! new one. A call that had started was authorized then: it is run again
//! only if its tool is idempotent; otherwise the pipeline gives the model
//! an unknown outcome.

use std::collections::HashSet;

use keel_protocol::EventKind;

use super::apply::CallFlow;
use super::{Answer, Exit, RunActor};
use crate::pipeline::Origin;

impl RunActor {
    /// `Some` when a recovered call ended the run with an answer.
    pub(super) async fn recover(&mut self) -> Result<Option<Answer>, Exit> {
        let open = self.unanswered_calls();
        if open.is_empty() {
            return Ok(None);
        }
        let started = self.started_call_ids().await?;
        tracing::info!(run = %self.run_id, open = open.len(), "resuming run after restart");
        let snapshot = self.snapshot();
        for (i, call) in open.iter().enumerate() {
            let origin = Origin::Recovered {
                started: started.contains(&call.id),
            };
            match self
                .decide(call, &snapshot, origin, &Default::default())
                .await?
            {
                CallFlow::Next => {}
                CallFlow::Wait => {
                    self.skip_calls(
                        &open[i + 1..],
                        "not executed: the run is waiting for the user's answer",
                    )
                    .await?;
                    self.flush_notes().await?;
                    self.enter_waiting().await?;
                    return Ok(None);
                }
                CallFlow::WaitApproval => {
                    self.skip_calls(
                        &open[i + 1..],
                        "not executed: the run is waiting for an approval",
                    )
                    .await?;
                    self.flush_notes().await?;
                    return Ok(None);
                }
                CallFlow::Done(answer) => return Ok(Some(answer)),
            }
        }
        self.flush_notes().await?;
        if !self.state.client_waiting.is_empty() {
            self.enter_client_wait().await?;
        }
        Ok(None)
    }

    async fn started_call_ids(&self) -> Result<HashSet<String>, Exit> {
        let mut ids = HashSet::new();
        let mut after = 0;
        loop {
            let batch = self
                .shared
                .store
                .events_after(&self.run_id, after, 1000)
                .await?;
            let Some(last) = batch.last() else {
                break;
            };
            after = last.seq;
            for e in &batch {
                if let EventKind::ToolCall { call_id, .. } = &e.kind {
                    ids.insert(call_id.clone());
                }
            }
        }
        Ok(ids)
    }
}
