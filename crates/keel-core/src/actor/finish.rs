//! How a run ends besides a model answer: answered without tools (fallback
//! or budget), failed, or cancelled. Each ending closes every open tool
//! call first.

use keel_protocol::{
    Budget, CompletionReason, Decision, ErrorBody, EventKind, FeedbackCode, RunPatch, RunStatus,
};

use super::{Answer, Exit, RunActor, synthetic_result};
use crate::prompt;

/// Time allowed for the closing tool-less call after the wall-time budget ran out.
const CLOSING_CALL_SECS: u64 = 60;

impl RunActor {
    /// One model call with no tools offered; its text is the answer.
    pub(super) async fn answer_without_tools(
        &mut self,
        fallback_rule: Option<&str>,
        note: &str,
        reason: CompletionReason,
    ) -> Result<Answer, Exit> {
        self.close_unanswered("not executed: the run is answering without tools")
            .await?;
        if let Some(rule) = fallback_rule {
            let decision = EventKind::PolicyDecision {
                step: self.steps,
                decision: Decision::Fallback,
                reason: "answering directly without tools".into(),
                rule: rule.into(),
                call_id: None,
            };
            self.commit(vec![decision], Vec::new()).await?;
        }
        let mut request = self.request_from_view(Vec::new(), Some(note));
        prompt::fit(
            &mut request,
            usize::try_from(self.agent.config.limits.max_context_chars).unwrap_or(usize::MAX),
        );
        self.fit_window(&mut request);
        let deadline =
            tokio::time::Instant::now() + std::time::Duration::from_secs(CLOSING_CALL_SECS);
        let (response, _) =
            self.call_model(request, Some(deadline))
                .await
                .map_err(|e| match e {
                    // A tenant quota stops the closing call too: the caller answers without it.
                    Exit::Budget(b) if b.is_shared() => Exit::Budget(b),
                    // The closing call has its own short deadline; running out again is a failure.
                    Exit::Budget(_) => Exit::Failed(ErrorBody::new(
                        "provider_error",
                        "the closing answer timed out",
                    )),
                    other => other,
                })?;
        // Whatever the model did, no tool runs now: its text is the answer.
        Ok(Answer {
            text: response.text,
            reason,
        })
    }

    /// SPEC §4.11: a budget ends the run gracefully with an answer from what
    /// is known; queued follow-ups get the same treatment.
    pub(super) async fn finish_budget(&mut self, which: Budget) -> Result<(), Exit> {
        self.state.waiting = None;
        let feedback = EventKind::ReactFeedback {
            step: self.steps,
            code: FeedbackCode::BudgetExhausted,
            detail: format!("{which} reached"),
        };
        self.close_unanswered("not executed: the run's budget is exhausted")
            .await?;
        self.commit(vec![feedback], Vec::new()).await?;
        let note = format!(
            "The run's budget ({which}) is exhausted. Do not call tools. Answer the user now from what is known \
             so far, and say plainly what is incomplete."
        );
        loop {
            let answer = match self
                .answer_without_tools(None, &note, CompletionReason::BudgetExhausted)
                .await
            {
                // The tenant may not spend another model call today: the
                // answer says so instead of the model.
                Err(Exit::Budget(quota)) if quota.is_shared() => Answer {
                    text: format!(
                        "This run stopped: the {quota} limit is used up. It resets {}.",
                        quota.resets()
                    ),
                    reason: CompletionReason::BudgetExhausted,
                },
                other => other?,
            };
            if !self.conclude(answer).await? {
                return Ok(());
            }
        }
    }

    pub(super) async fn finish_failed(&mut self, error: ErrorBody) -> Result<(), Exit> {
        tracing::warn!(run = %self.run_id, code = %error.code, message = %error.message, "run failed");
        self.state.waiting = None;
        self.close_unanswered("not executed: the run failed")
            .await?;
        self.status = RunStatus::Failed;
        let patch = RunPatch {
            status: Some(RunStatus::Failed),
            error: Some(error.clone()),
            pending: Some(None),
            ..RunPatch::default()
        };
        self.commit_patch(vec![EventKind::RunFailed { error }], Vec::new(), patch)
            .await?;
        Ok(())
    }

    pub(super) async fn finish_cancelled(&mut self) -> Result<(), Exit> {
        let by = self
            .cancelled_by
            .lock()
            .map(|g| g.clone())
            .unwrap_or_default()
            .unwrap_or_else(|| "unknown".into());
        self.state.waiting = None;
        self.close_unanswered("cancelled before it finished")
            .await?;
        self.status = RunStatus::Cancelled;
        let patch = RunPatch {
            status: Some(RunStatus::Cancelled),
            pending: Some(None),
            ..RunPatch::default()
        };
        self.commit_patch(vec![EventKind::RunCancelled { by }], Vec::new(), patch)
            .await?;
        Ok(())
    }

    /// Gives every call still without a result a synthesized one.
    pub(super) async fn close_unanswered(&mut self, why: &str) -> Result<(), Exit> {
        let open = self.unanswered_calls();
        if open.is_empty() {
            return Ok(());
        }
        let messages = open.iter().map(|c| synthetic_result(c, why)).collect();
        self.commit(Vec::new(), messages).await
    }
}
