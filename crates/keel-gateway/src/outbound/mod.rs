//! Outbound requests: answers, approval requests with buttons and click
//! acknowledgements, built as [`PreparedRequest`]s for the channel's API.
//! Building is pure, so the exact request each service gets is unit
//! tested; [`crate::send`] sends them.

use std::fmt;
use std::time::SystemTime;

use keel_config::{ChannelConfig, ChannelKind};
use secrecy::{ExposeSecret, SecretString};

use crate::approval::ButtonError;
use crate::inbound::{ClickAnswer, ReplyTarget};
use crate::secrets::ChannelSecrets;
use crate::signature::keel_signature_headers;

mod slack;
mod telegram;
mod text;
mod webhook;

pub use text::split_text;

/// Something to say on a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboundMessage {
    /// An answer in a chat; split into several messages when longer than
    /// the service allows.
    Text { to: ReplyTarget, text: String },
    /// An approval request with approve and deny buttons.
    ApprovalRequest {
        to: ReplyTarget,
        approval_id: String,
        text: String,
    },
    /// Acknowledges a button click. Telegram: `answerCallbackQuery` shows
    /// `text` to the person who clicked, and the buttons are removed from
    /// the message. Slack: the message with the buttons is replaced by
    /// `text`. Webhook: `text` is POSTed as a `click_answer`.
    ClickAnswer { answer: ClickAnswer, text: String },
}

/// How a service says whether a request worked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseKind {
    /// `{"ok": true, "result": …}`; failures carry `description` and, for
    /// 429, `parameters.retry_after`.
    TelegramApi,
    /// HTTP 200 with `{"ok": false, "error": …}` on failure.
    SlackApi,
    /// Any 2xx is success (Slack's `response_url`, webhook `reply_url`).
    Plain,
}

/// One HTTP POST, ready to send.
#[derive(Clone)]
pub struct PreparedRequest {
    /// The full URL; for Telegram it holds the bot token, so it is never
    /// logged: use `target`.
    pub url: String,
    /// The URL with any token replaced, for logs and events.
    pub target: String,
    /// What the request does (`telegram.sendMessage`, `slack.chat.postMessage`,
    /// `slack.response_url`, `webhook.reply`), for events.
    pub operation: &'static str,
    /// Headers besides a signature; `authorization` holds a token.
    pub headers: Vec<(String, String)>,
    /// The JSON body, exactly as sent (and signed).
    pub body: Vec<u8>,
    pub response: ResponseKind,
    /// A webhook answer is signed when sent, with the time of each attempt,
    /// so a retried request is never refused as a replay.
    pub sign_with: Option<SecretString>,
}

impl PreparedRequest {
    /// The headers to send at `now`: `headers`, plus `X-Keel-Timestamp` and
    /// `X-Keel-Signature` when the request is signed.
    pub fn headers_at(&self, now: SystemTime) -> Vec<(String, String)> {
        let mut headers = self.headers.clone();
        if let Some(secret) = &self.sign_with
            && let Some(signed) =
                keel_signature_headers(secret.expose_secret().as_bytes(), &self.body, now)
        {
            headers.extend(signed);
        }
        headers
    }

    /// The body as JSON, for tests and events.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

impl fmt::Debug for PreparedRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(k, v)| {
                let shown = if k.eq_ignore_ascii_case("authorization") {
                    "[REDACTED]"
                } else {
                    v.as_str()
                };
                (k.as_str(), shown)
            })
            .collect();
        f.debug_struct("PreparedRequest")
            .field("target", &self.target)
            .field("operation", &self.operation)
            .field("headers", &headers)
            .field("body", &String::from_utf8_lossy(&self.body))
            .field("response", &self.response)
            .field("signed", &self.sign_with.is_some())
            .finish()
    }
}

/// Why a message cannot be turned into requests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutboundError {
    #[error("channel {channel:?} has no {what}")]
    NotConfigured { channel: String, what: &'static str },
    #[error("nothing to send: the text is empty")]
    EmptyText,
    #[error("{0}")]
    BadTarget(String),
    #[error(transparent)]
    Button(#[from] ButtonError),
    #[error("a {answer} click answer cannot be sent on a {kind} channel")]
    WrongChannel {
        answer: &'static str,
        kind: &'static str,
    },
}

/// Builds a channel's outbound requests.
#[derive(Clone)]
pub struct Outbound {
    channel: String,
    kind: ChannelKind,
    api_base: String,
    reply_url: Option<String>,
    approvers_chat: Option<String>,
    bot_token: Option<SecretString>,
    signing_secret: SecretString,
}

impl fmt::Debug for Outbound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbound")
            .field("channel", &self.channel)
            .field("kind", &self.kind)
            .field("api_base", &self.api_base)
            .field("reply_url", &self.reply_url)
            .finish_non_exhaustive()
    }
}

impl Outbound {
    pub fn new(channel: &ChannelConfig, secrets: &ChannelSecrets) -> Result<Self, OutboundError> {
        let not_configured = |what| OutboundError::NotConfigured {
            channel: channel.id.clone(),
            what,
        };
        let api_base = channel
            .api_base()
            .unwrap_or_default()
            .trim_end_matches('/')
            .to_owned();
        match channel.kind {
            ChannelKind::Telegram | ChannelKind::Slack if secrets.bot_token.is_none() => {
                return Err(not_configured("bot token"));
            }
            ChannelKind::Webhook if channel.reply_url.is_none() => {
                return Err(not_configured("reply_url"));
            }
            _ => {}
        }
        Ok(Self {
            channel: channel.id.clone(),
            kind: channel.kind,
            api_base,
            reply_url: channel.reply_url.clone(),
            approvers_chat: channel.approvers_chat.clone(),
            bot_token: secrets.bot_token.clone(),
            signing_secret: secrets.inbound.clone(),
        })
    }

    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// Where an approval request about a message from `origin` is posted:
    /// the channel's `approvers_chat` if set, else `origin` itself.
    pub fn approvals_target(&self, origin: &ReplyTarget) -> ReplyTarget {
        match &self.approvers_chat {
            Some(chat) => ReplyTarget {
                chat: chat.clone(),
                thread: None,
                message: None,
            },
            None => origin.clone(),
        }
    }

    /// The requests that say `message`, in the order they must be sent.
    pub fn prepare(
        &self,
        message: &OutboundMessage,
    ) -> Result<Vec<PreparedRequest>, OutboundError> {
        match self.kind {
            ChannelKind::Telegram => telegram::prepare(self, message),
            ChannelKind::Slack => slack::prepare(self, message),
            ChannelKind::Webhook => webhook::prepare(self, message),
        }
    }

    fn token(&self) -> &str {
        self.bot_token
            .as_ref()
            .map(|t| t.expose_secret())
            .unwrap_or_default()
    }
}

/// A JSON body; serializing a `serde_json::Value` cannot fail, and an
/// empty body would only be refused by the service.
fn json_body(value: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

fn answer_kind(answer: &ClickAnswer) -> &'static str {
    match answer {
        ClickAnswer::Telegram { .. } => "telegram",
        ClickAnswer::Slack { .. } => "slack",
        ClickAnswer::Webhook { .. } => "webhook",
    }
}
