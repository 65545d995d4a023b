//! Spans after OpenTelemetry's GenAI semantic conventions: `invoke_agent`
//! per run, `chat` per model call, `execute_tool` per tool call, guard
//! decisions as span events (docs/telemetry.md).
//!
//! They are `tracing` spans of target [`TARGET`]: keel-core does not know
//! whether or where they are exported. The binary exports them over OTLP
//! when telemetry is configured; otherwise no subscriber takes this target
//! and a span costs next to nothing.

use std::sync::atomic::{AtomicBool, Ordering};

use keel_protocol::{EventKind, ModelResponse, ToolOutput};
use tracing::Span;
use tracing::field::Empty;

/// The `tracing` target of every span and span event of this module.
pub const TARGET: &str = "keel::otel";

/// Whether prompts, outputs, tool arguments and results go into spans.
static CAPTURE_CONTENT: AtomicBool = AtomicBool::new(false);

/// Off by default: contents may hold personal or secret data.
pub fn set_capture_content(on: bool) {
    CAPTURE_CONTENT.store(on, Ordering::Relaxed);
}

fn capture_content() -> bool {
    CAPTURE_CONTENT.load(Ordering::Relaxed)
}

/// The span of one run (on this node: a run resumed elsewhere has one
/// there too, with the same `keel.run_id`).
pub(crate) fn invoke_agent(run_id: &str, tenant: &str, session: &str, agent: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "invoke_agent",
        otel.name = %format!("invoke_agent {agent}"),
        otel.kind = "internal",
        otel.status_code = Empty,
        "gen_ai.operation.name" = "invoke_agent",
        "gen_ai.agent.name" = agent,
        "gen_ai.agent.id" = agent,
        "gen_ai.conversation.id" = session,
        "keel.run_id" = run_id,
        "keel.tenant" = tenant,
        "keel.session" = session,
        "keel.completion_reason" = Empty,
        "gen_ai.usage.input_tokens" = Empty,
        "gen_ai.usage.output_tokens" = Empty,
    )
}

/// The span of one model call.
pub(crate) fn chat(model: &str, run_id: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "chat",
        otel.name = %format!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        "gen_ai.operation.name" = "chat",
        "gen_ai.request.model" = model,
        "gen_ai.usage.input_tokens" = Empty,
        "gen_ai.usage.output_tokens" = Empty,
        "gen_ai.response.finish_reasons" = Empty,
        "gen_ai.output.messages" = Empty,
        "keel.run_id" = run_id,
        "error.type" = Empty,
    )
}

/// What the model answered, on its `chat` span.
pub(crate) fn record_chat(span: &Span, response: &ModelResponse) {
    // Recording on a span no subscriber took does nothing, but the finish
    // reasons' JSON text would still be built for every model call.
    if span.is_disabled() {
        return;
    }
    span.record(
        "gen_ai.usage.input_tokens",
        int(response.usage.prompt_tokens),
    );
    span.record(
        "gen_ai.usage.output_tokens",
        int(response.usage.completion_tokens),
    );
    let finish = response
        .finish_reason
        .as_deref()
        .unwrap_or(if response.tool_calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        });
    // The convention's value is an array; a one-element JSON array says so.
    span.record(
        "gen_ai.response.finish_reasons",
        serde_json::json!([finish]).to_string(),
    );
    if capture_content() {
        span.record("gen_ai.output.messages", response.text.as_str());
    }
}

/// OTLP integers are signed: a `u64` would be exported as a string.
fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A model call that failed, on its `chat` span.
pub(crate) fn record_error(span: &Span, kind: &str) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", kind);
}

/// The span of one tool call that runs.
pub(crate) fn execute_tool(tool: &str, call_id: &str, run_id: &str, arguments: &str) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "execute_tool",
        otel.name = %format!("execute_tool {tool}"),
        otel.kind = "internal",
        otel.status_code = Empty,
        "gen_ai.operation.name" = "execute_tool",
        "gen_ai.tool.name" = tool,
        "gen_ai.tool.call.id" = call_id,
        "gen_ai.tool.type" = "function",
        "gen_ai.tool.call.arguments" = Empty,
        "gen_ai.tool.call.result" = Empty,
        "keel.run_id" = run_id,
        "keel.outcome" = Empty,
        "error.type" = Empty,
    );
    if capture_content() {
        span.record("gen_ai.tool.call.arguments", arguments);
    }
    span
}

/// How the tool call ended, on its `execute_tool` span.
pub(crate) fn record_tool(span: &Span, outcome: &Result<ToolOutput, String>) {
    match outcome {
        Ok(output) => {
            let ok = !output.is_error;
            span.record("keel.outcome", if ok { "ok" } else { "error" });
            if !ok {
                span.record("otel.status_code", "ERROR");
                span.record("error.type", "tool_error");
            }
            if capture_content() {
                span.record("gen_ai.tool.call.result", output.content.as_str());
            }
        }
        Err(error) => {
            span.record("keel.outcome", "error");
            span.record("otel.status_code", "ERROR");
            span.record("error.type", "tool_error");
            if capture_content() {
                span.record("gen_ai.tool.call.result", error.as_str());
            }
        }
    }
}

/// How the run ended, on its `invoke_agent` span.
pub(crate) fn record_end(span: &Span, kind: &EventKind) {
    match kind {
        EventKind::RunCompleted { reason, usage } => {
            span.record("keel.completion_reason", reason.as_str());
            span.record("gen_ai.usage.input_tokens", int(usage.prompt_tokens));
            span.record("gen_ai.usage.output_tokens", int(usage.completion_tokens));
        }
        EventKind::RunFailed { .. } => {
            span.record("otel.status_code", "ERROR");
        }
        _ => {}
    }
}

/// A guard's decision as an event of the current span: the run's, or the
/// tool call's when it happens while the tool runs.
pub(crate) fn guard_event(kind: &EventKind) {
    match kind {
        EventKind::PolicyDecision {
            decision,
            rule,
            call_id,
            ..
        } => tracing::event!(
            name: "policy_decision",
            target: TARGET,
            tracing::Level::INFO,
            keel.decision = decision.as_str(),
            keel.rule = rule.as_str(),
            gen_ai.tool.call.id = call_id.as_deref().unwrap_or(""),
            "policy_decision"
        ),
        EventKind::Verify {
            passed,
            rule,
            call_id,
            ..
        } => tracing::event!(
            name: "verify",
            target: TARGET,
            tracing::Level::INFO,
            keel.passed = *passed,
            keel.rule = rule.as_str(),
            gen_ai.tool.call.id = call_id.as_str(),
            "verify"
        ),
        EventKind::LoopDetected { .. }
        | EventKind::DriftDetected { .. }
        | EventKind::ApprovalRequired { .. }
        | EventKind::ApprovalResolved { .. }
        | EventKind::ClarificationNeeded { .. }
        | EventKind::ReactFeedback { .. } => {
            let name = kind.type_name();
            tracing::event!(
                name: "guard",
                target: TARGET,
                tracing::Level::INFO,
                keel.event = name,
                "{name}"
            );
        }
        _ => {}
    }
}
