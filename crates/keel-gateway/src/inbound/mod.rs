//! Inbound webhooks: one request from a chat service, authenticated and
//! turned into one normalized [`Inbound`] message (or a URL challenge, an
//! approval button click, or a reason to ignore it). Adapters are pure:
//! headers, body and the current time in, a [`Webhook`] or a
//! [`WebhookError`] out, and no input makes them panic.

use std::time::SystemTime;

use http::HeaderMap;
use keel_config::{ChannelConfig, ChannelKind};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::approval::Decision;
use crate::command::Command;

mod slack;
mod telegram;
mod webhook;

/// What kind of conversation a message was sent in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatType {
    /// One person and the bot (Telegram `private`, Slack `im`).
    Direct,
    /// Several people who all write (Telegram `group`/`supergroup`; Slack
    /// channels, private channels and group DMs).
    Group,
    /// A broadcast channel, where only its admins post (Telegram `channel`).
    Channel,
}

impl ChatType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Group => "group",
            Self::Channel => "channel",
        }
    }
}

/// Where an answer goes: the conversation (and thread) a message came
/// from, and the message itself for services that can quote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyTarget {
    /// Telegram chat id, Slack channel id, webhook `chat`.
    pub chat: String,
    /// Telegram forum topic (`message_thread_id`), Slack `thread_ts`,
    /// webhook `thread`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// The message being answered (Telegram `message_id`, webhook `id`);
    /// Telegram shows the answer as a reply to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One chat message, whichever service it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inbound {
    /// The configured channel id.
    pub channel: String,
    pub kind: ChannelKind,
    /// The channel's tenant: the run this message starts is this tenant's.
    pub tenant: String,
    /// The bot account that received it: Slack `api_app_id`, Telegram the
    /// channel id, webhook `account` or the channel id.
    pub account: String,
    /// The sender's id on the channel (Telegram user id, Slack user id).
    pub sender: String,
    /// A display name, when the service gives one (Telegram `username`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_name: Option<String>,
    pub chat_type: ChatType,
    /// The conversation's id: for a direct chat the service's id of it
    /// (Telegram: equal to the sender's id; Slack: the `D…` channel).
    pub chat: String,
    /// A guild (community server) the message was sent in; only the
    /// generic webhook carries one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guild: Option<String>,
    /// The team: Slack `team_id`, webhook `team`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The sender's roles in the guild; only the generic webhook carries them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// The thread within `chat`, if the message is in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// What routing calls the conversation: the sender in a direct chat,
    /// else the chat id; in a thread, `<chat>:<thread>`.
    pub peer: String,
    /// In a thread, the conversation the thread belongs to (`chat`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_peer: Option<String>,
    /// The message this one answers, if the sender replied to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    pub text: String,
    /// Unique per delivery of this message on this channel, for dropping
    /// the service's retries: Telegram `update_id`, Slack `event_id`,
    /// webhook `id`.
    pub dedupe_id: String,
    /// Where the answer goes.
    pub reply: ReplyTarget,
    /// `/new`, `/reset` or `/stop` at the start of the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Command>,
    /// Whether the sender may run `command`. Adapters never grant it: the
    /// caller decides who may reset or stop a shared session.
    #[serde(default)]
    pub command_authorized: bool,
}

/// The parts of an [`Inbound`] an adapter reads; [`Parts::build`] derives
/// the rest (peers, reply target, command) the same way for every service.
pub(crate) struct Parts {
    pub account: String,
    pub sender: String,
    pub sender_name: Option<String>,
    pub chat_type: ChatType,
    pub chat: String,
    pub guild: Option<String>,
    pub team: Option<String>,
    pub roles: Vec<String>,
    pub thread: Option<String>,
    pub reply_to: Option<String>,
    pub text: String,
    pub dedupe_id: String,
    /// The message's own id on the service, for quoting it in the answer.
    pub message: Option<String>,
}

impl Parts {
    pub(crate) fn build(self, channel: &ChannelConfig) -> Inbound {
        let base = match self.chat_type {
            ChatType::Direct => self.sender.clone(),
            ChatType::Group | ChatType::Channel => self.chat.clone(),
        };
        let (peer, parent_peer) = match &self.thread {
            Some(thread) => (format!("{base}:{thread}"), Some(base)),
            None => (base, None),
        };
        let command = Command::parse(&self.text);
        Inbound {
            channel: channel.id.clone(),
            kind: channel.kind,
            tenant: channel.tenant.clone(),
            account: self.account,
            sender: self.sender,
            sender_name: self.sender_name,
            chat_type: self.chat_type,
            reply: ReplyTarget {
                chat: self.chat.clone(),
                thread: self.thread.clone(),
                message: self.message,
            },
            chat: self.chat,
            guild: self.guild,
            team: self.team,
            roles: self.roles,
            thread: self.thread,
            peer,
            parent_peer,
            reply_to: self.reply_to,
            text: self.text,
            dedupe_id: self.dedupe_id,
            command,
            command_authorized: false,
        }
    }
}

/// A person pressed an approve or deny button keel posted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalClick {
    pub channel: String,
    pub tenant: String,
    /// Who pressed it, as the channel knows them; map it to a principal
    /// with the identity links before deciding anything.
    pub sender: String,
    pub approval_id: String,
    pub decision: Decision,
    /// The chat the button was pressed in (Telegram chat id, Slack channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<String>,
    /// The message carrying the buttons (Telegram `message_id`, Slack `ts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Slack: the workspace (`team.id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// How to acknowledge the click.
    pub answer: ClickAnswer,
    /// Unique per click, for dropping repeats.
    pub dedupe_id: String,
}

/// How a click is acknowledged, per service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ClickAnswer {
    /// `answerCallbackQuery` with this id (it stops the button's spinner),
    /// and the message with the buttons, whose text can then be replaced.
    Telegram {
        callback_query_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chat: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
    },
    /// A POST to `response_url` replaces the message with the buttons.
    Slack { response_url: String },
    /// An answer POSTed to the channel's `reply_url`.
    Webhook {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chat: Option<String>,
        /// The `id` of the click request.
        click_id: String,
    },
}

/// What one webhook request amounts to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Webhook {
    /// A message to route to an agent.
    Message(Box<Inbound>),
    /// Slack's URL verification: answer with this challenge as the body.
    Challenge(String),
    /// An approval button was pressed.
    Click(Box<ApprovalClick>),
    /// Authentic, but nothing to act on (an edit, a bot's own message, an
    /// event type keel does not handle); answer 200 so it is not retried.
    Ignored(String),
}

/// Why a webhook request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    /// Missing or wrong secret or signature, or a timestamp outside the
    /// window: answer 401.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// Authentic but malformed; the reason names what is wrong: answer 400.
    #[error("bad request: {0}")]
    BadRequest(String),
}

/// Authenticates and reads one webhook request for `channel`. `secret` is
/// the channel's inbound secret (Telegram secret token, Slack or webhook
/// signing secret); an empty one refuses everything, so a missing secret
/// can never turn authentication off.
pub fn parse(
    channel: &ChannelConfig,
    secret: &str,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<Webhook, WebhookError> {
    if secret.is_empty() {
        return Err(WebhookError::Unauthorized(format!(
            "channel {:?} has no secret to check requests with",
            channel.id
        )));
    }
    match channel.kind {
        ChannelKind::Telegram => telegram::parse(channel, secret, headers, body),
        ChannelKind::Slack => slack::parse(channel, secret, headers, body, now),
        ChannelKind::Webhook => webhook::parse(channel, secret, headers, body, now),
    }
}

/// A header's value as text; missing and non-text values are both absent.
pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

pub(crate) fn required_header<'a>(
    headers: &'a HeaderMap,
    name: &str,
) -> Result<&'a str, WebhookError> {
    header(headers, name)
        .ok_or_else(|| WebhookError::Unauthorized(format!("missing {name} header")))
}

/// Deserializes JSON, naming the path of what does not fit
/// (`message.chat.id: invalid type: …`).
pub(crate) fn from_json<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, WebhookError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            WebhookError::BadRequest(format!("{what}: {inner}"))
        } else {
            WebhookError::BadRequest(format!("{what}: {path}: {inner}"))
        }
    })
}

/// An id field that must hold something.
pub(crate) fn non_empty(value: String, path: &str) -> Result<String, WebhookError> {
    if value.trim().is_empty() {
        Err(WebhookError::BadRequest(format!("{path} is empty")))
    } else {
        Ok(value)
    }
}

pub(crate) fn missing(path: &str) -> WebhookError {
    WebhookError::BadRequest(format!("{path} is missing"))
}
