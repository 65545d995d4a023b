//! Human approval (SPEC §4.7): the run stops in `waiting_approval` until a
//! person decides, from any node, or the approval expires (a denial). The
//! decision is persisted before the run acts on it, so a restart in between
//! changes nothing.

use std::time::Duration;

use keel_protocol::{
    ApprovalRecord, ApprovalStatus, EventKind, FeedbackCode, Risk, RunPatch, RunStatus, StoreError,
    ToolCall,
};
use serde_json::Value;

use super::{Exit, Flow, RunActor, synthetic_result};
use crate::outbound::Outgoing;
use crate::pipeline::Origin;
use crate::runtime::Command;
use crate::state::AwaitingApproval;

/// How often a waiting run re-reads its approval, in case it was decided
/// through another process.
const POLL: Duration = Duration::from_secs(2);

impl RunActor {
    /// Persists a pending approval and moves the run to `waiting_approval`.
    /// `events` announce the decision (`policy_decision approve`).
    pub(super) async fn request_approval(
        &mut self,
        call: &ToolCall,
        args: Value,
        risk: Risk,
        reason: String,
        mut events: Vec<EventKind>,
    ) -> Result<(), Exit> {
        let now = keel_protocol::now();
        let timeout = chrono::Duration::from_std(self.shared.options.approval_timeout)
            .unwrap_or_else(|_| chrono::Duration::hours(1));
        let record = ApprovalRecord {
            id: keel_protocol::new_id("apr"),
            tenant: self.principal.tenant.clone(),
            run_id: self.run_id.clone(),
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments: args.clone(),
            risk,
            reason: reason.clone(),
            status: ApprovalStatus::Pending,
            decided_by: None,
            decision_reason: None,
            created_at: now,
            decided_at: None,
            expires_at: now + timeout,
        };
        let awaiting = AwaitingApproval {
            approval_id: record.id.clone(),
            step: self.steps,
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments: args.clone(),
            expires_at: record.expires_at,
        };
        let pending = awaiting.pending(risk, &reason);
        self.state.awaiting_approval = Some(awaiting);
        let request = Outgoing::Approval {
            approval_id: record.id.clone(),
            tool: call.name.clone(),
            arguments: args.clone(),
            risk,
            reason: reason.clone(),
        };
        events.push(EventKind::ApprovalRequired {
            approval_id: record.id.clone(),
            tool: call.name.clone(),
            arguments: args,
            risk,
            reason,
        });
        self.status = RunStatus::WaitingApproval;
        let patch = RunPatch {
            status: Some(RunStatus::WaitingApproval),
            pending: Some(Some(pending)),
            ..RunPatch::default()
        };
        self.commit_with(events, Vec::new(), patch, vec![record])
            .await?;
        // The approvers' chat gets the request with buttons; a click decides
        // the same persisted approval as the API and the console.
        let sent = self.deliver(request).await;
        if !sent.is_empty() {
            self.commit(sent, Vec::new()).await?;
        }
        Ok(())
    }

    /// Waits until the approval is decided (here, on another node, or by expiry).
    pub(super) async fn wait_for_approval(
        &mut self,
        a: &AwaitingApproval,
    ) -> Result<ApprovalRecord, Exit> {
        let since = tokio::time::Instant::now();
        let record = loop {
            if let Some(r) = self.read_approval(&a.approval_id).await?
                && r.status != ApprovalStatus::Pending
            {
                break r;
            }
            let until_expiry = (a.expires_at - keel_protocol::now())
                .to_std()
                .unwrap_or(Duration::ZERO);
            if until_expiry.is_zero() {
                break self.expire(&a.approval_id).await?;
            }
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(Exit::Cancelled),
                cmd = self.commands.recv() => match cmd {
                    // Decided: the loop re-reads the stored decision.
                    Some(Command::ApprovalDecided) => {}
                    Some(other) => self.accept(other),
                    None => return Err(Exit::Detached),
                },
                _ = tokio::time::sleep(POLL.min(until_expiry)) => {}
            }
        };
        let waited = since.elapsed();
        self.state.waited_s += waited.as_secs_f64();
        self.started += waited;
        Ok(record)
    }

    async fn read_approval(&self, id: &str) -> Result<Option<ApprovalRecord>, Exit> {
        Ok(self
            .shared
            .store
            .get_approval(&self.principal.tenant, id)
            .await?)
    }

    async fn expire(&self, id: &str) -> Result<ApprovalRecord, Exit> {
        let tenant = &self.principal.tenant;
        match self
            .shared
            .store
            .decide_approval(
                tenant,
                id,
                ApprovalStatus::Expired,
                "timeout",
                "no decision before the approval expired",
            )
            .await
        {
            Ok(r) => Ok(r),
            // Decided by someone just now: that decision stands.
            Err(StoreError::Conflict(_)) => self
                .read_approval(id)
                .await?
                .ok_or(Exit::Store(StoreError::NotFound)),
            Err(e) => Err(e.into()),
        }
    }

    /// Acts on a decided approval: runs the exact approved call, or tells the model it was refused.
    pub(super) async fn resolve_approval(
        &mut self,
        a: AwaitingApproval,
        record: ApprovalRecord,
    ) -> Result<Flow, Exit> {
        self.state.awaiting_approval = None;
        let decision = match record.status {
            ApprovalStatus::Approved => "approve",
            _ => "deny",
        };
        let by = record.decided_by.clone().unwrap_or_default();
        let reason = record.decision_reason.clone().unwrap_or_default();
        let resolved = EventKind::ApprovalResolved {
            approval_id: record.id.clone(),
            decision: decision.into(),
            by: by.clone(),
            reason: reason.clone(),
        };
        self.commit_status(vec![resolved], Vec::new(), RunStatus::Running, None)
            .await?;
        let call = ToolCall {
            id: a.call_id.clone(),
            name: a.tool.clone(),
            arguments: a.arguments.to_string(),
        };
        if record.status == ApprovalStatus::Approved {
            // The approved call passes the pipeline again: the tool set or
            // the budgets may have changed while it waited, and denials
            // still apply. The approval satisfies the approval stage.
            let snapshot = self.snapshot();
            let flow = self
                .decide(&call, &snapshot, Origin::Approved, &Default::default())
                .await?;
            return self.settle(flow).await;
        } else {
            let why = if record.status == ApprovalStatus::Expired {
                "the approval expired without a decision".to_owned()
            } else if reason.is_empty() {
                format!("denied by {by}")
            } else {
                format!("denied by {by}: {reason}")
            };
            let feedback = EventKind::ReactFeedback {
                step: self.steps,
                code: FeedbackCode::ApprovalDenied,
                detail: why.clone(),
            };
            let result = synthetic_result(
                &call,
                format!(
                    "Not executed: a person did not approve this call ({why}). Do not retry it; tell the user."
                ),
            );
            self.commit(vec![feedback], vec![result]).await?;
        }
        Ok(Flow::Continue)
    }
}
