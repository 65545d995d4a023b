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
    /// `Some(Value::Null)` clears it.
    pub pending: Option<Value>,
    pub steps: Option<u32>,
    pub usage: Option<Usage>,
    pub error: Option<ErrorBody>,
    pub state: Option<Value>,
}

/// One atomic write: events are numbered in order after the run's last seq.
#[derive(Debug, Clone, Default)]
pub struct Commit {
    pub events: Vec<EventKind>,
    pub messages: Vec<Message>,
    pub patch: Option<RunPatch>,
}

impl Commit {
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.messages.is_empty() && self.patch.is_none()
    }
}

#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub session: Option<String>,
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
pub trait Store: Send + Sync {
    /// Creates a run (and its session when new). With an idempotency key that
    /// was used before by the same tenant, returns the existing run and `false`.
    async fn create_run(&self, run: NewRun) -> Result<(RunRecord, bool), StoreError>;

    /// A run of this tenant; another tenant's run is `None`.
    async fn get_run(&self, tenant: &str, id: &str) -> Result<Option<RunRecord>, StoreError>;

    async fn list_runs(&self, tenant: &str, filter: &RunFilter) -> Result<RunPage, StoreError>;

    /// Applies a commit atomically and returns the events as numbered.
    async fn commit(&self, run_id: &str, commit: Commit) -> Result<Vec<Event>, StoreError>;

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

    /// Runs that are not terminal: the work to resume after a restart.
    async fn unfinished_runs(&self) -> Result<Vec<RunRecord>, StoreError>;

    /// Cheap round trip for `/readyz`.
    async fn ping(&self) -> Result<(), StoreError>;
}
