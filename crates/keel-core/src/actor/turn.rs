//! One model turn: check the budgets, ask the model, then put each proposed
//! call through the guard pipeline, in source order, with steering drained
//! between calls.

use std::collections::HashSet;
use std::time::Instant as StdInstant;

use keel_protocol::{
    Action, Budget, CompletionReason, EventKind, Message, PlannedCall, ToolCall, Understanding,
};
use serde_json::Value;

use super::apply::CallFlow;
use super::{Answer, Exit, Flow, RunActor, synthetic_result};
use crate::clarify::{self, CLARIFY_TOOL, ClarifyRequest};
use crate::pipeline::{self, Origin, ToolSnapshot, parse_arguments};
use crate::prompt;

impl RunActor {
    pub(super) async fn step(&mut self) -> Result<Flow, Exit> {
        self.drain_commands();
        if let Some(text) = self.steers.pop_front() {
            self.apply_steering(text, Vec::new()).await?;
        }
        if let Some(id) = self.pending_restore.take() {
            Box::pin(self.restore(&id, "a restore request")).await?;
        }
        let limits = &self.agent.config.limits;
        if self.steps >= limits.max_steps {
            return Err(Exit::Budget(Budget::MaxSteps));
        }
        if limits.max_tokens > 0
            && self
                .usage
                .prompt_tokens
                .saturating_add(self.usage.completion_tokens)
                >= limits.max_tokens
        {
            return Err(Exit::Budget(Budget::MaxTokens));
        }
        if tokio::time::Instant::now() >= self.deadline() {
            return Err(Exit::Budget(Budget::MaxWallTime));
        }
        // One snapshot of the tool set for the whole step: what the model is
        // offered is what its calls are judged and executed against.
        let snapshot = self.snapshot();
        let mut tools = snapshot.server.schemas_for(
            &self.agent.config.tools,
            &self.principal,
            &self.shared.guards.policy,
        );
        tools.extend(self.state.client_tools.iter().cloned());
        tools.push(clarify::clarify_schema());
        let request = self.prepare_request(tools).await?;
        let max_chars = self.agent.config.limits.max_context_chars;
        if max_chars > 0 && prompt::char_len(&request) as u64 > max_chars {
            return Err(Exit::Budget(Budget::MaxContextChars));
        }
        self.steps += 1;
        metrics::counter!("keel_steps_total").increment(1);
        let step_started = StdInstant::now();
        let (response, model_time) = self.call_model(request, Some(self.deadline())).await?;
        let mut calls = response.tool_calls;
        if calls.is_empty() {
            record_overhead(step_started, model_time);
            return Ok(Flow::Answered(Answer {
                text: response.text,
                reason: CompletionReason::Answered,
            }));
        }
        dedupe_ids(&mut calls);
        let stated = stated_understanding(response.understanding, &calls);
        self.hold_plan(response.text, &calls, &stated);
        let mut tool_time = std::time::Duration::ZERO;
        for (i, call) in calls.iter().enumerate() {
            if i > 0 {
                self.drain_commands();
                if let Some(text) = self.steers.pop_front() {
                    let skipped = calls[i..].to_vec();
                    self.apply_steering(text, skipped).await?;
                    break;
                }
            }
            let t = StdInstant::now();
            let flow = self
                .decide(call, &snapshot, Origin::ModelTurn, &stated)
                .await?;
            tool_time += t.elapsed();
            match flow {
                CallFlow::Next => {}
                CallFlow::Wait => {
                    self.skip_calls(
                        &calls[i + 1..],
                        "not executed: the run is waiting for the user's answer",
                    )
                    .await?;
                    self.flush_notes().await?;
                    self.enter_waiting().await?;
                    return Ok(Flow::Continue);
                }
                CallFlow::WaitApproval => {
                    self.skip_calls(
                        &calls[i + 1..],
                        "not executed: the run is waiting for an approval",
                    )
                    .await?;
                    self.flush_notes().await?;
                    return Ok(Flow::Continue);
                }
                CallFlow::Done(answer) => return Ok(Flow::Answered(answer)),
            }
        }
        self.flush_notes().await?;
        record_overhead(step_started, model_time + tool_time);
        if !self.state.client_waiting.is_empty() {
            self.enter_client_wait().await?;
            return Ok(Flow::Continue);
        }
        self.after_step().await
    }

    /// Judges one call with the guard pipeline and carries out the verdict.
    /// `stated` is what the model said about its turn (intent, confidence).
    pub(super) async fn decide(
        &mut self,
        call: &ToolCall,
        snapshot: &ToolSnapshot,
        origin: Origin,
        stated: &Understanding,
    ) -> Result<CallFlow, Exit> {
        let verdict = pipeline::evaluate(call, snapshot, &self.view(stated), origin);
        self.apply(call, verdict, snapshot).await
    }

    /// The model's proposal (`react_plan`) and its assistant message, held
    /// until the first decision commits.
    fn hold_plan(&mut self, text: String, calls: &[ToolCall], stated: &Understanding) {
        let action = if calls.iter().any(|c| c.name == CLARIFY_TOOL) {
            Action::Clarify
        } else {
            Action::CallTool
        };
        let planned = calls
            .iter()
            .map(|c| PlannedCall {
                call_id: c.id.clone(),
                tool: c.name.clone(),
                arguments: parse_arguments(&c.arguments)
                    .unwrap_or_else(|_| Value::String(c.arguments.clone())),
            })
            .collect();
        let missing_slots = calls
            .iter()
            .find(|c| c.name == CLARIFY_TOOL)
            .map(|c| ClarifyRequest::parse(&c.arguments).missing_slots)
            .filter(|s| !s.is_empty());
        let plan = EventKind::ReactPlan {
            step: self.steps,
            action,
            tool_calls: planned,
            intent: stated.intent.clone(),
            confidence: stated.confidence,
            missing_slots,
            brief_rationale: stated.brief_rationale.clone(),
        };
        let assistant = Message::Assistant {
            content: text,
            tool_calls: calls.to_vec(),
        };
        self.hold(vec![plan], vec![assistant]);
    }

    /// Steering: the remaining calls are skipped and the text goes to the model next.
    async fn apply_steering(&mut self, text: String, skipped: Vec<ToolCall>) -> Result<(), Exit> {
        let mut messages: Vec<Message> = skipped
            .iter()
            .map(|c| synthetic_result(c, "skipped: the user redirected the run"))
            .collect();
        messages.push(Message::user(text.clone()));
        let event = EventKind::SteeringApplied {
            text,
            skipped_calls: skipped.iter().map(|c| c.id.clone()).collect(),
        };
        self.commit(vec![event], messages).await
    }

    /// Loop warnings reach the model as a system note after the turn's results.
    pub(super) async fn flush_notes(&mut self) -> Result<(), Exit> {
        if self.notes.is_empty() {
            return Ok(());
        }
        let text = std::mem::take(&mut self.notes).join("\n");
        self.commit(Vec::new(), vec![Message::system(text)]).await
    }

    pub(super) async fn skip_calls(&mut self, calls: &[ToolCall], why: &str) -> Result<(), Exit> {
        if calls.is_empty() {
            return Ok(());
        }
        let messages = calls.iter().map(|c| synthetic_result(c, why)).collect();
        self.commit(Vec::new(), messages).await
    }
}

/// What the model said about its turn: the reply's own fields (JSON tool
/// mode), else the optional `intent`/`confidence` of a `clarify` call.
fn stated_understanding(reply: Understanding, calls: &[ToolCall]) -> Understanding {
    if !reply.is_empty() {
        return reply;
    }
    calls
        .iter()
        .find(|c| c.name == CLARIFY_TOOL)
        .map(|c| ClarifyRequest::parse(&c.arguments).understanding)
        .unwrap_or_default()
}

/// Models sometimes reuse or omit call ids; each call needs its own for its result.
fn dedupe_ids(calls: &mut [ToolCall]) {
    let mut seen = HashSet::new();
    for (i, c) in calls.iter_mut().enumerate() {
        if c.id.is_empty() || !seen.insert(c.id.clone()) {
            c.id = format!("{}_{i}", if c.id.is_empty() { "call" } else { &c.id });
            seen.insert(c.id.clone());
        }
    }
}

fn record_overhead(started: StdInstant, outside: std::time::Duration) {
    let total = started.elapsed();
    metrics::histogram!("keel_step_overhead_seconds")
        .record(total.saturating_sub(outside).as_secs_f64());
}
