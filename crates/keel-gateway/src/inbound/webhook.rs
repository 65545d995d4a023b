//! keel's own signed JSON webhook, for bridges from any chat service.
//! Signed like Slack but with keel's headers:
//! `X-Keel-Signature: sha256=hex(HMAC_SHA256(secret, X-Keel-Timestamp + "." + body))`.
//! The body is documented in docs/gateway.md.

use std::time::SystemTime;

use http::HeaderMap;
use keel_config::ChannelConfig;
use serde::Deserialize;

use super::{
    ApprovalClick, ChatType, ClickAnswer, Parts, Webhook, WebhookError, from_json, missing,
    non_empty, required_header,
};
use crate::approval::Decision;
use crate::signature::{KEEL_SIGNATURE, KEEL_TIMESTAMP, check_timestamp, verify_hmac};

#[derive(Deserialize, Default, PartialEq)]
#[serde(rename_all = "snake_case")]
enum BodyType {
    #[default]
    Message,
    Approval,
}

/// Unknown fields are ignored, so a bridge may send more than keel reads.
#[derive(Deserialize)]
struct Body {
    id: String,
    #[serde(default, rename = "type")]
    kind: BodyType,
    sender: String,
    #[serde(default)]
    sender_name: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    chat: Option<String>,
    #[serde(default)]
    chat_type: Option<ChatType>,
    #[serde(default)]
    thread: Option<String>,
    #[serde(default)]
    reply_to: Option<String>,
    #[serde(default)]
    account: Option<String>,
    #[serde(default)]
    guild: Option<String>,
    #[serde(default)]
    team: Option<String>,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    approval_id: Option<String>,
    #[serde(default)]
    decision: Option<Decision>,
}

pub(super) fn parse(
    channel: &ChannelConfig,
    secret: &str,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<Webhook, WebhookError> {
    let timestamp = required_header(headers, KEEL_TIMESTAMP)?;
    check_timestamp(KEEL_TIMESTAMP, timestamp, now)?;
    let signature = required_header(headers, KEEL_SIGNATURE)?;
    let Some(hex) = signature.trim().strip_prefix("sha256=") else {
        return Err(WebhookError::Unauthorized(format!(
            "{KEEL_SIGNATURE} does not start with sha256="
        )));
    };
    verify_hmac(secret.as_bytes(), &[timestamp.as_bytes(), b".", body], hex)?;

    let b: Body = from_json(body, "webhook body")?;
    let id = non_empty(b.id, "id")?;
    let sender = non_empty(b.sender, "sender")?;
    let chat = match b.chat {
        Some(chat) => Some(non_empty(chat, "chat")?),
        None => None,
    };
    if b.kind == BodyType::Approval {
        let approval_id = non_empty(
            b.approval_id.ok_or_else(|| missing("approval_id"))?,
            "approval_id",
        )?;
        let decision = b.decision.ok_or_else(|| missing("decision"))?;
        return Ok(Webhook::Click(Box::new(ApprovalClick {
            channel: channel.id.clone(),
            tenant: channel.tenant.clone(),
            sender,
            approval_id,
            decision,
            chat: chat.clone(),
            message: b.reply_to,
            team: b.team,
            answer: ClickAnswer::Webhook {
                chat,
                click_id: id.clone(),
            },
            dedupe_id: id,
        })));
    }
    let text = b.text.ok_or_else(|| missing("text"))?;
    if text.trim().is_empty() {
        return Ok(Webhook::Ignored("message without text".into()));
    }
    let chat_type = b.chat_type.unwrap_or(if chat.is_some() {
        ChatType::Group
    } else {
        ChatType::Direct
    });
    let account = match b.account {
        // Accounts are part of session keys, whose parts `:` separates.
        Some(a) if a.is_empty() || a.contains(':') => {
            return Err(WebhookError::BadRequest(
                "account must be non-empty and without ':'".into(),
            ));
        }
        Some(a) => a,
        None => channel.id.clone(),
    };
    Ok(Webhook::Message(Box::new(
        Parts {
            account,
            chat: chat.unwrap_or_else(|| sender.clone()),
            sender,
            sender_name: b.sender_name,
            chat_type,
            guild: b.guild.filter(|g| !g.is_empty()),
            team: b.team.filter(|t| !t.is_empty()),
            roles: b.roles,
            thread: b.thread.filter(|t| !t.is_empty()),
            reply_to: b.reply_to,
            text,
            message: Some(id.clone()),
            dedupe_id: id,
        }
        .build(channel),
    )))
}
