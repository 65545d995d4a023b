//! Follows one stretch of a run until it ends or stops for the client.
//!
//! The run's own events say when it stops: `waiting_client_tool` (outputs
//! of client tools are needed), `clarification_needed` or
//! `handoff_requested` (an answer is needed), or a terminal event. Each is
//! committed together with the run's status, so once it is read the stretch
//! is complete.

use keel_core::Runtime;
use keel_protocol::{EventKind, Pending, RunRecord, Usage};
use serde_json::Value;
use tokio::sync::mpsc;

use super::encoder::{Encoder, End};

/// Where a stretch of a run starts.
pub struct Segment {
    pub tenant: String,
    pub run_id: String,
    /// Events after this sequence number belong to the response.
    pub start: u64,
    /// The run's usage when the stretch began; the response reports the difference.
    pub baseline: Usage,
}

/// The client went away (streaming only); the run itself goes on.
pub struct Gone;

/// Runs the encoder over the stretch; stream events go to `sink` when given.
/// Returns the final response object.
pub async fn drive(
    runtime: &Runtime,
    seg: &Segment,
    enc: &mut Encoder,
    sink: Option<&mpsc::Sender<Value>>,
) -> Result<Value, Gone> {
    emit(sink, enc.begin()).await?;
    let mut events = keel_core::follow::follow(runtime.clone(), seg.run_id.clone(), seg.start);
    let end = loop {
        let Some(e) = events.recv().await else {
            // The follower stops only on a terminal event or a store failure.
            tracing::warn!(run = %seg.run_id, "lost the run's event stream");
            break (
                End::Failed {
                    code: "store_unavailable".into(),
                    message: "lost the run's event stream; the run goes on: see /ai/runs".into(),
                },
                current_usage(runtime, seg).await,
            );
        };
        let out = enc.on_event(&e);
        emit(sink, out).await?;
        match &e.kind {
            EventKind::RunCompleted { usage, .. } => break (End::Completed, *usage),
            EventKind::RunFailed { error } => {
                break (
                    End::Failed {
                        code: error.code.clone(),
                        message: error.message.clone(),
                    },
                    current_usage(runtime, seg).await,
                );
            }
            EventKind::RunCancelled { by } => {
                break (
                    End::Cancelled { by: by.clone() },
                    current_usage(runtime, seg).await,
                );
            }
            EventKind::WaitingClientTool { calls } => {
                let calls: Vec<(String, String, String)> = calls
                    .iter()
                    .map(|c| (c.call_id.clone(), c.name.clone(), c.arguments.clone()))
                    .collect();
                let out = enc.ensure_calls(&calls);
                emit(sink, out).await?;
                break (End::Completed, current_usage(runtime, seg).await);
            }
            EventKind::ClarificationNeeded { .. } | EventKind::HandoffRequested { .. } => {
                break (End::Completed, current_usage(runtime, seg).await);
            }
            _ => {}
        }
    };
    // Every ending reports the run's total usage; the response owns the difference.
    let (end, total) = end;
    let (out, response) = enc.finish(&end, minus(total, seg.baseline));
    emit(sink, out).await?;
    Ok(response)
}

async fn emit(sink: Option<&mpsc::Sender<Value>>, events: Vec<Value>) -> Result<(), Gone> {
    let Some(sink) = sink else { return Ok(()) };
    for e in events {
        sink.send(e).await.map_err(|_| Gone)?;
    }
    Ok(())
}

/// `(call_id, name, arguments)` of the client calls a run waits for.
pub fn pending_calls(run: &RunRecord) -> Vec<(String, String, String)> {
    match &run.pending {
        Some(Pending::ClientTool { calls }) => calls
            .iter()
            .map(|c| (c.call_id.clone(), c.name.clone(), c.arguments.clone()))
            .collect(),
        _ => Vec::new(),
    }
}

async fn current_usage(runtime: &Runtime, seg: &Segment) -> Usage {
    runtime
        .get_run(&seg.tenant, &seg.run_id)
        .await
        .map(|r| r.usage)
        .unwrap_or(seg.baseline)
}

fn minus(a: Usage, b: Usage) -> Usage {
    Usage {
        llm_calls: a.llm_calls.saturating_sub(b.llm_calls),
        tool_calls: a.tool_calls.saturating_sub(b.tool_calls),
        prompt_tokens: a.prompt_tokens.saturating_sub(b.prompt_tokens),
        completion_tokens: a.completion_tokens.saturating_sub(b.completion_tokens),
    }
}
