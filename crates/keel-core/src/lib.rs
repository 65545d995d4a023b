//! The run loop and everything it needs to keep a model on course: the tool
//! set every call is checked against, the event bus, and the runtime that
//! owns one actor task per live run.

mod actor;
pub mod admission;
pub mod agent;
pub mod bus;
pub mod clarify;
mod cluster;
mod context;
pub mod course;
pub mod error;
pub mod follow;
pub mod guards;
mod lease;
pub mod otel;
pub mod outbound;
pub mod pipeline;
mod prompt;
pub mod quota;
mod redacting_model;
pub mod runtime;
pub mod session_reset;
mod spend;
mod state;
mod telemetry;
pub mod toolset;
mod transcript;

pub use admission::{Admission, AdmissionCall};
pub use agent::AgentRuntime;
pub use bus::EventBus;
pub use course::Similarity;
pub use error::CoreError;
pub use guards::Guards;
pub use outbound::{Attempt, Outbound, Outgoing};
pub use quota::{QuotaRejection, Quotas};
pub use runtime::{ClientToolOutput, Runtime, RuntimeOptions, StartRun};
pub use session_reset::{SessionMemory, SessionReset};
pub use toolset::{RegisteredTool, ToolSet};
