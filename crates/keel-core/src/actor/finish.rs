//! How a run ends: answered, answered without tools (fallback or budget),
//! failed, or cancelled. Each ending closes every open tool call first.

use keel_protocol::{Decision, ErrorBody, EventKind, Message, RunPatch, RunStatus};

use super::{Exit, Flow, RunActor, synthetic_result};
use crate::prompt;

/// Time allowed for the closing tool-less call after the wall-time budget ran out.
const CLOSING_CALL_SECS: u64 = 60;

impl RunActor {
    /// A model answer: completes the run, unless follow-ups are queued.
    pub(super) async fn finish_answer(&mut self, text: String, reason: &str) -> Result<Flow, Exit> {
        self.drain_commands();
        let answer = Message::Assistant {
            content: text.clone(),
            tool_calls: Vec::new(),
        };
        if let Some(next) = self.state.follow_ups.pop_front() {
            self.state.course.goals.push(next.clone());
            let events = vec![
                EventKind::Final { answer: text },
                EventKind::FollowUpStarted { text: next.clone() },
            ];
            self.commit(events, vec![answer, Message::user(next)])
                .await?;
            return Ok(Flow::Continue);
        }
        let events = vec![
            EventKind::Final {
                answer: text.clone(),
            },
            EventKind::RunCompleted {
                reason: reason.into(),
                usage: self.usage,
            },
        ];
        self.status = RunStatus::Completed;
        let patch = RunPatch {
            status: Some(RunStatus::Completed),
            output: Some(text),
            pending: Some(serde_json::Value::Null),
            ..RunPatch::default()
        };
        self.commit_patch(events, vec![answer], patch).await?;
        Ok(Flow::Done)
    }

    /// One model call with no tools offered; its text is the final answer.
    pub(super) async fn finish_without_tools(
        &mut self,
        fallback_rule: Option<&str>,
        note: &str,
        reason: &str,
    ) -> Result<Flow, Exit> {
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
                    // The closing call has its own short deadline; running out again is a failure.
                    Exit::Budget(_) => Exit::Failed(ErrorBody::new(
                        "provider_error",
                        "the closing answer timed out",
                    )),
                    other => other,
                })?;
        // Whatever the model did, no tool runs now: its text is the answer.
        self.finish_answer(response.text, reason).await
    }

    /// SPEC §4.11: a budget ends the run gracefully with an answer from what is known.
    pub(super) async fn finish_budget(&mut self, which: &'static str) -> Result<(), Exit> {
        self.state.waiting = None;
        let feedback = EventKind::ReactFeedback {
            step: self.steps,
            code: "budget_exhausted".into(),
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
            match self
                .finish_without_tools(None, &note, "budget_exhausted")
                .await?
            {
                Flow::Done => return Ok(()),
                // A queued follow-up was started; it gets the same treatment.
                Flow::Continue => continue,
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
            pending: Some(serde_json::Value::Null),
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
            pending: Some(serde_json::Value::Null),
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
