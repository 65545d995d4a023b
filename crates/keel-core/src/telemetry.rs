//! Metrics derived from the events a run commits, so that what `/metrics`
//! counts is exactly what the event log says happened.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use keel_protocol::{Event, EventKind};

/// (successful, finished) runs per agent since this process started.
fn outcomes() -> &'static Mutex<HashMap<String, (u64, u64)>> {
    static OUTCOMES: OnceLock<Mutex<HashMap<String, (u64, u64)>>> = OnceLock::new();
    OUTCOMES.get_or_init(|| Mutex::new(HashMap::new()))
}

pub fn record(agent: &str, events: &[Event]) {
    for e in events {
        match &e.kind {
            EventKind::PolicyDecision { decision, .. } => {
                metrics::counter!("keel_policy_decisions_total", "decision" => decision.as_str())
                    .increment(1);
            }
            EventKind::LoopDetected {
                detector, level, ..
            } if *level == keel_protocol::LoopLevel::Critical => {
                metrics::counter!("keel_loop_blocks_total", "detector" => detector.as_str())
                    .increment(1);
            }
            EventKind::RunCompleted { reason, .. } => {
                metrics::counter!("keel_runs_total", "status" => "completed").increment(1);
                finished(agent, *reason == keel_protocol::CompletionReason::Answered);
            }
            EventKind::RunFailed { .. } => {
                metrics::counter!("keel_runs_total", "status" => "failed").increment(1);
                finished(agent, false);
            }
            EventKind::RunCancelled { .. } => {
                metrics::counter!("keel_runs_total", "status" => "cancelled").increment(1);
                finished(agent, false);
            }
            _ => {}
        }
    }
}

/// A task succeeds when the run ends with a direct answer (not a fallback,
/// a budget stop, a loop block, a failure or a cancellation).
fn finished(agent: &str, success: bool) {
    let mut map = outcomes().lock().unwrap_or_else(|p| p.into_inner());
    let entry = map.entry(agent.to_owned()).or_insert((0, 0));
    entry.1 += 1;
    if success {
        entry.0 += 1;
    }
    let ratio = entry.0 as f64 / entry.1 as f64;
    metrics::gauge!("keel_task_success_ratio", "agent" => agent.to_owned()).set(ratio);
}
