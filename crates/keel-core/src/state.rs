//! The loop's own bookkeeping, persisted with every commit so that a
//! restarted node continues exactly where the run stood.

use std::collections::{BTreeMap, VecDeque};

use keel_protocol::{Pending, Risk};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoopState {
    #[serde(default)]
    pub clarify_rounds: u32,
    /// Consecutive repair turns per tool (reset when a call to it passes the guard).
    #[serde(default)]
    pub repairs: BTreeMap<String, u32>,
    #[serde(default)]
    pub follow_ups: VecDeque<String>,
    #[serde(default)]
    pub waiting: Option<Waiting>,
    #[serde(default)]
    pub awaiting_approval: Option<AwaitingApproval>,
    /// Every call of this run as loop detection sees it. Only its counters
    /// are part of the state: each commit hands the store the records made
    /// since the last, and a loaded run gets them back from there.
    #[serde(default)]
    pub calls: keel_guard::loop_detect::CallHistory,
    /// Critical loop hits so far: the first blocks a call, the second ends the run.
    #[serde(default)]
    pub loop_criticals: u32,
    /// The run's answer is already known (a session command such as `/new`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canned_answer: Option<String>,
    /// Functions the caller executes itself, declared when the run started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_tools: Vec<keel_protocol::ToolSchema>,
    /// Client tool calls handed to the caller, awaiting their outputs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_waiting: Vec<keel_protocol::ToolCall>,
    /// Seconds the run spent waiting for people; excluded from `max_wall_time`.
    #[serde(default)]
    pub waited_s: f64,
    /// Goal, drift trace, checkpoints and the context view (SPEC §4.12–4.13).
    #[serde(default)]
    pub course: crate::course::Course,
}

impl LoopState {
    pub fn from_value(v: &Value) -> Self {
        serde_json::from_value(v.clone()).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    /// A real tool call lacks required arguments.
    MissingArguments,
    /// The model asked through `clarify`.
    Clarify,
    /// A policy rule wants the user to confirm the call first (for
    /// example: the model was not confident enough).
    Confirm,
}

/// A call held until the user answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Waiting {
    pub kind: WaitKind,
    pub step: u32,
    pub call_id: String,
    /// The tool whose arguments are missing.
    pub tool: String,
    pub arguments: Value,
    pub slots: Vec<String>,
    pub question: String,
    pub round: u32,
    /// Clarification rounds ran out and the question went to a person.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handoff: bool,
}

impl Waiting {
    /// The held call, as the model made it (`clarify` for a clarification).
    pub fn call(&self) -> keel_protocol::ToolCall {
        keel_protocol::ToolCall {
            id: self.call_id.clone(),
            name: match self.kind {
                WaitKind::Clarify => crate::clarify::CLARIFY_TOOL.into(),
                WaitKind::MissingArguments | WaitKind::Confirm => self.tool.clone(),
            },
            arguments: String::new(),
        }
    }

    /// The run's public `pending` field.
    pub fn pending(&self) -> Pending {
        Pending::Input {
            question: self.question.clone(),
            tool: self.tool.clone(),
            missing_slots: self.slots.clone(),
            round: self.round,
            handoff: self.handoff,
        }
    }
}

/// A call held until a person approves or denies it. It binds the exact
/// tool and arguments that were shown to the approver.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AwaitingApproval {
    pub approval_id: String,
    pub step: u32,
    pub call_id: String,
    pub tool: String,
    pub arguments: Value,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

impl AwaitingApproval {
    /// The run's public `pending` field.
    pub fn pending(&self, risk: Risk, reason: &str) -> Pending {
        Pending::Approval {
            approval_id: self.approval_id.clone(),
            tool: self.tool.clone(),
            arguments: self.arguments.clone(),
            risk,
            reason: reason.to_owned(),
            expires_at: self.expires_at,
        }
    }
}
