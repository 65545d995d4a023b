//! The store port: runs, sessions, messages and the event log.
//!
//! Every change a step makes (events, messages, run fields) is written in one
//! [`Commit`], atomically, before any event of it is published.

use serde_json::Value;

use crate::{ErrorBody, Event, EventKind, Message, Principal, RunRecord, RunStatus, Usage};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("storage failure: {0}")]
    Backend(String),
    /// This node no longer owns the run (its lease expired or another node
    /// took it over): nothing was written.
    #[error("lease lost: {0}")]
    LeaseLost(String),
}

/// A run to create.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub id: String,
    pub principal: Principal,
    pub session: String,
    pub agent: String,
    pub input: String,
    pub idempotency_key: Option<String>,
    pub metadata: Value,
}

/// Run fields to change; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct RunPatch {
    pub status: Option<RunStatus>,
    pub output: Option<String>,
    /// `Some(None)` clears it; `None` keeps it.
    pub pending: Option<Option<crate::Pending>>,
    pub steps: Option<u32>,
    pub usage: Option<Usage>,
    pub error: Option<ErrorBody>,
    /// The run's loop state as JSON text, stored as it is: the loop
    /// serializes it once per commit and compares the text with what it
    /// last wrote, so nothing builds a JSON tree for it on the way.
    pub state: Option<String>,
}

impl RunPatch {
    /// Every field `later` sets replaces this one's.
    pub fn absorb(&mut self, later: RunPatch) {
        let RunPatch {
            status,
            output,
            pending,
            steps,
            usage,
            error,
            state,
        } = later;
        self.status = status.or(self.status);
        self.output = output.or(self.output.take());
        self.pending = pending.or(self.pending.take());
        self.steps = steps.or(self.steps);
        self.usage = usage.or(self.usage.take());
        self.error = error.or(self.error.take());
        self.state = state.or(self.state.take());
    }
}

/// One atomic write: events are numbered in order after the run's last seq.
#[derive(Debug, Clone, Default)]
pub struct Commit {
    pub events: Vec<EventKind>,
    pub messages: Vec<Message>,
    pub patch: Option<RunPatch>,
    /// Approvals to create (status `Pending`), in the same transaction.
    pub approvals: Vec<ApprovalRecord>,
    /// Loop detection's records of the calls made since the last commit,
    /// appended to the run's. They are kept apart from the run's state so
    /// that a commit writes only the new ones, not the whole history.
    pub calls: Vec<StoredCall>,
}

/// One of a run's call records, as loop detection encodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCall {
    /// Its place among the run's calls, from 1.
    pub n: u64,
    /// The record's JSON.
    pub record: String,
}

impl Commit {
    /// Makes this commit also carry `later`, written after it: one write
    /// then stores both, as if they had been written one after the other.
    pub fn absorb(&mut self, later: Commit) {
        self.events.extend(later.events);
        self.messages.extend(later.messages);
        self.approvals.extend(later.approvals);
        self.calls.extend(later.calls);
        match (&mut self.patch, later.patch) {
            (Some(patch), Some(later)) => patch.absorb(later),
            (patch @ None, later) => *patch = later,
            (Some(_), None) => {}
        }
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.messages.is_empty()
            && self.patch.is_none()
            && self.approvals.is_empty()
            && self.calls.is_empty()
    }
}

#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub session: Option<String>,
    pub agent: Option<String>,
    pub status: Option<RunStatus>,
    pub limit: u32,
    /// Opaque cursor from a previous page.
    pub cursor: Option<String>,
}

#[derive(Debug, Clone)]
pub struct RunPage {
    pub runs: Vec<RunRecord>,
    pub next_cursor: Option<String>,
}

#[async_trait::async_trait]
pub trait Store: ApprovalStore + Send + Sync {
    /// Creates a run (and its session when new). With an idempotency key that
    /// was used before by the same tenant, returns the existing run and `false`.
    async fn create_run(&self, run: NewRun) -> Result<(RunRecord, bool), StoreError>;

    /// A run of this tenant; another tenant's run is `None`.
    async fn get_run(&self, tenant: &str, id: &str) -> Result<Option<RunRecord>, StoreError>;

    async fn list_runs(&self, tenant: &str, filter: &RunFilter) -> Result<RunPage, StoreError>;

    /// Applies a commit atomically and returns the events as numbered.
    async fn commit(&self, run_id: &str, commit: Commit) -> Result<Vec<Event>, StoreError>;

    /// The run's last `limit` call records (see [`Commit::calls`]), oldest first.
    async fn call_records(&self, run_id: &str, limit: u32) -> Result<Vec<StoredCall>, StoreError>;

    /// Events of a run with `seq > after`, in order, at most `limit`.
    async fn events_after(
        &self,
        run_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError>;

    /// The history a run's prompt is built from: the messages of its session
    /// written by earlier runs, then this run's own.
    async fn history(&self, run_id: &str) -> Result<Vec<Message>, StoreError>;

    /// Messages of a session, oldest first, with the run that wrote each.
    async fn session_messages(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Option<Vec<(String, Message)>>, StoreError>;

    /// Moves a session's messages to a new archived session (returned with
    /// them), so that the next run of the session starts fresh. A session
    /// with a run still going is a conflict; an unknown one is `NotFound`.
    async fn archive_session(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<(String, Vec<(String, Message)>), StoreError>;

    /// Runs that are not terminal: the work to resume after a restart.
    async fn unfinished_runs(&self) -> Result<Vec<RunRecord>, StoreError>;

    /// Cheap round trip for `/readyz`.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Records that a chat channel delivered the message `message_id`.
    /// True the first time; false for the same message again, however
    /// many nodes receive it at once (a unique key decides).
    async fn record_inbound(
        &self,
        tenant: &str,
        channel: &str,
        message_id: &str,
    ) -> Result<bool, StoreError>;

    /// Adds `amount` to a quota counter if the total stays within `limit`,
    /// in one conditional statement, so that nodes sharing the store never
    /// together pass it. Returns the new total, or `None` (nothing added)
    /// when it would go over.
    async fn quota_take(
        &self,
        key: &crate::QuotaKey,
        amount: u64,
        limit: u64,
    ) -> Result<Option<u64>, StoreError>;

    /// Takes back `amount` of an earlier take its request did not use
    /// after all; a counter never goes below zero.
    async fn quota_give_back(&self, key: &crate::QuotaKey, amount: u64) -> Result<(), StoreError>;

    /// A counter's value; zero when nothing was counted yet.
    async fn quota_used(&self, key: &crate::QuotaKey) -> Result<u64, StoreError>;

    /// Takes one of the tenant's run slots (`max_concurrent_runs`) for
    /// `run_id` if fewer than `limit` are held. The commit that makes the
    /// run terminal gives the slot back in its own transaction.
    async fn take_run_slot(
        &self,
        tenant: &str,
        run_id: &str,
        limit: u64,
    ) -> Result<bool, StoreError>;

    /// Gives back a slot whose run was not created after all.
    async fn release_run_slot(&self, run_id: &str) -> Result<(), StoreError>;
}

/// A human decision a run waits for (SPEC §4.7). It binds the exact tool and
/// arguments: anything else needs a new approval.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ApprovalRecord {
    pub id: String,
    pub tenant: String,
    pub run_id: String,
    pub call_id: String,
    pub tool: String,
    pub arguments: Value,
    pub risk: crate::Risk,
    pub reason: String,
    pub status: ApprovalStatus,
    pub decided_by: Option<String>,
    pub decision_reason: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub decided_at: Option<chrono::DateTime<chrono::Utc>>,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    Pending,
    Approved,
    Denied,
    /// Not decided before `expires_at`; treated as a denial.
    Expired,
}

impl ApprovalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Expired => "expired",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "approved" => Self::Approved,
            "denied" => Self::Denied,
            "expired" => Self::Expired,
            _ => return None,
        })
    }
}

/// Approval storage, part of every store. Approvals are created inside a
/// [`Commit`] (`Commit::approvals`), atomically with the run's status change.
#[async_trait::async_trait]
pub trait ApprovalStore: Send + Sync {
    /// An approval of this tenant; another tenant's is `None`.
    async fn get_approval(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<ApprovalRecord>, StoreError>;

    /// This tenant's approvals, oldest first, optionally by status, at most `limit`.
    async fn list_approvals(
        &self,
        tenant: &str,
        status: Option<ApprovalStatus>,
        limit: u32,
    ) -> Result<Vec<ApprovalRecord>, StoreError>;

    /// Decides a pending approval (`Approved`, `Denied` or `Expired`). Exactly
    /// one decision wins: deciding an approval that is no longer pending is
    /// `StoreError::Conflict`; another tenant's is `NotFound`.
    async fn decide_approval(
        &self,
        tenant: &str,
        id: &str,
        decision: ApprovalStatus,
        by: &str,
        reason: &str,
    ) -> Result<ApprovalRecord, StoreError>;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{EventKind, Message};

    fn answer(text: &str) -> EventKind {
        EventKind::Final {
            answer: text.into(),
        }
    }

    fn call(n: u64) -> StoredCall {
        StoredCall {
            n,
            record: format!("{{\"call\":\"c{n}\"}}"),
        }
    }

    #[test]
    fn an_absorbed_commit_follows_and_its_patch_fields_win() {
        let mut first = Commit {
            events: vec![answer("a")],
            messages: vec![Message::user("one")],
            patch: Some(RunPatch {
                steps: Some(1),
                state: Some("s1".into()),
                output: Some("kept".into()),
                ..RunPatch::default()
            }),
            approvals: Vec::new(),
            calls: vec![call(1)],
        };
        first.absorb(Commit {
            events: vec![answer("b")],
            messages: vec![Message::user("two")],
            patch: Some(RunPatch {
                steps: Some(2),
                state: Some("s2".into()),
                pending: Some(None),
                ..RunPatch::default()
            }),
            approvals: Vec::new(),
            calls: vec![call(2), call(3)],
        });
        let kinds: Vec<_> = first.events.iter().map(|e| format!("{e:?}")).collect();
        assert!(
            kinds[0].contains("\"a\"") && kinds[1].contains("\"b\""),
            "{kinds:?}"
        );
        assert_eq!(
            first.messages,
            vec![Message::user("one"), Message::user("two")]
        );
        assert_eq!(first.calls, vec![call(1), call(2), call(3)]);
        let patch = first.patch.unwrap();
        assert_eq!(patch.steps, Some(2));
        assert_eq!(patch.state.as_deref(), Some("s2"));
        assert_eq!(patch.output.as_deref(), Some("kept"), "unset later: kept");
        assert!(
            matches!(patch.pending, Some(None)),
            "a clear is a change too"
        );

        let mut bare = Commit::default();
        bare.absorb(Commit {
            patch: Some(RunPatch {
                steps: Some(3),
                ..RunPatch::default()
            }),
            ..Commit::default()
        });
        assert_eq!(bare.patch.unwrap().steps, Some(3));
    }
}
