//! The chat gateway's configuration: the channels messages arrive on
//! (`[[channels]]`) and how a message finds its agent and session
//! (`[routing]`). Kept apart from `model.rs` because it is one feature with
//! its own vocabulary; `Config` holds it like any other section.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The chat service a channel speaks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChannelKind {
    /// A Telegram bot: Bot API updates in, `sendMessage` out.
    Telegram,
    /// A Slack app: Events API and interactivity in, `chat.postMessage` out.
    Slack,
    /// Any service that posts keel's signed JSON and takes answers at `reply_url`.
    Webhook,
}

impl ChannelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Telegram => "telegram",
            Self::Slack => "slack",
            Self::Webhook => "webhook",
        }
    }

    /// The API the channel's answers go to when `api_base` is unset; a
    /// webhook channel answers at its `reply_url` instead.
    pub fn default_api_base(self) -> Option<&'static str> {
        match self {
            Self::Telegram => Some("https://api.telegram.org"),
            Self::Slack => Some("https://slack.com/api"),
            Self::Webhook => None,
        }
    }
}

/// One chat channel. Messages arrive at
/// `POST /ai/channels/<id>/webhook`; answers go back through the service's
/// API. Secrets are named by the environment variables that hold them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChannelConfig {
    /// Unique; the path segment of the webhook URL and part of session
    /// keys, so only letters, digits, `-` and `_`.
    #[schemars(example = &"telegram")]
    pub id: String,
    /// The service the channel speaks to.
    #[schemars(example = ChannelKind::Telegram)]
    pub kind: ChannelKind,
    /// The tenant whose runs this channel's messages start; identity links
    /// join only identities of channels of one tenant.
    #[serde(default = "default_tenant")]
    #[schemars(example = &"acme")]
    pub tenant: String,
    /// `telegram`, `slack`: environment variable holding the bot token
    /// (Slack: the `xoxb-…` bot token).
    #[serde(default)]
    #[schemars(example = &"TELEGRAM_BOT_TOKEN")]
    pub bot_token_env: Option<String>,
    /// `telegram`: environment variable holding the `secret_token` given to
    /// `setWebhook`; each update must carry it in
    /// `X-Telegram-Bot-Api-Secret-Token`.
    #[serde(default)]
    #[schemars(example = &"TELEGRAM_SECRET_TOKEN")]
    pub secret_token_env: Option<String>,
    /// `slack`: environment variable holding the app's signing secret.
    /// `webhook`: environment variable holding the secret requests are
    /// signed with, and answers to `reply_url` are signed with too.
    #[serde(default)]
    pub signing_secret_env: Option<String>,
    /// `telegram`, `slack`: base URL of the service's API (default
    /// `https://api.telegram.org`, `https://slack.com/api`).
    #[serde(default)]
    pub api_base: Option<String>,
    /// Chat where approval requests are posted with approve and deny
    /// buttons (a Telegram chat id, a Slack channel id); unset: in the chat
    /// the request came from.
    #[serde(default)]
    #[schemars(example = &"-1001234567890")]
    pub approvers_chat: Option<String>,
    /// `webhook`: URL answers are POSTed to, signed like inbound requests.
    #[serde(default)]
    pub reply_url: Option<String>,
}

fn default_tenant() -> String {
    "default".into()
}

impl ChannelConfig {
    /// Where answers go: `api_base` or the kind's default; `None` for a
    /// webhook channel, which answers at `reply_url`.
    pub fn api_base(&self) -> Option<&str> {
        self.api_base
            .as_deref()
            .or_else(|| self.kind.default_api_base())
    }

    /// The variable holding the secret inbound requests are checked with.
    pub fn inbound_secret_env(&self) -> Option<&str> {
        match self.kind {
            ChannelKind::Telegram => self.secret_token_env.as_deref(),
            ChannelKind::Slack | ChannelKind::Webhook => self.signing_secret_env.as_deref(),
        }
    }
}

/// Which direct-message conversations share a session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DmScope {
    /// One session per agent for all direct messages: `agent:<id>:main`.
    /// Everyone who writes to the agent shares it; for a one-person setup.
    Main,
    /// One session per person, across channels: `agent:<id>:direct:<peer>`,
    /// the peer being the linked person, or `<channel>:<sender>` for a
    /// sender no identity link names.
    PerPeer,
    /// One session per sender and channel: `agent:<id>:<channel>:direct:<sender>`.
    #[default]
    PerChannelPeer,
    /// One session per sender, channel and bot account:
    /// `agent:<id>:<channel>:<account>:direct:<sender>`.
    PerAccountChannelPeer,
}

impl DmScope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Main => "main",
            Self::PerPeer => "per-peer",
            Self::PerChannelPeer => "per-channel-peer",
            Self::PerAccountChannelPeer => "per-account-channel-peer",
        }
    }
}

/// Which agent answers a channel message, and in which session
/// (docs/gateway.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingConfig {
    /// The agent for messages no binding matches (default: the agent that
    /// serves runs naming none).
    #[schemars(example = &"default")]
    pub default_agent: Option<String>,
    /// Which direct-message conversations share a session. Group chats
    /// always get one session per group (and thread).
    pub dm_scope: DmScope,
    /// Rules sending messages to agents. The most specific kind of binding
    /// that matches wins (peer, then a thread's parent peer, guild with
    /// roles, guild, team, account, channel); among bindings of one kind,
    /// the first in the file.
    pub bindings: Vec<RouteBinding>,
    /// Channel identities that are one person, who then has one
    /// direct-message session across those channels (with `dm_scope =
    /// "per-peer"`) and may be a keel principal for approvals.
    pub identity_links: Vec<IdentityLink>,
    /// HTTP hooks at the gateway's dispatch steps: POSTs to the operator's
    /// own service, like Kubernetes admission webhooks.
    pub hooks: Vec<DispatchHook>,
}

/// Where in the dispatch of a channel message a hook is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HookPoint {
    /// Each message taken in, after routing. Observe only: the answer is
    /// ignored, and a hook that fails or times out changes nothing.
    MessageReceived,
    /// Before a message starts a run: the hook's `context` is added to the
    /// run's system prompt. A hook that fails or times out adds nothing.
    BeforePromptBuild,
    /// Before every tool call of every run that the guard pipeline cleared,
    /// with its final arguments: the hook answers `{"decision": "allow"}`
    /// or `{"decision": "deny", "reason": "..."}`. Fails closed: a hook
    /// that fails, times out or answers anything else refuses the call.
    BeforeToolCall,
}

impl HookPoint {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MessageReceived => "message_received",
            Self::BeforePromptBuild => "before_prompt_build",
            Self::BeforeToolCall => "before_tool_call",
        }
    }
}

/// One `[[routing.hooks]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DispatchHook {
    /// The dispatch step.
    #[schemars(example = HookPoint::BeforePromptBuild)]
    pub point: HookPoint,
    /// The operator's endpoint; it receives a JSON POST.
    #[schemars(example = &"http://127.0.0.1:9000/keel/context")]
    pub url: String,
    /// How long keel waits for the answer.
    #[serde(default = "default_hook_timeout_ms")]
    pub timeout_ms: u64,
    /// Environment variable holding a secret: requests are then signed
    /// like keel's webhook (`X-Keel-Timestamp`, `X-Keel-Signature`).
    #[serde(default)]
    pub secret_env: Option<String>,
    /// `message_received`, `before_prompt_build`: channel ids the hook
    /// applies to; empty: every channel.
    #[serde(default)]
    pub channels: Vec<String>,
    /// `before_tool_call`: tool name patterns the hook applies to; empty:
    /// every tool.
    #[serde(default)]
    pub tools: Vec<String>,
}

fn default_hook_timeout_ms() -> u64 {
    2000
}

/// One `[[routing.bindings]]` entry: every condition given must hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteBinding {
    /// The agent that answers matching messages.
    #[schemars(example = &"default")]
    pub agent: String,
    /// The channel id the binding applies to.
    #[schemars(example = &"telegram")]
    pub channel: String,
    /// The bot account that received the message (`*`: any). Slack: the
    /// app id (`api_app_id`); Telegram: the channel id; webhook: the
    /// request's `account`, else the channel id.
    #[serde(default)]
    pub account: Option<String>,
    /// A conversation: the sender of a direct message, or a group's or
    /// channel's chat id. It also matches the threads of that conversation,
    /// less specifically than a binding naming the thread
    /// (`<chat>:<thread>`).
    #[serde(default)]
    #[schemars(example = &"123456789")]
    pub peer: Option<String>,
    /// A guild (a community server) the message was sent in.
    #[serde(default)]
    pub guild: Option<String>,
    /// With `guild`: the sender has one of these roles there.
    #[serde(default)]
    pub roles: Vec<String>,
    /// A team (Slack: the workspace's `team_id`).
    #[serde(default)]
    pub team: Option<String>,
}

/// One person known under several channel identities.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdentityLink {
    /// The person's id, which stands in for the sender in `per-peer`
    /// session keys; no `:`.
    #[schemars(example = &"alice")]
    pub person: String,
    /// The keel principal (of `[[auth.keys]]`, same tenant) this person
    /// is: approvals decided with a chat button are decided as them, with
    /// their roles.
    #[serde(default)]
    #[schemars(example = &"alice")]
    pub principal: Option<String>,
    /// The person's identities; their channels must belong to one tenant.
    pub identities: Vec<ChannelIdentity>,
}

/// A sender as one channel knows them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChannelIdentity {
    /// The channel id.
    #[schemars(example = &"telegram")]
    pub channel: String,
    /// The sender id on that channel (Telegram: the numeric user id; Slack:
    /// the `U…` user id; webhook: `sender`).
    #[schemars(example = &"123456789")]
    pub sender: String,
}
