//! The event log: an append-only, numbered record of everything a run did.
//!
//! Names and fields follow SPEC §3 exactly; optional fields are omitted
//! rather than sent as `null`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{ErrorBody, Usage};

/// What the model decided at a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Action {
    Respond,
    CallTool,
    Clarify,
}

/// What the loop decided about a proposal (`policy_decision.decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Execute,
    Clarify,
    Fallback,
    Deny,
    Approve,
    Respond,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Execute => "execute",
            Self::Clarify => "clarify",
            Self::Fallback => "fallback",
            Self::Deny => "deny",
            Self::Approve => "approve",
            Self::Respond => "respond",
        }
    }
}

/// What a `react_feedback` event reports: a correction fed back to the
/// model or the loop (SPEC §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FeedbackCode {
    ClarifyWithoutActionableTool,
    MissingRequiredArguments,
    InvalidArguments,
    UnknownTool,
    ToolError,
    DeniedByPolicy,
    ApprovalDenied,
    VerifyFailed,
    LoopWarning,
    LoopBlocked,
    BudgetExhausted,
    DriftCorrection,
    CheckpointRestored,
}

impl FeedbackCode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClarifyWithoutActionableTool => "clarify_without_actionable_tool",
            Self::MissingRequiredArguments => "missing_required_arguments",
            Self::InvalidArguments => "invalid_arguments",
            Self::UnknownTool => "unknown_tool",
            Self::ToolError => "tool_error",
            Self::DeniedByPolicy => "denied_by_policy",
            Self::ApprovalDenied => "approval_denied",
            Self::VerifyFailed => "verify_failed",
            Self::LoopWarning => "loop_warning",
            Self::LoopBlocked => "loop_blocked",
            Self::BudgetExhausted => "budget_exhausted",
            Self::DriftCorrection => "drift_correction",
            Self::CheckpointRestored => "checkpoint_restored",
        }
    }
}

impl std::fmt::Display for FeedbackCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which loop detector fired (`loop_detected.detector`, SPEC §4.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LoopDetector {
    GenericRepeat,
    KnownPollNoProgress,
    PingPong,
    GlobalCircuitBreaker,
    UnknownToolRepeat,
    ErrorStreak,
}

impl LoopDetector {
    /// The name used in `loop_detected` events and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GenericRepeat => "generic_repeat",
            Self::KnownPollNoProgress => "known_poll_no_progress",
            Self::PingPong => "ping_pong",
            Self::GlobalCircuitBreaker => "global_circuit_breaker",
            Self::UnknownToolRepeat => "unknown_tool_repeat",
            Self::ErrorStreak => "error_streak",
        }
    }
}

/// How serious a loop hit is; ordered so that `Critical > Warning`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LoopLevel {
    /// The call runs; the model is warned.
    Warning,
    /// The call is blocked.
    Critical,
}

impl LoopLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Warning => "warning",
            Self::Critical => "critical",
        }
    }
}

/// Why a run completed (`run_completed.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CompletionReason {
    /// The model answered.
    Answered,
    /// The run answered without tools because it could not go on with them
    /// (a clarification that unblocked nothing, repairs or questions used up).
    Fallback,
    /// A budget ran out; the answer is from what was known.
    BudgetExhausted,
    /// Loop detection ended the run.
    LoopBlocked,
}

impl CompletionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::Fallback => "fallback",
            Self::BudgetExhausted => "budget_exhausted",
            Self::LoopBlocked => "loop_blocked",
        }
    }
}

impl std::fmt::Display for CompletionReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a `channel_delivery` event sent back to a chat channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryKind {
    Answer,
    Question,
    Approval,
}

/// A client tool call handed to the caller (`waiting_client_tool.calls`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClientCall {
    pub call_id: String,
    pub name: String,
    /// The arguments as JSON text, as the Responses API carries them.
    pub arguments: String,
}

/// One call as the model proposed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PlannedCall {
    pub call_id: String,
    pub tool: String,
    pub arguments: Value,
}

/// A persisted event: common fields plus the typed payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Event {
    pub run_id: String,
    pub seq: u64,
    #[serde(serialize_with = "crate::timestamp::serialize")]
    pub ts: DateTime<Utc>,
    #[serde(flatten)]
    pub kind: EventKind,
    /// The event as JSON, once written: see [`Event::json`].
    #[serde(skip)]
    encoded: Encoded,
}

/// An event's JSON text, kept once made. An event is not changed once
/// numbered, so it is the same text whoever asks; it takes no part in
/// comparing or printing events.
#[derive(Clone, Default)]
struct Encoded(std::sync::OnceLock<std::sync::Arc<str>>);

impl PartialEq for Encoded {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Encoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("..")
    }
}

impl Event {
    pub fn new(run_id: impl Into<String>, seq: u64, ts: DateTime<Utc>, kind: EventKind) -> Self {
        Self {
            run_id: run_id.into(),
            seq,
            ts,
            kind,
            encoded: Encoded::default(),
        }
    }

    /// The event as JSON. Made once: the store writes this text and the
    /// event stream sends it, where each used to serialize the event anew.
    /// An event built to differ from a stored one is a new [`Event::new`],
    /// never a changed copy, whose text would be the original's.
    pub fn json(&self) -> Result<&str, serde_json::Error> {
        if let Some(text) = self.encoded.0.get() {
            return Ok(text);
        }
        let text = self.encode()?;
        Ok(self.encoded.0.get_or_init(|| text.into()))
    }

    /// The text the derived `Serialize` writes, made faster: serde writes a
    /// `#[serde(flatten)]` field through a map serializer that handles each
    /// field of the payload as a map entry. Here the three common fields are
    /// written first, then the payload's own object (an internally tagged
    /// enum, so always an object opening with its `type`) with its opening
    /// brace dropped: the same fields, in the same order.
    fn encode(&self) -> Result<String, serde_json::Error> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"{\"run_id\":");
        serde_json::to_writer(&mut out, &self.run_id)?;
        out.extend_from_slice(b",\"seq\":");
        serde_json::to_writer(&mut out, &self.seq)?;
        out.extend_from_slice(b",\"ts\":");
        crate::timestamp::serialize(&self.ts, &mut serde_json::Serializer::new(&mut out))?;
        let payload_at = out.len();
        serde_json::to_writer(&mut out, &self.kind)?;
        match out.get(payload_at) {
            Some(b'{') => out[payload_at] = b',',
            _ => {
                return Err(serde::ser::Error::custom(
                    "an event's payload must serialize as an object",
                ));
            }
        }
        // serde_json writes valid UTF-8 only; the check costs a pass over
        // the text and keeps this free of `unsafe`.
        String::from_utf8(out).map_err(serde::ser::Error::custom)
    }

    pub fn type_name(&self) -> &'static str {
        self.kind.type_name()
    }

    /// Whether the run ends with this event (the stream closes after it).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.kind,
            EventKind::RunCompleted { .. }
                | EventKind::RunFailed { .. }
                | EventKind::RunCancelled { .. }
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    RunStarted {
        input: String,
        session: String,
        agent: String,
        /// The run's metadata, as given when it was started (for a run
        /// from a chat channel: the channel and `matched_by`).
        #[serde(default, skip_serializing_if = "Value::is_null")]
        #[schema(value_type = Option<Object>)]
        metadata: Value,
    },
    ModeDecision {
        mode: String,
        source: String,
    },
    ReactPlan {
        step: u32,
        action: Action,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<PlannedCall>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        intent: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        confidence: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        missing_slots: Option<Vec<String>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        brief_rationale: Option<String>,
    },
    PolicyDecision {
        step: u32,
        decision: Decision,
        reason: String,
        rule: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
    },
    ToolCall {
        step: u32,
        call_id: String,
        tool: String,
        arguments: Value,
    },
    ToolResult {
        step: u32,
        call_id: String,
        tool: String,
        ok: bool,
        duration_ms: u64,
        output: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    Verify {
        step: u32,
        call_id: String,
        passed: bool,
        rule: String,
        detail: String,
    },
    ReactFeedback {
        step: u32,
        code: FeedbackCode,
        detail: String,
    },
    ClarificationNeeded {
        question: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
        missing_slots: Vec<String>,
        round: u32,
    },
    /// Clarification rounds ran out and the agent hands the question to a
    /// person, who answers through the same input endpoint.
    HandoffRequested {
        question: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
        missing_slots: Vec<String>,
        reason: String,
    },
    /// The run handed client tool calls to the caller and waits for their
    /// outputs.
    WaitingClientTool {
        calls: Vec<ClientCall>,
    },
    ApprovalRequired {
        approval_id: String,
        tool: String,
        arguments: Value,
        risk: crate::Risk,
        reason: String,
    },
    ApprovalResolved {
        approval_id: String,
        decision: String,
        by: String,
        reason: String,
    },
    LoopDetected {
        detector: LoopDetector,
        level: LoopLevel,
        tool: String,
        count: u32,
    },
    DriftDetected {
        score: f64,
        reason: String,
    },
    Reflection {
        on_track: bool,
        note: String,
    },
    Checkpoint {
        checkpoint_id: String,
        step: u32,
    },
    ContextReset {
        checkpoint_id: String,
        kept: Value,
    },
    Compaction {
        tokens_before: u64,
        tokens_after: u64,
        mode: String,
    },
    SteeringApplied {
        text: String,
        skipped_calls: Vec<String>,
    },
    FollowUpStarted {
        text: String,
    },
    MessageDelta {
        text: String,
    },
    Final {
        answer: String,
    },
    /// One attempt at sending the answer, a question or an approval
    /// request back to the chat channel the run came from.
    ChannelDelivery {
        channel: String,
        what: DeliveryKind,
        attempt: u32,
        ok: bool,
        detail: String,
    },
    RunCompleted {
        reason: CompletionReason,
        usage: Usage,
    },
    RunFailed {
        error: ErrorBody,
    },
    RunCancelled {
        by: String,
    },
}

impl EventKind {
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::RunStarted { .. } => "run_started",
            Self::ModeDecision { .. } => "mode_decision",
            Self::ReactPlan { .. } => "react_plan",
            Self::PolicyDecision { .. } => "policy_decision",
            Self::ToolCall { .. } => "tool_call",
            Self::ToolResult { .. } => "tool_result",
            Self::Verify { .. } => "verify",
            Self::ReactFeedback { .. } => "react_feedback",
            Self::ClarificationNeeded { .. } => "clarification_needed",
            Self::HandoffRequested { .. } => "handoff_requested",
            Self::WaitingClientTool { .. } => "waiting_client_tool",
            Self::ApprovalRequired { .. } => "approval_required",
            Self::ApprovalResolved { .. } => "approval_resolved",
            Self::LoopDetected { .. } => "loop_detected",
            Self::DriftDetected { .. } => "drift_detected",
            Self::Reflection { .. } => "reflection",
            Self::Checkpoint { .. } => "checkpoint",
            Self::ContextReset { .. } => "context_reset",
            Self::Compaction { .. } => "compaction",
            Self::SteeringApplied { .. } => "steering_applied",
            Self::FollowUpStarted { .. } => "follow_up_started",
            Self::MessageDelta { .. } => "message_delta",
            Self::Final { .. } => "final",
            Self::ChannelDelivery { .. } => "channel_delivery",
            Self::RunCompleted { .. } => "run_completed",
            Self::RunFailed { .. } => "run_failed",
            Self::RunCancelled { .. } => "run_cancelled",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_serializes_with_common_fields_and_type() {
        let e = Event::new(
            "run_1",
            3,
            chrono::Utc::now(),
            EventKind::Final {
                answer: "42".into(),
            },
        );
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(e.json().unwrap()).unwrap(),
            v,
            "the kept text is the event's JSON"
        );
        assert_eq!(v["type"], "final");
        assert_eq!(v["seq"], 3);
        assert_eq!(v["run_id"], "run_1");
        assert_eq!(v["answer"], "42");
        let back: Event = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);
    }

    /// `Event::json` writes its text by hand; it must be the derived
    /// `Serialize`'s text byte for byte, escapes, optional fields and
    /// nested JSON included, since stored events are read back with the
    /// derived `Deserialize`.
    #[test]
    fn kept_text_is_the_derived_serialization() {
        let ts = chrono::DateTime::parse_from_rfc3339("2026-11-28T01:02:03.456789Z")
            .unwrap()
            .with_timezone(&Utc);
        let kinds = [
            EventKind::RunStarted {
                input: "line one\nline \"two\" é 漢 \u{1}".into(),
                session: "s".into(),
                agent: "default".into(),
                metadata: serde_json::json!({"channel": "slack", "n": [1, 2.5]}),
            },
            EventKind::RunStarted {
                input: String::new(),
                session: "s".into(),
                agent: "a".into(),
                metadata: Value::Null,
            },
            EventKind::ReactPlan {
                step: 7,
                action: Action::CallTool,
                tool_calls: vec![PlannedCall {
                    call_id: "call_1".into(),
                    tool: "lookup".into(),
                    arguments: serde_json::json!({"key": "k\t1", "deep": {"x": null}}),
                }],
                intent: Some("find \\ it".into()),
                confidence: Some(0.5),
                missing_slots: None,
                brief_rationale: None,
            },
            EventKind::PolicyDecision {
                step: 1,
                decision: Decision::Execute,
                reason: "ok".into(),
                rule: "default".into(),
                call_id: Some("call_1".into()),
            },
            EventKind::ToolResult {
                step: 1,
                call_id: "call_1".into(),
                tool: "lookup".into(),
                ok: false,
                duration_ms: u64::MAX,
                output: "<tool_output>\r\n</tool_output>".into(),
                error: Some("timed out".into()),
            },
            EventKind::Final {
                answer: "done".into(),
            },
        ];
        for (i, kind) in kinds.into_iter().enumerate() {
            let e = Event::new(format!("run_\"{i}\""), u64::MAX - i as u64, ts, kind);
            assert_eq!(e.json().unwrap(), serde_json::to_string(&e).unwrap());
            let back: Event = serde_json::from_str(e.json().unwrap()).unwrap();
            assert_eq!(back, e);
        }
    }

    #[test]
    fn type_name_matches_serialized_tag() {
        let k = EventKind::ReactFeedback {
            step: 1,
            code: FeedbackCode::UnknownTool,
            detail: String::new(),
        };
        let v = serde_json::to_value(&k).unwrap();
        assert_eq!(v["type"], k.type_name());
        let plan = EventKind::ReactPlan {
            step: 1,
            action: Action::CallTool,
            tool_calls: vec![],
            intent: None,
            confidence: None,
            missing_slots: None,
            brief_rationale: None,
        };
        let v = serde_json::to_value(&plan).unwrap();
        assert_eq!(v["action"], "CALL_TOOL");
        assert!(v.get("intent").is_none());
    }
}
