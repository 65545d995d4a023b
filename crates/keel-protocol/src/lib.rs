//! Shared vocabulary of keel: runs, events, messages, actions, and the three
//! ports (model, tool, store) that the loop drives.
//!
//! Kept free of any runtime, HTTP or database crate so that every other
//! crate can depend on it without pulling those in.

pub mod coord;
pub mod event;
pub mod message;
pub mod model;
pub mod principal;
pub mod quota;
pub mod redact;
pub mod run;
pub mod store;
mod timestamp;
pub mod tool;

pub use coord::{Coordination, Notice, Notices, QueuedCommand, SingleNode};
pub use event::{
    Action, ClientCall, CompletionReason, Decision, DeliveryKind, Event, EventKind, FeedbackCode,
    LoopDetector, LoopLevel, PlannedCall,
};
pub use message::{Message, ToolCall};
pub use model::{
    CLARIFY_TOOL, ModelClient, ModelError, ModelRequest, ModelResponse, PreviousCost, RequestGate,
    TokenUsage, ToolSchema, Understanding, Ungated, WireCache, shared_messages,
};
pub use principal::Principal;
pub use quota::{MICROS_PER_USD, QuotaKey, QuotaLimit, usd_to_micros};
pub use redact::{REDACTED, Redactor, StreamRedactor};
pub use run::{Budget, ErrorBody, Pending, RunRecord, RunStatus, Usage};
pub use store::{
    ApprovalRecord, ApprovalStatus, ApprovalStore, Commit, NewRun, RunFilter, RunPage, RunPatch,
    Store, StoreError, StoredCall,
};
pub use tool::{
    CallPlace, Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSource, ToolSpec, Trust,
};

/// Current time, as every timestamp in keel is written.
pub fn now() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now()
}

/// A new sortable identifier with a readable prefix (`run_…`, `ses_…`).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}
