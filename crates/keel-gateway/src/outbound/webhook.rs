//! Answers on a generic webhook channel: JSON POSTed to its `reply_url`,
//! signed like inbound requests (the signature is added when sent).

use serde_json::{Value, json};

use super::{
    Outbound, OutboundError, OutboundMessage, PreparedRequest, ResponseKind, answer_kind, json_body,
};
use crate::inbound::{ClickAnswer, ReplyTarget};

pub(super) fn prepare(
    out: &Outbound,
    message: &OutboundMessage,
) -> Result<Vec<PreparedRequest>, OutboundError> {
    let body = match message {
        OutboundMessage::Text { to, text } => {
            if text.trim().is_empty() {
                return Err(OutboundError::EmptyText);
            }
            let mut body = addressed(out, "message", to);
            body["text"] = json!(text);
            body
        }
        OutboundMessage::ApprovalRequest {
            to,
            approval_id,
            text,
        } => {
            let mut body = addressed(out, "approval_request", to);
            body["approval_id"] = json!(approval_id);
            body["text"] = json!(text);
            body["decisions"] = json!(["approve", "deny"]);
            body
        }
        OutboundMessage::ClickAnswer { answer, text } => {
            let ClickAnswer::Webhook { chat, click_id } = answer else {
                return Err(OutboundError::WrongChannel {
                    answer: answer_kind(answer),
                    kind: "webhook",
                });
            };
            let mut body = json!({
                "type": "click_answer",
                "channel": out.channel,
                "click_id": click_id,
                "text": text,
            });
            if let Some(chat) = chat {
                body["chat"] = json!(chat);
            }
            body
        }
    };
    let Some(url) = out.reply_url.clone() else {
        return Err(OutboundError::NotConfigured {
            channel: out.channel.clone(),
            what: "reply_url",
        });
    };
    Ok(vec![PreparedRequest {
        target: url.clone(),
        url,
        operation: "webhook.reply",
        headers: vec![("content-type".into(), "application/json".into())],
        body: json_body(&body),
        response: ResponseKind::Plain,
        sign_with: Some(out.signing_secret.clone()),
    }])
}

fn addressed(out: &Outbound, kind: &str, to: &ReplyTarget) -> Value {
    let mut body = json!({"type": kind, "channel": out.channel, "chat": to.chat});
    if let Some(thread) = &to.thread {
        body["thread"] = json!(thread);
    }
    if let Some(message) = &to.message {
        body["reply_to"] = json!(message);
    }
    body
}
