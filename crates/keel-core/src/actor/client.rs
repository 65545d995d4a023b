//! Client tools (SPEC §5, §7): functions the caller executes itself. A call
//! passes the same guards as any other (schema, loop detection, policy);
//! instead of running here, the run waits for the caller's output, which is
//! then verified and fenced like any tool result.

use keel_guard::loop_detect::{CallRecord, Outcome, call_fingerprint, outcome_fingerprint};
use keel_guard::policy::{PolicyDecision, PolicyInput};
use keel_guard::schema::{CompiledSchema, normalize};
use keel_guard::verify::VerifyInput;
use keel_protocol::{
    Decision, EventKind, Message, RunStatus, ToolCall, ToolSchema, ToolSource, ToolSpec,
};
use serde_json::{Value, json};

use super::step::{CallFlow, fence};
use super::{Exit, Flow, RunActor, synthetic_result};
use crate::guard_pipeline::parse_arguments;
use crate::runtime::{ClientToolOutput, Command};

impl RunActor {
    pub(super) fn client_tool(&self, name: &str) -> Option<ToolSchema> {
        if self.shared.tools().get(name).is_some() {
            return None;
        }
        self.state
            .client_tools
            .iter()
            .find(|t| t.name == name)
            .cloned()
    }

    fn client_spec(schema: &ToolSchema) -> ToolSpec {
        let mut spec = ToolSpec::new(
            &schema.name,
            &schema.description,
            normalize(&schema.parameters),
        );
        spec.source = ToolSource::Client;
        spec
    }

    /// Guards a client tool call; when allowed it is handed to the caller.
    pub(super) async fn client_call(
        &mut self,
        call: &ToolCall,
        schema: ToolSchema,
    ) -> Result<CallFlow, Exit> {
        let spec = Self::client_spec(&schema);
        let args = match parse_arguments(&call.arguments) {
            Ok(a) => a,
            Err(detail) => return self.repair_turn(call, "invalid_arguments", detail).await,
        };
        let compiled = match CompiledSchema::compile(&spec.parameters) {
            Ok(c) => c,
            Err(e) => {
                let reason = format!(
                    "the client declared an invalid schema for `{}`: {e}",
                    spec.name
                );
                self.deny(call, "client_tool_schema".into(), reason).await?;
                return Ok(CallFlow::Next);
            }
        };
        let violations: Vec<String> = compiled
            .check(&args)
            .into_iter()
            .map(|v| v.message)
            .collect();
        if !violations.is_empty() {
            return self
                .repair_turn(call, "invalid_arguments", violations.join("; "))
                .await;
        }
        self.state.repairs.remove(&call.name);
        let fingerprint = call_fingerprint(&call.name, &args);
        let settings = self.loop_settings();
        if let Some(hit) = self
            .state
            .calls
            .check(&call.name, &fingerprint, false, &settings)
            && let Some(flow) = self.loop_hit(call, hit).await?
        {
            self.state.calls.record(CallRecord {
                tool: call.name.clone(),
                call: fingerprint,
                outcome: None,
                kind: Outcome::Blocked,
                poll: false,
            });
            return Ok(flow);
        }
        let verdict = self.shared.guards.policy.decide(&PolicyInput {
            principal: &self.principal,
            tool: &spec,
            args: &args,
            calls_of_tool: 0,
            tool_calls: u32::try_from(self.usage.tool_calls).unwrap_or(u32::MAX),
        });
        match verdict.decision {
            PolicyDecision::Execute => {}
            PolicyDecision::Deny => {
                self.deny(call, verdict.rule, verdict.reason).await?;
                return Ok(CallFlow::Next);
            }
            PolicyDecision::Approve => {
                let reason = format!(
                    "{} (client tools run on the caller's side and cannot wait for a keel approval)",
                    verdict.reason
                );
                self.deny(call, verdict.rule, reason).await?;
                return Ok(CallFlow::Next);
            }
        }
        self.usage.tool_calls += 1;
        let events = vec![
            EventKind::PolicyDecision {
                step: self.steps,
                decision: Decision::Execute,
                reason: "a client tool: the caller executes it".into(),
                rule: verdict.rule,
                call_id: Some(call.id.clone()),
            },
            EventKind::ToolCall {
                step: self.steps,
                call_id: call.id.clone(),
                tool: call.name.clone(),
                arguments: args.clone(),
            },
        ];
        self.state.client_waiting.push(ToolCall {
            id: call.id.clone(),
            name: call.name.clone(),
            arguments: args.to_string(),
        });
        self.commit(events, Vec::new()).await?;
        Ok(CallFlow::Next)
    }

    /// The run waits (status `waiting_input`) until the caller sends the outputs.
    pub(super) async fn enter_client_wait(&mut self) -> Result<(), Exit> {
        let calls: Vec<Value> = self
            .state
            .client_waiting
            .iter()
            .map(|c| {
                json!({
                    "call_id": c.id,
                    "name": c.name,
                    "arguments": c.arguments,
                })
            })
            .collect();
        let pending = json!({"type": "client_tool", "calls": calls});
        self.commit_status(
            Vec::new(),
            Vec::new(),
            RunStatus::WaitingInput,
            Some(pending),
        )
        .await
    }

    pub(super) async fn wait_for_tool_outputs(&mut self) -> Result<Vec<ClientToolOutput>, Exit> {
        let since = tokio::time::Instant::now();
        let outputs = loop {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(Exit::Cancelled),
                cmd = self.commands.recv() => match cmd {
                    Some(Command::ToolOutputs(outputs)) => break outputs,
                    Some(other) => self.accept(other),
                    None => return Err(Exit::Detached),
                },
            }
        };
        let waited = since.elapsed();
        self.state.waited_s += waited.as_secs_f64();
        self.started += waited;
        Ok(outputs)
    }

    /// Each waiting call gets exactly one result: the caller's output, or a
    /// note that none was given.
    pub(super) async fn resolve_tool_outputs(
        &mut self,
        outputs: Vec<ClientToolOutput>,
    ) -> Result<Flow, Exit> {
        let waiting = std::mem::take(&mut self.state.client_waiting);
        self.commit_status(Vec::new(), Vec::new(), RunStatus::Running, None)
            .await?;
        let max_chars = self.agent.config.limits.max_tool_output_chars;
        for call in waiting {
            let Some(out) = outputs.iter().find(|o| o.call_id == call.id) else {
                let result =
                    synthetic_result(&call, "Error: the client returned no output for this call");
                self.commit(Vec::new(), vec![result]).await?;
                continue;
            };
            let spec = self
                .state
                .client_tools
                .iter()
                .find(|t| t.name == call.name)
                .map(Self::client_spec)
                .unwrap_or_else(|| ToolSpec::new(&call.name, "", json!({"type": "object"})));
            let report = self.shared.guards.verifier.verify(&VerifyInput {
                tool: &spec,
                output: &out.output,
                structured: None,
                ok: true,
                caller_tenant: &self.principal.tenant,
                output_schema: None,
            });
            let args = parse_arguments(&call.arguments).unwrap_or_default();
            self.state.calls.record(CallRecord {
                tool: call.name.clone(),
                call: call_fingerprint(&call.name, &args),
                outcome: Some(outcome_fingerprint(&out.output, None, &[])),
                kind: Outcome::Ok,
                poll: false,
            });
            let (output, content) = if report.withhold {
                let w = super::step::WITHHELD.to_owned();
                (w.clone(), format!("Error: {w}"))
            } else {
                let o = super::step::truncate_output(out.output.clone(), max_chars);
                let c = fence(&call.name, &o);
                (o, c)
            };
            let mut events = vec![EventKind::ToolResult {
                step: self.steps,
                call_id: call.id.clone(),
                tool: call.name.clone(),
                ok: true,
                duration_ms: 0,
                output,
                error: None,
            }];
            for check in &report.checks {
                events.push(EventKind::Verify {
                    step: self.steps,
                    call_id: call.id.clone(),
                    passed: check.passed,
                    rule: check.rule.clone(),
                    detail: check.detail.clone(),
                });
            }
            let message = Message::Tool {
                call_id: call.id.clone(),
                name: call.name.clone(),
                content,
                is_error: report.withhold,
            };
            self.commit(events, vec![message]).await?;
        }
        Ok(Flow::Continue)
    }
}
