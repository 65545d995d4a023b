//! Resuming a run that was `running` when its node stopped.
//!
//! Calls of the last turn that never started are processed normally. A call
//! that started but has no result is re-run only if its tool is idempotent;
//! otherwise the model is told its outcome is unknown.

use std::collections::HashSet;

use keel_protocol::{EventKind, ToolCall};

use super::{Exit, RunActor, synthetic_result};
use crate::guard_pipeline::parse_arguments;

impl RunActor {
    pub(super) async fn recover(&mut self) -> Result<(), Exit> {
        let open = self.unanswered_calls();
        if open.is_empty() {
            return Ok(());
        }
        let started = self.started_call_ids().await?;
        tracing::info!(run = %self.run_id, open = open.len(), "resuming run after restart");
        for call in open {
            if !started.contains(&call.id) {
                // Never executed: it may simply run now (through the whole pipeline).
                self.skip_or_rerun_unstarted(&call).await?;
                continue;
            }
            let idempotent = self
                .shared
                .tools()
                .get(&call.name)
                .is_some_and(|t| t.spec.idempotent);
            if idempotent {
                let args = parse_arguments(&call.arguments).unwrap_or_default();
                self.execute(&call, args, Vec::new()).await?;
            } else {
                let detail = format!(
                    "the outcome of `{}` is unknown: the server stopped while it ran, and it was not re-run \
                     because the tool is not idempotent",
                    call.name
                );
                let event = EventKind::ToolResult {
                    step: self.steps,
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    ok: false,
                    duration_ms: 0,
                    output: String::new(),
                    error: Some(detail.clone()),
                };
                let result = synthetic_result(
                    &call,
                    format!("Error: {detail}. Check its effect before calling it again."),
                );
                self.commit(vec![event], vec![result]).await?;
            }
        }
        Ok(())
    }

    async fn skip_or_rerun_unstarted(&mut self, call: &ToolCall) -> Result<(), Exit> {
        // Re-deciding a call means re-running the guards, which may ask the user;
        // a clean, observable choice is to hand it back to the model instead.
        let result = synthetic_result(
            call,
            "Not executed: the server restarted before this call ran. Call it again if it is still needed.",
        );
        self.commit(Vec::new(), vec![result]).await
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
