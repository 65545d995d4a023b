//! Slack Web API requests: `POST {api_base}/chat.postMessage` with the bot
//! token as `Authorization: Bearer`, and click answers to the interaction's
//! `response_url`.

use serde_json::{Value, json};

use super::text::{split_text, truncate};
use super::{
    Outbound, OutboundError, OutboundMessage, PreparedRequest, ResponseKind, answer_kind, json_body,
};
use crate::approval::{Decision, button_data};
use crate::inbound::{ClickAnswer, ReplyTarget};

/// Slack truncates longer messages; 4000 is what it recommends per message.
const MESSAGE_MAX: usize = 4000;
/// The limit on a section block's text.
const SECTION_MAX: usize = 3000;

pub(super) fn prepare(
    out: &Outbound,
    message: &OutboundMessage,
) -> Result<Vec<PreparedRequest>, OutboundError> {
    match message {
        OutboundMessage::Text { to, text } => {
            let pieces = split_text(text, MESSAGE_MAX);
            if pieces.is_empty() {
                return Err(OutboundError::EmptyText);
            }
            Ok(pieces
                .iter()
                .map(|piece| post_message(out, to, json!({"text": escape(piece)})))
                .collect())
        }
        OutboundMessage::ApprovalRequest {
            to,
            approval_id,
            text,
        } => {
            let text = escape(&truncate(text.trim(), SECTION_MAX));
            if text.is_empty() {
                return Err(OutboundError::EmptyText);
            }
            let button = |label: &str, decision: Decision, style: &str| {
                Ok::<_, OutboundError>(json!({
                    "type": "button",
                    "action_id": format!("keel_{}", decision.as_str()),
                    "style": style,
                    "text": {"type": "plain_text", "text": label},
                    "value": button_data(decision, approval_id)?,
                }))
            };
            let fields = json!({
                // The fallback for notifications and clients without blocks.
                "text": text,
                "blocks": [
                    {"type": "section", "text": {"type": "mrkdwn", "text": text}},
                    {
                        "type": "actions",
                        "block_id": "keel_approval",
                        "elements": [
                            button("Approve", Decision::Approve, "primary")?,
                            button("Deny", Decision::Deny, "danger")?,
                        ],
                    },
                ],
            });
            Ok(vec![post_message(out, to, fields)])
        }
        OutboundMessage::ClickAnswer { answer, text } => {
            let ClickAnswer::Slack { response_url } = answer else {
                return Err(OutboundError::WrongChannel {
                    answer: answer_kind(answer),
                    kind: "slack",
                });
            };
            // The response URL is a capability in itself: no token.
            Ok(vec![PreparedRequest {
                url: response_url.clone(),
                target: "slack response_url".into(),
                operation: "slack.response_url",
                headers: vec![(
                    "content-type".into(),
                    "application/json; charset=utf-8".into(),
                )],
                body: json_body(&json!({
                    "replace_original": true,
                    "text": escape(&truncate(text, MESSAGE_MAX)),
                })),
                response: ResponseKind::Plain,
                sign_with: None,
            }])
        }
    }
}

fn post_message(out: &Outbound, to: &ReplyTarget, mut fields: Value) -> PreparedRequest {
    fields["channel"] = json!(to.chat);
    if let Some(thread) = &to.thread {
        fields["thread_ts"] = json!(thread);
    }
    let url = format!("{}/chat.postMessage", out.api_base);
    PreparedRequest {
        target: url.clone(),
        url,
        operation: "slack.chat.postMessage",
        headers: vec![
            (
                "content-type".into(),
                "application/json; charset=utf-8".into(),
            ),
            ("authorization".into(), format!("Bearer {}", out.token())),
        ],
        body: json_body(&fields),
        response: ResponseKind::SlackApi,
        sign_with: None,
    }
}

/// Slack reads `<…>` as links and mentions (`<!channel>` notifies
/// everyone), so an answer's `&`, `<` and `>` are escaped: whatever the
/// model writes shows as text and pings no one.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn mentions_and_links_are_escaped() {
        assert_eq!(
            escape("<!channel> a & b <@U1> <https://x|y>"),
            "&lt;!channel&gt; a &amp; b &lt;@U1&gt; &lt;https://x|y&gt;"
        );
    }
}
