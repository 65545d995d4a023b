//! A readable, live rendering of a run's events for the terminal.

use std::io::Write;

use keel_protocol::{Event, EventKind};

pub struct Timeline {
    json: bool,
    in_delta: bool,
}

impl Timeline {
    pub fn new(json: bool) -> Self {
        Self {
            json,
            in_delta: false,
        }
    }

    pub fn print(&mut self, e: &Event) {
        let mut out = std::io::stdout().lock();
        if self.json {
            let _ = writeln!(out, "{}", serde_json::to_string(e).unwrap_or_default());
            return;
        }
        if let EventKind::MessageDelta { text } = &e.kind {
            if !self.in_delta {
                let _ = write!(out, "  … ");
                self.in_delta = true;
            }
            let _ = write!(out, "{text}");
            let _ = out.flush();
            return;
        }
        if self.in_delta {
            let _ = writeln!(out);
            self.in_delta = false;
        }
        let line = match &e.kind {
            EventKind::RunStarted { agent, session, .. } => {
                format!("▶ run started (agent {agent}, session {session})")
            }
            EventKind::ReactPlan {
                step,
                action,
                tool_calls,
                ..
            } => {
                let names: Vec<&str> = tool_calls.iter().map(|c| c.tool.as_str()).collect();
                format!("· step {step}: {action:?} {}", names.join(", "))
            }
            EventKind::PolicyDecision {
                decision,
                rule,
                reason,
                ..
            } => {
                format!("  policy: {} ({rule}): {reason}", decision.as_str())
            }
            EventKind::ToolCall {
                tool, arguments, ..
            } => format!("→ {tool} {arguments}"),
            EventKind::ToolResult {
                tool,
                ok,
                duration_ms,
                output,
                error,
                ..
            } => {
                let text = if *ok {
                    short(output)
                } else {
                    error.clone().unwrap_or_default()
                };
                format!(
                    "← {tool} {} in {duration_ms} ms: {text}",
                    if *ok { "ok" } else { "failed" }
                )
            }
            EventKind::ReactFeedback { code, detail, .. } => format!("  ! {code}: {detail}"),
            EventKind::ClarificationNeeded { question, .. } => format!("? {question}"),
            EventKind::HandoffRequested {
                question, reason, ..
            } => {
                format!("? {question} (handed to a person: {reason})")
            }
            EventKind::SteeringApplied { text, .. } => format!("↪ steered: {text}"),
            EventKind::FollowUpStarted { text } => format!("↪ follow-up: {text}"),
            EventKind::Final { answer } => format!("\n{answer}\n"),
            EventKind::RunCompleted { reason, usage } => format!(
                "✔ completed ({reason}): {} model calls, {} tool calls, {} tokens",
                usage.llm_calls,
                usage.tool_calls,
                usage.prompt_tokens + usage.completion_tokens
            ),
            EventKind::RunFailed { error } => {
                format!("✘ failed: {} ({})", error.message, error.code)
            }
            EventKind::RunCancelled { by } => format!("✘ cancelled by {by}"),
            other => format!("  {}", other.type_name()),
        };
        let _ = writeln!(out, "{line}");
    }
}

fn short(s: &str) -> String {
    let one_line = s.replace('\n', " ");
    if one_line.chars().count() > 160 {
        format!("{}…", one_line.chars().take(160).collect::<String>())
    } else {
        one_line
    }
}
