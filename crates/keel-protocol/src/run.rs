//! Runs: one user input processed to an outcome.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Queued,
    Running,
    WaitingInput,
    WaitingApproval,
    Completed,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::WaitingInput => "waiting_input",
            Self::WaitingApproval => "waiting_approval",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "waiting_input" => Self::WaitingInput,
            "waiting_approval" => Self::WaitingApproval,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            _ => return None,
        })
    }
}

/// What a run has consumed so far; budgets are checked against it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    pub llm_calls: u64,
    pub tool_calls: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// A budget of a run (SPEC §4.11); when one runs out the run answers from
/// what is known and completes with `budget_exhausted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    MaxSteps,
    MaxToolCalls,
    MaxWallTime,
    MaxTokens,
    MaxContextChars,
    /// A limit shared by many runs: a tenant's quota (`[[tenants]]`) or a
    /// tenant's or an agent's spend.
    Quota(crate::QuotaLimit),
}

impl Budget {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxSteps => "max_steps",
            Self::MaxToolCalls => "max_tool_calls",
            Self::MaxWallTime => "max_wall_time",
            Self::MaxTokens => "max_tokens",
            Self::MaxContextChars => "max_context_chars",
            Self::Quota(limit) => limit.as_str(),
        }
    }

    /// A limit shared by many runs rather than this run's own: no further
    /// model call may be made for it, not even for a closing answer.
    pub fn is_shared(self) -> bool {
        matches!(self, Self::Quota(_))
    }

    /// When a shared limit frees up, for the answer of a run it stopped.
    pub fn resets(self) -> &'static str {
        use crate::QuotaLimit::{AgentSpendUsdPerMonth, SpendUsdPerMonth};
        match self {
            Self::Quota(SpendUsdPerMonth | AgentSpendUsdPerMonth) => {
                "at the start of the next UTC month"
            }
            _ => "at the start of the next UTC day",
        }
    }
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `{"code","message"}` pair used both in HTTP errors and in `run_failed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }
}

/// What a waiting run waits for: the run's public `pending` field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Pending {
    /// An answer from the user (`waiting_input`): to a clarification, or,
    /// after a handoff, from a person.
    Input {
        question: String,
        /// The tool the answer unblocks.
        tool: String,
        missing_slots: Vec<String>,
        round: u32,
        /// Clarification rounds ran out and a person is asked instead.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        handoff: bool,
    },
    /// A person's decision on a call (`waiting_approval`).
    Approval {
        approval_id: String,
        tool: String,
        arguments: serde_json::Value,
        risk: crate::Risk,
        reason: String,
        expires_at: DateTime<Utc>,
    },
    /// Outputs of client tool calls (`waiting_input`, Responses API).
    ClientTool { calls: Vec<crate::ClientCall> },
}

/// A run as stored and as returned by `GET /ai/runs/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunRecord {
    pub id: String,
    pub tenant: String,
    pub session: String,
    pub agent: String,
    pub status: RunStatus,
    pub input: String,
    pub output: Option<String>,
    /// What the run waits for (an answer, an approval, client tool
    /// outputs), when it waits.
    pub pending: Option<Pending>,
    pub steps: u32,
    pub usage: Usage,
    pub error: Option<ErrorBody>,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub metadata: serde_json::Value,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The loop's own bookkeeping (counters, pending call); never shown to clients.
    #[serde(skip)]
    pub state: serde_json::Value,
    /// The principal that started the run; tools run on its behalf after a restart.
    #[serde(skip)]
    pub principal: Option<crate::Principal>,
    /// Highest event sequence number written so far.
    #[serde(skip)]
    pub last_seq: u64,
}
