//! Answers, questions and approval requests sent back to where a run came
//! from (a chat channel), by whatever the runtime was given to send them.
//!
//! The run's `metadata.channel` names the place; the runtime itself knows no
//! channel. Each send attempt becomes a `channel_delivery` event of the run,
//! committed with the answer or right after the question, so a failed
//! delivery is visible in the run's own log and never changes its outcome.

use keel_protocol::{DeliveryKind, Risk};
use serde_json::Value;

/// What is sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Outgoing {
    /// The run's final answer.
    Answer(String),
    /// A clarification question, or a question handed to a person.
    Question(String),
    /// A call waits for a person's decision.
    Approval {
        approval_id: String,
        tool: String,
        arguments: Value,
        risk: Risk,
        reason: String,
    },
}

impl Outgoing {
    pub fn kind(&self) -> DeliveryKind {
        match self {
            Self::Answer(_) => DeliveryKind::Answer,
            Self::Question(_) => DeliveryKind::Question,
            Self::Approval { .. } => DeliveryKind::Approval,
        }
    }
}

/// One try at sending.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub ok: bool,
    /// What the channel answered, or why the attempt failed.
    pub detail: String,
}

/// Where a run's messages go, and how.
#[async_trait::async_trait]
pub trait Outbound: Send + Sync {
    /// The channel id `origin` (a run's `metadata.channel`) names, when it is
    /// one this sender serves.
    fn channel_of(&self, origin: &Value) -> Option<String>;

    /// Sends `message`, retrying as the channel allows; one entry per
    /// attempt, the last one telling whether it arrived.
    async fn deliver(&self, tenant: &str, origin: &Value, message: Outgoing) -> Vec<Attempt>;
}
