//! `apply`: the one place a verdict of the guard pipeline turns into
//! effects. It is the only caller of `execute` and `hand_to_client`, which
//! are private to this module, and those take a [`Cleared`] call, which
//! only `pipeline::evaluate` can make: no path reaches a tool without
//! passing the pipeline.

use std::time::Instant as StdInstant;

use keel_guard::loop_detect::{CallRecord, Level, LoopHit, Outcome, call_fingerprint};
use keel_protocol::{
    ClientCall, CompletionReason, Decision, EventKind, FeedbackCode, ToolCall, ToolContext,
    ToolError,
};

use super::{Answer, Exit, Flow, RunActor, synthetic_result};
use crate::admission::AdmissionCall;
use crate::pipeline::{Cleared, Target, ToolSnapshot, Verdict};
use keel_config::OnClarifyExhausted;

/// How long a call whose start is held runs before it is announced anyway.
/// Short beside a person watching the stream (a quarter second reads as
/// at once); long beside a fast tool, whose start then needs no commit of
/// its own, even on a node so busy that a fast tool answers in tens of
/// milliseconds: at 20 ms, one turn in ten of a loaded node took a second
/// commit.
const ANNOUNCE_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

/// What processing one call leaves the turn to do next.
pub(super) enum CallFlow {
    Next,
    /// The call waits for the user; the rest of the turn is skipped.
    Wait,
    /// The call waits for a person's approval; the rest of the turn is skipped.
    WaitApproval,
    /// The run has its answer (fallback, loop or exhausted repairs).
    Done(Answer),
}

impl RunActor {
    pub(super) async fn apply(
        &mut self,
        call: &ToolCall,
        verdict: Verdict,
        snapshot: &ToolSnapshot,
    ) -> Result<CallFlow, Exit> {
        let events = verdict.events(self.steps, &call.id);
        match verdict {
            Verdict::Execute(cleared) => {
                self.state.repairs.remove(&call.name);
                if let Some(hit) = cleared.warning() {
                    self.note_loop_warning(hit);
                }
                match cleared.target() {
                    Target::Server => {
                        if let Err((hook, reason)) = self.admit(call, &cleared).await {
                            return Box::pin(self.refused_by_hook(call, events, hook, reason))
                                .await;
                        }
                        if let Err(which) = crate::quota::spend_tool_call(
                            &self.shared.options.quotas,
                            self.shared.store.as_ref(),
                            &self.principal.tenant,
                        )
                        .await?
                        {
                            let result = synthetic_result(
                                call,
                                format!("not executed: the tenant's {which} quota is used up"),
                            );
                            self.commit(events, vec![result]).await?;
                            return Err(Exit::Budget(which));
                        }
                        self.execute(call, cleared, events, snapshot).await?;
                        if self.spiralling_after_compaction() {
                            return Box::pin(self.end_spiral(call)).await;
                        }
                    }
                    Target::Client => Box::pin(self.hand_to_client(call, cleared, events)).await?,
                }
                Ok(CallFlow::Next)
            }
            Verdict::Repair {
                code,
                detail,
                attempt,
                exhausted,
                warning,
            } => {
                if let Some(hit) = &warning {
                    self.note_loop_warning(hit);
                }
                if code == FeedbackCode::UnknownTool {
                    self.state.calls.record(CallRecord {
                        tool: call.name.clone(),
                        call: call_fingerprint(&call.name, &serde_json::Value::Null),
                        outcome: None,
                        kind: Outcome::UnknownTool,
                        poll: false,
                    });
                }
                if code == FeedbackCode::InvalidArguments {
                    metrics::counter!("keel_tool_schema_validation_failed_total").increment(1);
                }
                self.state.repairs.insert(call.name.clone(), attempt);
                self.state
                    .course
                    .learn_constraint(format!("`{}` call rejected ({code}): {detail}", call.name));
                let result = synthetic_result(
                    call,
                    format!("Error ({code}): {detail}. Fix the call and try again."),
                );
                self.commit(events, vec![result]).await?;
                if !exhausted {
                    return Ok(CallFlow::Next);
                }
                let note = format!(
                    "The call to `{}` failed validation {attempt} times in a row ({detail}). Do not call tools any more: \
                     answer the user directly from what is known and say what could not be done.",
                    call.name
                );
                let answer = Box::pin(self.answer_without_tools(
                    Some("max_repairs"),
                    &note,
                    CompletionReason::Fallback,
                ))
                .await?;
                Ok(CallFlow::Done(answer))
            }
            Verdict::Ask(ask) => {
                self.state.clarify_rounds += 1;
                metrics::counter!("keel_clarifications_total").increment(1);
                Box::pin(self.hold_for_input(call, ask, events)).await?;
                Ok(CallFlow::Wait)
            }
            Verdict::ClarifyExhausted { ask, then, .. } => match then {
                OnClarifyExhausted::Fallback => {
                    let result = synthetic_result(
                        call,
                        format!("Not executed: still missing {}", ask.slots.join(", ")),
                    );
                    self.commit(events, vec![result]).await?;
                    let note = format!(
                        "`{}` cannot run because the user has not given: {}. Tell the user exactly what is missing \
                         and what you could do once they provide it. Do not call tools.",
                        ask.tool,
                        ask.slots.join(", ")
                    );
                    let answer = Box::pin(self.answer_without_tools(
                        None,
                        &note,
                        CompletionReason::Fallback,
                    ))
                    .await?;
                    Ok(CallFlow::Done(answer))
                }
                OnClarifyExhausted::Handoff => {
                    Box::pin(self.hand_off(call, ask, events)).await?;
                    Ok(CallFlow::Wait)
                }
            },
            Verdict::NotActionable { detail } => {
                let result = synthetic_result(
                    call,
                    format!(
                        "Not asked: {detail}. No tool needs these details; answer the user directly."
                    ),
                );
                self.commit(events, vec![result]).await?;
                let note = "Answer the user's message directly and completely from your own knowledge. \
                            Do not ask questions and do not call tools.";
                let answer = Box::pin(self.answer_without_tools(
                    Some("clarify_without_actionable_tool"),
                    note,
                    CompletionReason::Fallback,
                ))
                .await?;
                Ok(CallFlow::Done(answer))
            }
            Verdict::Deny { reason, result, .. } => {
                self.state
                    .course
                    .learn_constraint(format!("`{}` was refused: {reason}", call.name));
                let text = result.unwrap_or_else(|| format!("Error: denied by policy: {reason}"));
                self.commit(events, vec![synthetic_result(call, text)])
                    .await?;
                Ok(CallFlow::Next)
            }
            Verdict::NeedsApproval {
                args,
                risk,
                rule: _,
                reason,
            } => {
                Box::pin(self.request_approval(call, args, risk, reason, events)).await?;
                Ok(CallFlow::WaitApproval)
            }
            Verdict::LoopBlocked {
                hit,
                ends_run,
                known_tool,
            } => Box::pin(self.loop_blocked(call, hit, ends_run, known_tool, events)).await,
            Verdict::Budget(which) => Err(Exit::Budget(which)),
            Verdict::OutcomeUnknown => {
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
                    call,
                    format!("Error: {detail}. Check its effect before calling it again."),
                );
                self.commit(vec![event], vec![result]).await?;
                Ok(CallFlow::Next)
            }
        }
    }

    /// After a call decided outside a model turn (an answer to a question,
    /// an approval): the run waits for what the call needs, or goes on.
    pub(super) async fn settle(&mut self, flow: CallFlow) -> Result<Flow, Exit> {
        self.flush_notes().await?;
        match flow {
            CallFlow::Done(answer) => return Ok(Flow::Answered(answer)),
            CallFlow::Wait => self.enter_waiting().await?,
            CallFlow::Next | CallFlow::WaitApproval => {}
        }
        if !self.state.client_waiting.is_empty() {
            self.enter_client_wait().await?;
        }
        Ok(Flow::Continue)
    }

    /// A warning lets the call run; the model reads it after the turn.
    fn note_loop_warning(&mut self, hit: &LoopHit) {
        self.learn_loop(hit);
        self.notes.push(format!("Loop warning: {}", hit.message));
    }

    fn learn_loop(&mut self, hit: &LoopHit) {
        self.state.course.loop_signals += 1;
        self.state.course.learn_failure(format!(
            "`{}` kept repeating without progress ({})",
            hit.tool,
            hit.detector.as_str()
        ));
    }

    /// A critical hit blocks the call; the second one, or the breaker,
    /// ends the run with an answer from what is known.
    async fn loop_blocked(
        &mut self,
        call: &ToolCall,
        hit: LoopHit,
        ends_run: bool,
        known_tool: bool,
        events: Vec<EventKind>,
    ) -> Result<CallFlow, Exit> {
        debug_assert_eq!(hit.level, Level::Critical);
        self.learn_loop(&hit);
        self.state.loop_criticals += 1;
        if known_tool {
            let args = crate::pipeline::parse_arguments(&call.arguments).unwrap_or_default();
            self.state.calls.record(CallRecord {
                tool: call.name.clone(),
                call: call_fingerprint(&call.name, &args),
                outcome: None,
                kind: Outcome::Blocked,
                poll: false,
            });
        }
        let result = synthetic_result(call, format!("Blocked by loop detection: {}", hit.message));
        self.commit(events, vec![result]).await?;
        if ends_run {
            let note = format!(
                "The run is stopped because it kept repeating itself ({}). Do not call tools. Give the user \
                 the most helpful answer you can from what is already known, and say plainly what did not work.",
                hit.message
            );
            let answer = self
                .answer_without_tools(None, &note, CompletionReason::LoopBlocked)
                .await?;
            return Ok(CallFlow::Done(answer));
        }
        self.notes.push(format!(
            "Loop detected and blocked: {} Change your approach now; the next repetition ends the run.",
            hit.message
        ));
        Ok(CallFlow::Next)
    }

    /// The same call with the same outcome three times right after a
    /// compaction: the summary lost what the model needed, so the run ends.
    async fn end_spiral(&mut self, call: &ToolCall) -> Result<CallFlow, Exit> {
        let detail = format!(
            "`{}` returned the same result three times right after the context was compacted",
            call.name
        );
        let feedback = EventKind::ReactFeedback {
            step: self.steps,
            code: FeedbackCode::LoopBlocked,
            detail: detail.clone(),
        };
        self.commit(vec![feedback], Vec::new()).await?;
        metrics::counter!("keel_loop_blocks_total", "detector" => "post_compaction").increment(1);
        let note = format!(
            "The run is stopped: {detail}. Do not call tools. Answer the user from what is known and \
             say plainly what did not work."
        );
        let answer = self
            .answer_without_tools(None, &note, CompletionReason::LoopBlocked)
            .await?;
        Ok(CallFlow::Done(answer))
    }

    /// Asks the operator's `before_tool_call` hooks, if any, about a call
    /// the pipeline cleared.
    async fn admit(&self, call: &ToolCall, cleared: &Cleared) -> Result<(), (String, String)> {
        let Some(admission) = &self.shared.options.admission else {
            return Ok(());
        };
        admission
            .admit(AdmissionCall {
                tenant: &self.principal.tenant,
                principal: &self.principal.id,
                agent: &self.agent.config.id,
                session: &self.session,
                run_id: &self.run_id,
                call_id: &call.id,
                tool: &call.name,
                arguments: cleared.args(),
            })
            .await
    }

    /// A hook refused the call: it does not run, and the model is told why,
    /// as for any policy denial.
    async fn refused_by_hook(
        &mut self,
        call: &ToolCall,
        mut events: Vec<EventKind>,
        hook: String,
        reason: String,
    ) -> Result<CallFlow, Exit> {
        events.push(EventKind::PolicyDecision {
            step: self.steps,
            decision: Decision::Deny,
            reason: reason.clone(),
            rule: hook,
            call_id: Some(call.id.clone()),
        });
        events.push(EventKind::ReactFeedback {
            step: self.steps,
            code: FeedbackCode::DeniedByPolicy,
            detail: reason.clone(),
        });
        self.state
            .course
            .learn_constraint(format!("`{}` was refused: {reason}", call.name));
        let text = format!("Error: denied by policy: {reason}");
        self.commit(events, vec![synthetic_result(call, text)])
            .await?;
        Ok(CallFlow::Next)
    }

    /// Executes a cleared call with the step's snapshot and records its one result.
    async fn execute(
        &mut self,
        call: &ToolCall,
        cleared: Cleared,
        mut events: Vec<EventKind>,
        snapshot: &ToolSnapshot,
    ) -> Result<(), Exit> {
        let Some(reg) = snapshot.server.get(&call.name) else {
            // evaluate found it in this very snapshot; a result is still owed.
            let result = synthetic_result(call, "Error: the tool is no longer available");
            return self.commit(events, vec![result]).await;
        };
        let tool = reg.tool.clone();
        let (idempotent, timeout) = (reg.spec.idempotent, reg.spec.timeout);
        let fingerprint = cleared.fingerprint().to_owned();
        let args = cleared.into_args();
        let args_text = args.to_string();
        self.count_call(call, &args, &mut events);
        let start_held = idempotent && self.turn_is_held();
        if start_held {
            self.hold(events, Vec::new());
        } else {
            // Committed before the tool runs: a restarted node knows it started.
            self.commit(events, Vec::new()).await?;
        }
        self.check_behind().await?;
        self.hold_lease().await?;
        let ctx = ToolContext {
            tenant: self.principal.tenant.clone(),
            principal: self.principal.id.clone(),
            agent: self.agent.config.id.clone(),
            session: self.session.clone(),
            run_id: self.run_id.clone(),
            call_id: call.id.clone(),
        };
        let started = StdInstant::now();
        let span = crate::otel::execute_tool(&call.name, &call.id, &self.run_id, &args_text);
        let running = tracing::Instrument::instrument(
            async {
                let _place = tool.place().await;
                tokio::time::timeout(timeout, tool.call(args, &ctx)).await
            },
            span.clone(),
        );
        let outcome = match self.run_tool(running, start_held).await? {
            Ok(r) => r,
            Err(_) => Err(ToolError::Timeout(timeout)),
        };
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        // Redacted before the span records it; `observe` would too late.
        let outcome = self.redact_outcome(outcome.map_err(|e| e.to_string()));
        crate::otel::record_tool(&span, &outcome);
        let observed = self.observe(call, reg, &fingerprint, &args_text, outcome, duration_ms);
        if self.turn_is_held() {
            // The whole turn is in this commit, and it was never announced:
            // nothing of it is on record yet, so the run need not wait.
            return self
                .commit_behind(observed.events, vec![observed.message])
                .await;
        }
        self.commit(observed.events, vec![observed.message]).await
    }

    /// Runs a started call until it answers or the run is cancelled. A call
    /// whose start is held (see `turn_is_held`) is announced once it has run
    /// for [`ANNOUNCE_AFTER`]: the held plan, decision and `tool_call` are
    /// committed while it keeps running, so a slow tool shows in the stream
    /// while it works. A fast one is recorded with its result, in one commit.
    async fn run_tool<F: Future>(
        &mut self,
        running: F,
        start_held: bool,
    ) -> Result<F::Output, Exit> {
        let cancel = self.cancel.clone();
        let mut running = std::pin::pin!(running);
        let mut answered = None;
        if start_held {
            // The last call's timer, moved. Until its deadline passes it is
            // among the timers the runtime sleeps until, so moving it later
            // leaves the runtime be. A new timer, earlier than every other
            // it waits for, would make it wake its own driver at once: a
            // system call and an empty pass of its loop per tool call.
            let deadline = tokio::time::Instant::now() + ANNOUNCE_AFTER;
            let timer = match &mut self.announce {
                Some(timer) => {
                    timer.as_mut().reset(deadline);
                    timer
                }
                None => self
                    .announce
                    .insert(Box::pin(tokio::time::sleep_until(deadline))),
            };
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(Exit::Cancelled),
                r = &mut running => return Ok(r),
                () = timer.as_mut() => {}
            }
            // The announcement is not cut short by a cancellation: like every
            // commit, it is written whole or not at all before the run ends.
            let mut announce = self.commit(Vec::new(), Vec::new());
            let announced = loop {
                tokio::select! {
                    biased;
                    c = &mut announce => break c,
                    r = &mut running, if answered.is_none() => answered = Some(r),
                }
            };
            announced?;
        }
        if let Some(r) = answered {
            return Ok(r);
        }
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(Exit::Cancelled),
            r = running => Ok(r),
        }
    }

    /// A cleared client tool call goes to the caller; the run waits for its
    /// output once the turn's other calls are decided.
    async fn hand_to_client(
        &mut self,
        call: &ToolCall,
        cleared: Cleared,
        mut events: Vec<EventKind>,
    ) -> Result<(), Exit> {
        let args = cleared.into_args();
        self.count_call(call, &args, &mut events);
        self.state.client_waiting.push(ToolCall {
            id: call.id.clone(),
            name: call.name.clone(),
            arguments: args.to_string(),
        });
        self.commit(events, Vec::new()).await
    }

    /// A call that really runs (here or at the client) spends the tool-call
    /// budget and is announced with `tool_call`.
    fn count_call(
        &mut self,
        call: &ToolCall,
        args: &serde_json::Value,
        events: &mut Vec<EventKind>,
    ) {
        self.usage.tool_calls += 1;
        events.push(EventKind::ToolCall {
            step: self.steps,
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments: args.clone(),
        });
    }

    /// The client calls of this turn, as `waiting_client_tool` lists them.
    pub(super) fn client_calls(&self) -> Vec<ClientCall> {
        self.state
            .client_waiting
            .iter()
            .map(|c| ClientCall {
                call_id: c.id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect()
    }
}
