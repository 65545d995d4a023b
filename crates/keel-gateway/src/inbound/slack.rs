//! Slack: the Events API (JSON) and interactivity (`payload=<json>`, form
//! encoded), both signed with the app's signing secret:
//! `X-Slack-Signature: v0=hex(HMAC_SHA256(secret, "v0:" + timestamp + ":" + body))`.

use std::time::SystemTime;

use http::HeaderMap;
use keel_config::ChannelConfig;
use serde::Deserialize;

use super::{
    ApprovalClick, ChatType, ClickAnswer, Parts, Webhook, WebhookError, from_json, header, missing,
    non_empty, required_header,
};
use crate::approval::parse_button_data;
use crate::signature::{check_timestamp, verify_hmac};

pub(crate) const SIGNATURE_HEADER: &str = "x-slack-signature";
pub(crate) const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";

/// The `type` every Slack request body has, read first so that the rest
/// is parsed as the right shape and errors name the right fields.
#[derive(Deserialize)]
struct Head {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct UrlVerification {
    challenge: String,
}

#[derive(Deserialize)]
struct EventCallback {
    event_id: String,
    #[serde(default)]
    team_id: Option<String>,
    #[serde(default)]
    api_app_id: Option<String>,
    event: Event,
    /// The installation the event is delivered for; its `user_id` is the
    /// app's bot user.
    #[serde(default)]
    authorizations: Vec<Authorization>,
}

#[derive(Deserialize)]
struct Authorization {
    #[serde(default)]
    user_id: Option<String>,
}

#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    subtype: Option<String>,
    #[serde(default)]
    bot_id: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    ts: Option<String>,
    #[serde(default)]
    thread_ts: Option<String>,
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    channel_type: Option<String>,
}

#[derive(Deserialize)]
struct Form {
    payload: String,
}

#[derive(Deserialize)]
struct BlockActions {
    user: IdOnly,
    #[serde(default)]
    team: Option<IdOnly>,
    #[serde(default)]
    channel: Option<IdOnly>,
    #[serde(default)]
    message: Option<TsOnly>,
    #[serde(default)]
    response_url: Option<String>,
    #[serde(default)]
    trigger_id: Option<String>,
    #[serde(default)]
    actions: Vec<Action>,
}

#[derive(Deserialize)]
struct IdOnly {
    id: String,
}

#[derive(Deserialize)]
struct TsOnly {
    ts: String,
}

#[derive(Deserialize)]
struct Action {
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    action_ts: Option<String>,
}

pub(super) fn parse(
    channel: &ChannelConfig,
    secret: &str,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<Webhook, WebhookError> {
    let timestamp = required_header(headers, TIMESTAMP_HEADER)?;
    check_timestamp(TIMESTAMP_HEADER, timestamp, now)?;
    let signature = required_header(headers, SIGNATURE_HEADER)?;
    let Some(hex) = signature.trim().strip_prefix("v0=") else {
        return Err(WebhookError::Unauthorized(format!(
            "{SIGNATURE_HEADER} does not start with v0="
        )));
    };
    verify_hmac(
        secret.as_bytes(),
        &[b"v0:", timestamp.as_bytes(), b":", body],
        hex,
    )?;

    let form = header(headers, "content-type")
        .is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"));
    if form {
        interaction(channel, body)
    } else {
        event(channel, body)
    }
}

fn event(channel: &ChannelConfig, body: &[u8]) -> Result<Webhook, WebhookError> {
    let head: Head = from_json(body, "Slack event")?;
    match head.kind.as_str() {
        "url_verification" => {
            let v: UrlVerification = from_json(body, "Slack url_verification")?;
            Ok(Webhook::Challenge(v.challenge))
        }
        "event_callback" => {
            let callback: EventCallback = from_json(body, "Slack event_callback")?;
            message(channel, callback)
        }
        other => Ok(Webhook::Ignored(format!("Slack request of type {other:?}"))),
    }
}

/// Subtypes that are still a person writing: a thread reply also sent to
/// the channel, a message with a file. Every other subtype is an edit, a
/// deletion, a join, a bot's post: nothing to answer.
const PERSON_SUBTYPES: &[&str] = &["thread_broadcast", "file_share"];

fn message(channel: &ChannelConfig, callback: EventCallback) -> Result<Webhook, WebhookError> {
    let event = callback.event;
    let mention = match event.kind.as_str() {
        "message" => false,
        "app_mention" => true,
        other => return Ok(Webhook::Ignored(format!("Slack event {other:?}"))),
    };
    if let Some(subtype) = event
        .subtype
        .as_deref()
        .filter(|s| !PERSON_SUBTYPES.contains(s))
    {
        return Ok(Webhook::Ignored(format!(
            "Slack message subtype {subtype:?}"
        )));
    }
    let bot_user = callback
        .authorizations
        .first()
        .and_then(|a| a.user_id.clone());
    if event.bot_id.is_some() || (event.user.is_some() && event.user == bot_user) {
        return Ok(Webhook::Ignored("message from a bot".into()));
    }
    let sender = non_empty(
        event.user.ok_or_else(|| missing("event.user"))?,
        "event.user",
    )?;
    let chat = non_empty(
        event.channel.ok_or_else(|| missing("event.channel"))?,
        "event.channel",
    )?;
    let ts = non_empty(event.ts.ok_or_else(|| missing("event.ts"))?, "event.ts")?;
    let chat_type = match event.channel_type.as_deref() {
        Some("im") => ChatType::Direct,
        Some("channel" | "group" | "mpim") => ChatType::Group,
        Some(other) => {
            return Ok(Webhook::Ignored(format!(
                "Slack channel_type {other:?} is not a conversation keel answers in"
            )));
        }
        // `app_mention` carries no channel_type; DM ids start with D.
        None if chat.starts_with('D') => ChatType::Direct,
        None => ChatType::Group,
    };
    let mut text = event.text.unwrap_or_default();
    if let Some(bot) = &bot_user {
        let tag = format!("<@{bot}>");
        // Slack also sends `message` for a message that mentions the app
        // in a channel it is in; its `app_mention` twin (another event_id)
        // is the one answered, so the mention is answered once.
        if !mention && chat_type != ChatType::Direct && text.contains(&tag) {
            return Ok(Webhook::Ignored(
                "message mentioning the app; its app_mention event is answered".into(),
            ));
        }
        if let Some(rest) = text.trim_start().strip_prefix(&tag) {
            text = rest.trim_start().to_owned();
        }
    }
    // Slack escapes these three in message text; the agent reads the text
    // as written (`&amp;` last, so `&amp;lt;` stays `&lt;`).
    let text = text
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    if text.trim().is_empty() {
        return Ok(Webhook::Ignored("message without text".into()));
    }
    // A thread's first message may carry its own ts as thread_ts; it is
    // the conversation's, not inside the thread.
    let thread = event.thread_ts.filter(|t| !t.is_empty() && *t != ts);
    Ok(Webhook::Message(Box::new(
        Parts {
            account: callback
                .api_app_id
                .filter(|a| !a.is_empty())
                .unwrap_or_else(|| channel.id.clone()),
            sender,
            sender_name: None,
            chat_type,
            chat,
            guild: None,
            team: callback.team_id.filter(|t| !t.is_empty()),
            roles: Vec::new(),
            thread,
            reply_to: None,
            text,
            dedupe_id: non_empty(callback.event_id, "event_id")?,
            message: Some(ts),
        }
        .build(channel),
    )))
}

fn interaction(channel: &ChannelConfig, body: &[u8]) -> Result<Webhook, WebhookError> {
    let form: Form = serde_urlencoded::from_bytes(body).map_err(|e| {
        WebhookError::BadRequest(format!(
            "Slack interaction form: {e} (expected payload=<json>)"
        ))
    })?;
    let payload = form.payload.as_bytes();
    let head: Head = from_json(payload, "Slack interaction payload")?;
    if head.kind != "block_actions" {
        return Ok(Webhook::Ignored(format!(
            "Slack interaction of type {:?}",
            head.kind
        )));
    }
    let actions: BlockActions = from_json(payload, "Slack block_actions payload")?;
    let Some(action) = actions.actions.first() else {
        return Err(WebhookError::BadRequest(
            "Slack block_actions payload: actions is empty".into(),
        ));
    };
    let Some((decision, approval_id)) = action.value.as_deref().and_then(parse_button_data) else {
        return Ok(Webhook::Ignored(
            "button click that is not a keel approval".into(),
        ));
    };
    let Some(response_url) = actions.response_url.filter(|u| !u.is_empty()) else {
        return Err(missing("Slack block_actions payload: response_url"));
    };
    // Each interaction has its own trigger_id; a click has no event_id.
    // An empty one would make every such click a repeat of the first.
    let dedupe_id = actions
        .trigger_id
        .filter(|t| !t.is_empty())
        .or_else(|| action.action_ts.clone().filter(|t| !t.is_empty()))
        .ok_or_else(|| missing("Slack block_actions payload: trigger_id"))?;
    Ok(Webhook::Click(Box::new(ApprovalClick {
        channel: channel.id.clone(),
        tenant: channel.tenant.clone(),
        sender: non_empty(actions.user.id, "user.id")?,
        approval_id,
        decision,
        chat: actions.channel.map(|c| c.id),
        message: actions.message.map(|m| m.ts),
        team: actions.team.map(|t| t.id),
        answer: ClickAnswer::Slack { response_url },
        dedupe_id,
    })))
}
