//! The chat gateway's self-contained parts: inbound webhook adapters for
//! Telegram, Slack and keel's signed JSON webhook ([`inbound::parse`]),
//! routing of a message to an agent and a session ([`Router`]), and the
//! outbound requests that answer ([`Outbound`], [`Sender`]).
//!
//! Nothing here touches the store or the runtime: adapters and builders
//! are pure functions of their input, so each service's exact wire format
//! is unit tested.

pub mod approval;
pub mod command;
pub mod identity;
pub mod inbound;
pub mod outbound;
pub mod routing;
pub mod secrets;
pub mod send;
pub mod session;
pub mod signature;

pub use approval::{ButtonError, CALLBACK_DATA_MAX, Decision, button_data, parse_button_data};
pub use command::Command;
pub use identity::{IdentityLinks, Person};
pub use inbound::{
    ApprovalClick, ChatType, ClickAnswer, Inbound, ReplyTarget, Webhook, WebhookError, parse,
};
pub use outbound::{
    Outbound, OutboundError, OutboundMessage, PreparedRequest, ResponseKind, split_text,
};
pub use routing::{MatchedBy, Route, Router};
pub use secrets::{ChannelSecrets, SecretError};
pub use send::{Attempt, Outcome, RetryPolicy, Sender, retry};
pub use session::session_key;
