//! Asking the user (SPEC §4.2, §4.3): the run holds the call, waits in
//! `waiting_input`, and resumes with the answer in the conversation, so the
//! model makes the complete call itself, which then passes the whole
//! pipeline again. Only a bare value of the one missing slot fills it
//! directly (see `clarify::direct_fill`); free text never does.

use keel_protocol::{EventKind, Message, RunStatus, ToolCall};

use super::{Exit, Flow, RunActor};
use crate::clarify;
use crate::outbound::Outgoing;
use crate::pipeline::{Ask, Origin};
use crate::state::{WaitKind, Waiting};

impl RunActor {
    /// Holds the call until the user answers; the turn then stops.
    pub(super) async fn hold_for_input(
        &mut self,
        call: &ToolCall,
        ask: Ask,
        events: Vec<EventKind>,
    ) -> Result<(), Exit> {
        self.state.waiting = Some(self.waiting_for(call, ask, false));
        self.commit(events, Vec::new()).await
    }

    /// Clarification rounds ran out and the agent hands the question to a
    /// person (`on_clarify_exhausted = "handoff"`).
    pub(super) async fn hand_off(
        &mut self,
        call: &ToolCall,
        ask: Ask,
        events: Vec<EventKind>,
    ) -> Result<(), Exit> {
        self.state.waiting = Some(self.waiting_for(call, ask, true));
        self.commit(events, Vec::new()).await
    }

    fn waiting_for(&self, call: &ToolCall, ask: Ask, handoff: bool) -> Waiting {
        Waiting {
            kind: ask.kind,
            step: self.steps,
            call_id: call.id.clone(),
            tool: ask.tool,
            arguments: ask.args,
            slots: ask.slots,
            question: ask.question,
            round: self.state.clarify_rounds,
            handoff,
        }
    }

    /// Persists the waiting status and announces the question.
    pub(super) async fn enter_waiting(&mut self) -> Result<(), Exit> {
        let Some(w) = self.state.waiting.clone() else {
            return Ok(());
        };
        let event = if w.handoff {
            EventKind::HandoffRequested {
                question: w.question.clone(),
                tool: Some(w.tool.clone()),
                missing_slots: w.slots.clone(),
                reason: format!(
                    "the user was asked {} times and {} is still missing",
                    w.round,
                    w.slots.join(", ")
                ),
            }
        } else {
            EventKind::ClarificationNeeded {
                question: w.question.clone(),
                tool: Some(w.tool.clone()),
                missing_slots: w.slots.clone(),
                round: w.round,
            }
        };
        self.commit_status(
            vec![event],
            Vec::new(),
            RunStatus::WaitingInput,
            Some(w.pending()),
        )
        .await?;
        // Asked in a chat, the question goes there; the reply comes back
        // through the same input as any other answer.
        let sent = self.deliver(Outgoing::Question(w.question)).await;
        if !sent.is_empty() {
            self.commit(sent, Vec::new()).await?;
        }
        Ok(())
    }

    /// The answer to a pending question (the user's, or after a handoff a
    /// person's).
    pub(super) async fn resolve_input(&mut self, reply: String) -> Result<Flow, Exit> {
        let Some(w) = self.state.waiting.take() else {
            return Ok(Flow::Continue);
        };
        self.commit_status(Vec::new(), Vec::new(), RunStatus::Running, None)
            .await?;
        if w.handoff {
            // A person took over the questions; the model may ask again.
            self.state.clarify_rounds = 0;
        }
        let call = w.call();
        if w.kind == WaitKind::MissingArguments {
            let snapshot = self.snapshot();
            let filled = snapshot
                .lookup(&w.tool, &self.agent.config.tools)
                .and_then(|reg| {
                    clarify::direct_fill(&reg.spec, &reg.schema, &w.arguments, &w.slots, &reply)
                });
            if let Some(args) = filled {
                let call = ToolCall {
                    arguments: args.to_string(),
                    ..call
                };
                let flow = self
                    .decide(
                        &call,
                        &snapshot,
                        Origin::ClarificationAnswer,
                        &Default::default(),
                    )
                    .await?;
                return self.settle(flow).await;
            }
        }
        let held = match w.kind {
            WaitKind::Clarify => {
                "Asked the user. Their answer follows as the next message.".to_owned()
            }
            WaitKind::MissingArguments => format!(
                "Not executed: {} missing. The user's answer follows as the next message: make the complete \
                 call with the values it gives, or ask again if it does not give them.",
                w.slots.join(", ")
            ),
            WaitKind::Confirm => {
                "Not executed: the user was asked to confirm this call. Their answer follows \
                                  as the next message: make the call again only if they confirm it."
                    .to_owned()
            }
        };
        let result = Message::Tool {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content: held,
            is_error: w.kind != WaitKind::Clarify,
        };
        self.commit(Vec::new(), vec![result, Message::user(reply)])
            .await?;
        Ok(Flow::Continue)
    }
}
