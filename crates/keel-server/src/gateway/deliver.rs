//! Answers, questions and approval requests of runs started from a channel,
//! sent back through that channel's API (the runtime's `Outbound`).

use keel_core::{Attempt, Outgoing};
use keel_gateway::{OutboundMessage, Outcome, ReplyTarget};
use serde_json::{Value, json};

use super::{Channel, Gateway};

/// What a run started from a channel keeps in `metadata.channel`: enough to
/// answer in the same chat and thread after a restart, on any node.
pub(super) fn origin(msg: &keel_gateway::Inbound, person: Option<&str>) -> Value {
    let mut o = json!({
        "id": msg.channel,
        "kind": msg.kind.as_str(),
        "chat": msg.reply.chat,
        "chat_type": msg.chat_type.as_str(),
        "sender": msg.sender,
    });
    if let Value::Object(map) = &mut o {
        for (key, value) in [
            ("thread", msg.reply.thread.as_deref()),
            ("message", msg.reply.message.as_deref()),
            ("person", person),
        ] {
            if let Some(v) = value {
                map.insert(key.into(), Value::String(v.to_owned()));
            }
        }
    }
    o
}

fn reply_target(origin: &Value) -> Option<ReplyTarget> {
    let text = |k: &str| origin.get(k).and_then(Value::as_str).map(str::to_owned);
    Some(ReplyTarget {
        chat: text("chat")?,
        thread: text("thread"),
        message: text("message"),
    })
}

impl Gateway {
    /// The channel `origin` names, if it is configured and belongs to `tenant`.
    fn channel_for(&self, tenant: &str, origin: &Value) -> Option<&Channel> {
        let id = origin.get("id")?.as_str()?;
        self.channels.get(id).filter(|c| c.config.tenant == tenant)
    }

    /// Sends `message` over `channel`, every request with retries; one
    /// entry per attempt.
    pub(super) async fn send(&self, channel: &Channel, message: &OutboundMessage) -> Vec<Attempt> {
        let requests = match channel.outbound.prepare(message) {
            Ok(r) => r,
            Err(e) => {
                return vec![Attempt {
                    ok: false,
                    detail: format!("not sent: {e}"),
                }];
            }
        };
        let mut attempts = Vec::new();
        for request in &requests {
            let last = self
                .sender
                .send_with_retry(request, &self.retry, |a| {
                    attempts.push(describe(request.operation, a));
                })
                .await;
            if !last.is_delivered() {
                // The rest of a split answer would arrive without its start.
                break;
            }
        }
        attempts
    }
}

fn describe(operation: &str, a: &keel_gateway::Attempt) -> Attempt {
    let status = a.status.map(|s| format!(" (HTTP {s})")).unwrap_or_default();
    match &a.outcome {
        Outcome::Delivered { message_id } => Attempt {
            ok: true,
            detail: match message_id {
                Some(id) => format!("{operation}: delivered as message {id}{status}"),
                None => format!("{operation}: delivered{status}"),
            },
        },
        Outcome::Failed { error, .. } => Attempt {
            ok: false,
            detail: format!("{operation}: {error}{status}"),
        },
    }
}

#[async_trait::async_trait]
impl keel_core::Outbound for Gateway {
    fn channel_of(&self, origin: &Value) -> Option<String> {
        let id = origin.get("id")?.as_str()?;
        self.channels.contains_key(id).then(|| id.to_owned())
    }

    async fn deliver(&self, tenant: &str, origin: &Value, message: Outgoing) -> Vec<Attempt> {
        let (Some(channel), Some(to)) = (self.channel_for(tenant, origin), reply_target(origin))
        else {
            return vec![Attempt {
                ok: false,
                detail: "not sent: the run's channel is not configured for its tenant".into(),
            }];
        };
        let message = match message {
            Outgoing::Answer(text) | Outgoing::Question(text) => OutboundMessage::Text { to, text },
            Outgoing::Approval {
                approval_id,
                tool,
                arguments,
                risk,
                reason,
            } => OutboundMessage::ApprovalRequest {
                to: channel.outbound.approvals_target(&to),
                approval_id,
                text: format!(
                    "Approval needed: {tool} (risk {risk})\n{reason}\nArguments: {arguments}",
                    risk = risk.as_str()
                ),
            },
        };
        self.send(channel, &message).await
    }
}
