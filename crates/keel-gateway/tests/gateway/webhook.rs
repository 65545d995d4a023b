use keel_config::ChannelKind;
use keel_gateway::{ChatType, ClickAnswer, Decision, Inbound, Webhook, WebhookError, parse};
use serde_json::json;

use crate::common::{NOW_SECS, channel, keel_headers, now};

const SECRET: &str = "bridge-signing-secret";

fn hook() -> keel_config::ChannelConfig {
    channel("hook", ChannelKind::Webhook, "acme")
}

fn send_at(ts: u64, body: &[u8]) -> Result<Webhook, WebhookError> {
    parse(
        &hook(),
        SECRET,
        &keel_headers(SECRET, ts, body),
        body,
        now(),
    )
}

fn send(body: &serde_json::Value) -> Result<Webhook, WebhookError> {
    send_at(NOW_SECS, body.to_string().as_bytes())
}

fn message(w: Result<Webhook, WebhookError>) -> Inbound {
    match w {
        Ok(Webhook::Message(m)) => *m,
        other => panic!("expected a message, got {other:?}"),
    }
}

#[test]
fn the_smallest_message_is_a_direct_one() {
    let m = message(send(&json!({"id": "m-1", "sender": "u-42", "text": "hi"})));
    assert_eq!(m.channel, "hook");
    assert_eq!(m.kind, ChannelKind::Webhook);
    assert_eq!(m.tenant, "acme");
    assert_eq!(m.account, "hook");
    assert_eq!(m.sender, "u-42");
    assert_eq!(m.chat_type, ChatType::Direct);
    assert_eq!(m.chat, "u-42");
    assert_eq!(m.peer, "u-42");
    assert_eq!(m.dedupe_id, "m-1");
    assert_eq!(m.reply.chat, "u-42");
    assert_eq!(m.reply.message.as_deref(), Some("m-1"));
}

#[test]
fn every_field_is_read() {
    let m = message(send(&json!({
        "id": "m-2",
        "type": "message",
        "sender": "u-42",
        "sender_name": "Alice",
        "text": "/new start over",
        "chat": "room-7",
        "chat_type": "group",
        "thread": "t-3",
        "reply_to": "m-1",
        "account": "bot-a",
        "guild": "g-1",
        "team": "team-1",
        "roles": ["admin", "ops"],
        "extra": {"ignored": true}
    })));
    assert_eq!(m.sender_name.as_deref(), Some("Alice"));
    assert_eq!(m.chat_type, ChatType::Group);
    assert_eq!(m.chat, "room-7");
    assert_eq!(m.thread.as_deref(), Some("t-3"));
    assert_eq!(m.peer, "room-7:t-3");
    assert_eq!(m.parent_peer.as_deref(), Some("room-7"));
    assert_eq!(m.reply_to.as_deref(), Some("m-1"));
    assert_eq!(m.account, "bot-a");
    assert_eq!(m.guild.as_deref(), Some("g-1"));
    assert_eq!(m.team.as_deref(), Some("team-1"));
    assert_eq!(m.roles, vec!["admin", "ops"]);
    assert_eq!(m.command, Some(keel_gateway::Command::New));
    assert_eq!(m.text, "/new start over");

    // A chat without a chat_type is a group.
    let m = message(send(
        &json!({"id": "m-3", "sender": "u", "text": "x", "chat": "room-8"}),
    ));
    assert_eq!(m.chat_type, ChatType::Group);
}

#[test]
fn an_approval_body_is_a_click() {
    let w = send(&json!({
        "id": "c-1", "type": "approval", "sender": "u-42", "chat": "approvers",
        "approval_id": "apr_0123456789abcdef0123456789abcdef", "decision": "approve"
    }));
    let Ok(Webhook::Click(click)) = w else {
        panic!("expected a click, got {w:?}");
    };
    assert_eq!(click.decision, Decision::Approve);
    assert_eq!(click.sender, "u-42");
    assert_eq!(click.dedupe_id, "c-1");
    assert_eq!(
        click.answer,
        ClickAnswer::Webhook {
            chat: Some("approvers".into()),
            click_id: "c-1".into()
        }
    );
    let r = send(&json!({"id": "c-2", "type": "approval", "sender": "u", "approval_id": "apr_1"}));
    assert_eq!(
        r,
        Err(WebhookError::BadRequest("decision is missing".into()))
    );
}

#[test]
fn signatures_and_timestamps_are_checked() {
    let body = br#"{"id":"m-1","sender":"u-42","text":"hi"}"#;
    assert!(send_at(NOW_SECS, body).is_ok());
    assert!(matches!(
        send_at(NOW_SECS - 600, body),
        Err(WebhookError::Unauthorized(r)) if r.contains("600 s old")
    ));
    let signed = keel_headers(SECRET, NOW_SECS, body);
    let tampered = br#"{"id":"m-1","sender":"root","text":"hi"}"#;
    assert_eq!(
        parse(&hook(), SECRET, &signed, tampered, now()),
        Err(WebhookError::Unauthorized(
            "signature does not match".into()
        ))
    );
    for header in ["x-keel-signature", "x-keel-timestamp"] {
        let mut h = signed.clone();
        h.remove(header);
        assert_eq!(
            parse(&hook(), SECRET, &h, body, now()),
            Err(WebhookError::Unauthorized(format!(
                "missing {header} header"
            )))
        );
    }
    let mut unprefixed = signed.clone();
    let bare = signed["x-keel-signature"].to_str().unwrap()["sha256=".len()..].to_owned();
    unprefixed.insert("x-keel-signature", bare.parse().unwrap());
    assert!(matches!(
        parse(&hook(), SECRET, &unprefixed, body, now()),
        Err(WebhookError::Unauthorized(r)) if r.contains("sha256=")
    ));
    let mut not_hex = signed;
    not_hex.insert("x-keel-signature", "sha256=zz".parse().unwrap());
    assert!(matches!(
        parse(&hook(), SECRET, &not_hex, body, now()),
        Err(WebhookError::Unauthorized(_))
    ));
}

#[test]
fn malformed_bodies_name_what_is_wrong() {
    let reason = |r: Result<Webhook, WebhookError>| match r {
        Err(WebhookError::BadRequest(reason)) => reason,
        other => panic!("expected a bad request, got {other:?}"),
    };
    assert_eq!(
        reason(send(&json!({"id": "m", "sender": "u"}))),
        "text is missing"
    );
    let r = reason(send(&json!({"id": 7, "sender": "u", "text": "x"})));
    assert!(
        r.contains("webhook body: id: invalid type: integer `7`"),
        "{r}"
    );
    let r = reason(send(&json!({"sender": "u", "text": "x"})));
    assert!(r.contains("missing field `id`"), "{r}");
    let r = reason(send(
        &json!({"id": "m", "sender": "u", "text": "x", "chat_type": "dm"}),
    ));
    assert!(r.contains("chat_type: unknown variant `dm`"), "{r}");
    assert_eq!(
        reason(send(&json!({"id": " ", "sender": "u", "text": "x"}))),
        "id is empty"
    );
    assert!(
        reason(send(
            &json!({"id": "m", "sender": "u", "text": "x", "account": "a:b"})
        ))
        .contains("without ':'")
    );
    assert!(reason(send_at(NOW_SECS, b"[]")).starts_with("webhook body: "));
}
