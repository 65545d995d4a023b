//! One step: ask the model, then put each proposed call through the guard
//! pipeline and execute what it allows.

use std::collections::HashSet;
use std::time::Instant as StdInstant;

use keel_protocol::{
    Action, Decision, EventKind, Message, PlannedCall, RunStatus, ToolCall, ToolContext, ToolError,
};
use serde_json::Value;

use super::{Exit, Flow, RunActor, synthetic_result};
use crate::clarify::{self, CLARIFY_TOOL, ClarifyRequest};
use crate::guard_pipeline::{CallCheck, check_call, parse_arguments};
use crate::policy_gate::{self, GateDecision};
use crate::prompt;
use crate::state::{WaitKind, Waiting};

/// What processing one call leaves the turn to do next.
enum CallFlow {
    Next,
    /// The call waits for the user; the rest of the turn is skipped.
    Wait,
    /// The call waits for a person's approval; the rest of the turn is skipped.
    WaitApproval,
    /// The run ends (fallback answer given).
    Done,
}

impl RunActor {
    pub(super) async fn step(&mut self) -> Result<Flow, Exit> {
        self.drain_commands();
        if let Some(text) = self.steers.pop_front() {
            self.apply_steering(text, Vec::new()).await?;
        }
        let limits = &self.agent.config.limits;
        if self.steps >= limits.max_steps {
            return Err(Exit::Budget("max_steps"));
        }
        if limits.max_tokens > 0
            && self.usage.prompt_tokens + self.usage.completion_tokens >= limits.max_tokens
        {
            return Err(Exit::Budget("max_tokens"));
        }
        if tokio::time::Instant::now() >= self.deadline() {
            return Err(Exit::Budget("max_wall_time"));
        }
        let mut tools = self
            .shared
            .tools
            .schemas_for(&self.agent.config.tools, &self.principal);
        tools.push(clarify::clarify_schema());
        let request = prompt::build(&self.agent.config.system_prompt, &self.history, tools, None);
        let max_chars = self.agent.config.limits.max_context_chars;
        if max_chars > 0 && prompt::char_len(&request) as u64 > max_chars {
            return Err(Exit::Budget("max_context_chars"));
        }
        self.steps += 1;
        metrics::counter!("keel_steps_total").increment(1);
        let step_started = StdInstant::now();
        let (response, model_time) = self.call_model(request, Some(self.deadline())).await?;
        let mut calls = response.tool_calls;
        if calls.is_empty() {
            record_overhead(step_started, model_time);
            return self.finish_answer(response.text, "answered").await;
        }
        dedupe_ids(&mut calls);
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
        let plan = EventKind::ReactPlan {
            step: self.steps,
            action,
            tool_calls: planned,
            intent: None,
            confidence: None,
            missing_slots: None,
            brief_rationale: None,
        };
        let assistant = Message::Assistant {
            content: response.text,
            tool_calls: calls.clone(),
        };
        self.commit(vec![plan], vec![assistant]).await?;
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
            let flow = self.process_call(call).await?;
            tool_time += t.elapsed();
            match flow {
                CallFlow::Next => {}
                CallFlow::Wait => {
                    let rest = calls[i + 1..].to_vec();
                    self.skip_calls(
                        &rest,
                        "not executed: the run is waiting for the user's answer",
                    )
                    .await?;
                    self.enter_waiting().await?;
                    return Ok(Flow::Continue);
                }
                CallFlow::WaitApproval => {
                    let rest = calls[i + 1..].to_vec();
                    self.skip_calls(&rest, "not executed: the run is waiting for an approval")
                        .await?;
                    return Ok(Flow::Continue);
                }
                CallFlow::Done => return Ok(Flow::Done),
            }
        }
        record_overhead(step_started, model_time + tool_time);
        Ok(Flow::Continue)
    }

    /// Puts one call through the guard pipeline and acts on its decision.
    async fn process_call(&mut self, call: &ToolCall) -> Result<CallFlow, Exit> {
        if call.name == CLARIFY_TOOL {
            return self.handle_clarify(call).await;
        }
        let check = check_call(
            call,
            &self.shared.tools,
            &self.agent.config.tools,
            &self.principal,
        );
        match check {
            CallCheck::Execute { args } => {
                self.state.repairs.remove(&call.name);
                if self.usage.tool_calls >= u64::from(self.agent.config.limits.max_tool_calls) {
                    return Err(Exit::Budget("max_tool_calls"));
                }
                let Some(spec) = self.shared.tools.get(&call.name).map(|t| t.spec.clone()) else {
                    return Ok(CallFlow::Next);
                };
                let gate = policy_gate::decide(&spec, &self.principal, &args);
                match gate.decision {
                    GateDecision::Execute => {
                        let decision = EventKind::PolicyDecision {
                            step: self.steps,
                            decision: Decision::Execute,
                            reason: gate.reason,
                            rule: gate.rule,
                            call_id: Some(call.id.clone()),
                        };
                        self.execute(call, args, vec![decision]).await?;
                        Ok(CallFlow::Next)
                    }
                    GateDecision::Deny => {
                        self.deny(call, gate.rule, gate.reason).await?;
                        Ok(CallFlow::Next)
                    }
                    GateDecision::Approve => {
                        self.request_approval(call, args, spec.risk, gate.rule, gate.reason)
                            .await?;
                        Ok(CallFlow::WaitApproval)
                    }
                }
            }
            CallCheck::UnknownTool { detail } => {
                self.repair_turn(call, "unknown_tool", detail).await
            }
            CallCheck::InvalidArguments { detail } => {
                metrics::counter!("keel_tool_schema_validation_failed_total").increment(1);
                self.repair_turn(call, "invalid_arguments", detail).await
            }
            CallCheck::MissingArguments { missing, args } => {
                self.state.repairs.remove(&call.name);
                self.ask_for_arguments(call, missing, args, None).await
            }
            CallCheck::Denied { rule, reason } => {
                self.deny(call, rule.into(), reason).await?;
                Ok(CallFlow::Next)
            }
        }
    }

    /// A refused call: never executed; the model is told why.
    async fn deny(&mut self, call: &ToolCall, rule: String, reason: String) -> Result<(), Exit> {
        let events = vec![
            EventKind::PolicyDecision {
                step: self.steps,
                decision: Decision::Deny,
                reason: reason.clone(),
                rule,
                call_id: Some(call.id.clone()),
            },
            EventKind::ReactFeedback {
                step: self.steps,
                code: "denied_by_policy".into(),
                detail: reason.clone(),
            },
        ];
        let result = synthetic_result(call, format!("Error: denied by policy: {reason}"));
        self.commit(events, vec![result]).await
    }

    /// Gives a refused call back to the model to repair, within `max_repairs`.
    async fn repair_turn(
        &mut self,
        call: &ToolCall,
        code: &str,
        detail: String,
    ) -> Result<CallFlow, Exit> {
        let count = {
            let c = self.state.repairs.entry(call.name.clone()).or_insert(0);
            *c += 1;
            *c
        };
        let feedback = EventKind::ReactFeedback {
            step: self.steps,
            code: code.into(),
            detail: detail.clone(),
        };
        let result = synthetic_result(
            call,
            format!("Error ({code}): {detail}. Fix the call and try again."),
        );
        self.commit(vec![feedback], vec![result]).await?;
        if count > self.agent.config.limits.max_repairs {
            let note = format!(
                "The call to `{}` failed validation {count} times in a row ({detail}). Do not call tools any more: \
                 answer the user directly from what is known and say what could not be done.",
                call.name
            );
            return self
                .finish_without_tools(Some("max_repairs"), &note, "fallback")
                .await
                .map(|_| CallFlow::Done);
        }
        Ok(CallFlow::Next)
    }

    /// SPEC §4.2: a clarification is accepted only for an executable tool.
    async fn handle_clarify(&mut self, call: &ToolCall) -> Result<CallFlow, Exit> {
        let req = ClarifyRequest::parse(&call.arguments);
        let spec = self
            .shared
            .tools
            .visible(&self.agent.config.tools, &self.principal)
            .find(|t| t.spec.name == req.tool_name)
            .map(|t| t.spec.clone());
        match clarify::actionable_slots(&req, spec.as_ref()) {
            Ok(slots) => {
                let Some(spec) = spec else {
                    return Ok(CallFlow::Next);
                };
                let question = clarify::question_for(&spec, &slots, Some(&req.question));
                self.hold_for_input(
                    call,
                    WaitKind::Clarify,
                    &spec.name,
                    Value::Object(Default::default()),
                    slots,
                    question,
                    None,
                )
                .await
            }
            Err(why) => {
                let detail = why.to_string();
                let events = vec![EventKind::ReactFeedback {
                    step: self.steps,
                    code: "clarify_without_actionable_tool".into(),
                    detail: detail.clone(),
                }];
                let result = synthetic_result(
                    call,
                    format!(
                        "Not asked: {detail}. No tool needs these details; answer the user directly."
                    ),
                );
                self.commit(events, vec![result]).await?;
                let note = "Answer the user's message directly and completely from your own knowledge. \
                            Do not ask questions and do not call tools.";
                self.finish_without_tools(
                    Some("clarify_without_actionable_tool"),
                    note,
                    "fallback",
                )
                .await?;
                Ok(CallFlow::Done)
            }
        }
    }

    /// SPEC §4.3: a call lacking required arguments is not executed; the user is asked.
    async fn ask_for_arguments(
        &mut self,
        call: &ToolCall,
        missing: Vec<String>,
        args: Value,
        model_question: Option<&str>,
    ) -> Result<CallFlow, Exit> {
        let Some(spec) = self.shared.tools.get(&call.name).map(|t| t.spec.clone()) else {
            return Ok(CallFlow::Next);
        };
        let slots = clarify::most_important(&spec, &missing);
        let question = clarify::question_for(&spec, &slots, model_question);
        let feedback = EventKind::ReactFeedback {
            step: self.steps,
            code: "missing_required_arguments".into(),
            detail: format!("`{}` lacks {}", call.name, missing.join(", ")),
        };
        self.hold_for_input(
            call,
            WaitKind::MissingArguments,
            &spec.name,
            args,
            slots,
            question,
            Some(feedback),
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn hold_for_input(
        &mut self,
        call: &ToolCall,
        kind: WaitKind,
        tool: &str,
        args: Value,
        slots: Vec<String>,
        question: String,
        feedback: Option<EventKind>,
    ) -> Result<CallFlow, Exit> {
        let max_rounds = self.agent.config.limits.max_clarify_rounds;
        if self.state.clarify_rounds >= max_rounds {
            let mut events: Vec<EventKind> = feedback.into_iter().collect();
            events.push(EventKind::PolicyDecision {
                step: self.steps,
                decision: Decision::Fallback,
                reason: format!(
                    "clarification rounds exhausted ({max_rounds}); answering directly"
                ),
                rule: "max_clarify_rounds".into(),
                call_id: Some(call.id.clone()),
            });
            let result = synthetic_result(
                call,
                format!("Not executed: still missing {}", slots.join(", ")),
            );
            self.commit(events, vec![result]).await?;
            let note = format!(
                "`{tool}` cannot run because the user has not given: {}. Tell the user exactly what is missing \
                 and what you could do once they provide it. Do not call tools.",
                slots.join(", ")
            );
            self.finish_without_tools(None, &note, "fallback").await?;
            return Ok(CallFlow::Done);
        }
        self.state.clarify_rounds += 1;
        metrics::counter!("keel_clarifications_total").increment(1);
        self.state.waiting = Some(Waiting {
            kind,
            step: self.steps,
            call_id: call.id.clone(),
            tool: tool.to_owned(),
            arguments: args,
            slots: slots.clone(),
            question: question.clone(),
            round: self.state.clarify_rounds,
        });
        let mut events: Vec<EventKind> = feedback.into_iter().collect();
        events.push(EventKind::PolicyDecision {
            step: self.steps,
            decision: Decision::Clarify,
            reason: format!("asking the user for {}", slots.join(", ")),
            rule: match kind {
                WaitKind::MissingArguments => "missing_required_arguments",
                WaitKind::Clarify => "actionable_clarify",
            }
            .into(),
            call_id: Some(call.id.clone()),
        });
        self.commit(events, Vec::new()).await?;
        Ok(CallFlow::Wait)
    }

    /// Persists the waiting status and announces the question.
    async fn enter_waiting(&mut self) -> Result<(), Exit> {
        let Some(w) = self.state.waiting.clone() else {
            return Ok(());
        };
        let event = EventKind::ClarificationNeeded {
            question: w.question.clone(),
            tool: Some(w.tool.clone()),
            missing_slots: w.slots.clone(),
            round: w.round,
        };
        self.commit_status(
            vec![event],
            Vec::new(),
            RunStatus::WaitingInput,
            Some(w.pending()),
        )
        .await
    }

    /// The user's answer to a pending clarification.
    pub(super) async fn resolve_input(&mut self, reply: String) -> Result<Flow, Exit> {
        let Some(w) = self.state.waiting.take() else {
            return Ok(Flow::Continue);
        };
        self.commit_status(Vec::new(), Vec::new(), RunStatus::Running, None)
            .await?;
        let call = ToolCall {
            id: w.call_id.clone(),
            name: if w.kind == WaitKind::Clarify {
                CLARIFY_TOOL.into()
            } else {
                w.tool.clone()
            },
            arguments: String::new(),
        };
        let merged = match w.kind {
            WaitKind::MissingArguments => self
                .shared
                .tools
                .get(&w.tool)
                .and_then(|t| clarify::merge_reply(&t.spec, &w.arguments, &w.slots, &reply)),
            WaitKind::Clarify => None,
        };
        let flow = match merged {
            Some(args) => {
                let call = ToolCall {
                    arguments: args.to_string(),
                    ..call
                };
                self.process_call(&call).await?
            }
            None => {
                let text = match w.kind {
                    WaitKind::Clarify => format!("The user answered: {reply}"),
                    WaitKind::MissingArguments => format!(
                        "Not executed: {} missing. The user's answer follows; call the tool again with the values it gives.",
                        w.slots.join(", ")
                    ),
                };
                let result = Message::Tool {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    content: text,
                    is_error: w.kind == WaitKind::MissingArguments,
                };
                let mut messages = vec![result];
                if w.kind == WaitKind::MissingArguments {
                    messages.push(Message::user(reply));
                }
                self.commit(Vec::new(), messages).await?;
                CallFlow::Next
            }
        };
        match flow {
            CallFlow::Next | CallFlow::WaitApproval => Ok(Flow::Continue),
            CallFlow::Wait => {
                self.enter_waiting().await?;
                Ok(Flow::Continue)
            }
            CallFlow::Done => Ok(Flow::Done),
        }
    }

    /// Executes an allowed call and records its one result.
    pub(super) async fn execute(
        &mut self,
        call: &ToolCall,
        args: Value,
        mut events: Vec<EventKind>,
    ) -> Result<(), Exit> {
        let Some(reg) = self.shared.tools.get(&call.name) else {
            return Ok(());
        };
        let tool = reg.tool.clone();
        let timeout = reg.spec.timeout;
        self.usage.tool_calls += 1;
        events.push(EventKind::ToolCall {
            step: self.steps,
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments: args.clone(),
        });
        self.commit(events, Vec::new()).await?;
        let ctx = ToolContext {
            tenant: self.principal.tenant.clone(),
            principal: self.principal.id.clone(),
            run_id: self.run_id.clone(),
            call_id: call.id.clone(),
        };
        let started = StdInstant::now();
        let outcome = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(Exit::Cancelled),
            r = tokio::time::timeout(timeout, tool.call(args, &ctx)) => match r {
                Ok(r) => r,
                Err(_) => Err(ToolError::Timeout(timeout)),
            },
        };
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let max_chars = self.agent.config.limits.max_tool_output_chars;
        let (ok, output, error) = match outcome {
            Ok(out) if out.is_error => (
                false,
                out.content,
                Some("the tool reported an error".to_owned()),
            ),
            Ok(out) => (true, out.content, None),
            Err(e) => (false, String::new(), Some(e.to_string())),
        };
        let output = truncate_output(output, max_chars);
        metrics::counter!("keel_tool_calls_total", "tool" => call.name.clone(), "outcome" => if ok { "ok" } else { "error" })
            .increment(1);
        let content = match (&error, ok) {
            (_, true) => output.clone(),
            (Some(e), false) if output.is_empty() => format!("Error: {e}"),
            (_, false) => format!("Error: {output}"),
        };
        let mut events = vec![EventKind::ToolResult {
            step: self.steps,
            call_id: call.id.clone(),
            tool: call.name.clone(),
            ok,
            duration_ms,
            output,
            error: error.clone(),
        }];
        if !ok {
            events.push(EventKind::ReactFeedback {
                step: self.steps,
                code: "tool_error".into(),
                detail: error.unwrap_or_default(),
            });
        }
        let message = Message::Tool {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content,
            is_error: !ok,
        };
        self.commit(events, vec![message]).await
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

    pub(super) async fn skip_calls(&mut self, calls: &[ToolCall], why: &str) -> Result<(), Exit> {
        if calls.is_empty() {
            return Ok(());
        }
        let messages = calls.iter().map(|c| synthetic_result(c, why)).collect();
        self.commit(Vec::new(), messages).await
    }
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

fn truncate_output(mut s: String, max_chars: usize) -> String {
    if max_chars == 0 || s.len() <= max_chars {
        return s;
    }
    let mut cut = max_chars;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    let dropped = s.len() - cut;
    s.truncate(cut);
    s.push_str(&format!("\n[truncated: {dropped} more bytes not shown]"));
    s
}

fn record_overhead(started: StdInstant, outside: std::time::Duration) {
    let total = started.elapsed();
    metrics::histogram!("keel_step_overhead_seconds")
        .record(total.saturating_sub(outside).as_secs_f64());
}
