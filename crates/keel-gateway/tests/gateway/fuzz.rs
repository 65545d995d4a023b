//! No input makes an adapter panic: every prefix of real payloads, byte
//! flips of them and odd JSON, all correctly signed so they reach the
//! parsers, come back as a value or an error.

use keel_config::ChannelKind;
use keel_gateway::parse;
use serde_json::json;

use crate::common::{NOW_SECS, channel, headers, keel_headers, now, slack_headers};

fn bodies() -> Vec<Vec<u8>> {
    let payloads = [
        json!({"update_id": 1, "message": {"message_id": 2, "from": {"id": 3, "is_bot": false},
            "chat": {"id": 3, "type": "private"}, "text": "/stop@bot x",
            "reply_to_message": {"message_id": 1}}}),
        json!({"update_id": 1, "callback_query": {"id": "q", "from": {"id": 3},
            "message": {"message_id": 2, "chat": {"id": 3}}, "data": "approve:apr_1"}}),
        json!({"type": "event_callback", "event_id": "Ev1", "team_id": "T1", "api_app_id": "A1",
            "authorizations": [{"user_id": "UB"}],
            "event": {"type": "app_mention", "user": "U1", "text": "<@UB> hi", "ts": "1.2",
            "thread_ts": "1.1", "channel": "C1"}}),
        json!({"type": "url_verification", "challenge": "c"}),
        json!({"id": "m", "sender": "s", "text": "t", "chat": "c", "thread": "th",
            "roles": ["r"], "type": "approval", "approval_id": "apr_1", "decision": "deny"}),
    ];
    let mut out: Vec<Vec<u8>> = Vec::new();
    for p in payloads {
        let text = p.to_string().into_bytes();
        for end in 0..=text.len() {
            out.push(text[..end].to_vec());
        }
        for i in (0..text.len()).step_by(3) {
            let mut flipped = text.clone();
            flipped[i] ^= 0x55;
            out.push(flipped);
        }
    }
    for odd in [
        &b"null"[..],
        b"[]",
        b"\"\"",
        b"{\"update_id\": 1e400}",
        b"{\"update_id\": -9223372036854775809}",
        b"{\"type\": 5}",
        b"{\"type\": \"event_callback\", \"event\": []}",
        b"payload=",
        b"payload=%FF%FE",
        b"\xff\xfe\xfd",
        &[0u8; 64],
    ] {
        out.push(odd.to_vec());
    }
    let deep = "[".repeat(10_000);
    out.push(deep.into_bytes());
    out
}

#[test]
fn adapters_never_panic() {
    let tg = channel("tg", ChannelKind::Telegram, "t");
    let slack = channel("slack", ChannelKind::Slack, "t");
    let hook = channel("hook", ChannelKind::Webhook, "t");
    let tg_headers = headers(&[("X-Telegram-Bot-Api-Secret-Token", "s")]);
    let mut seen = 0;
    for body in bodies() {
        let _ = parse(&tg, "s", &tg_headers, &body, now());
        for content_type in ["application/json", "application/x-www-form-urlencoded"] {
            let h = slack_headers("s", NOW_SECS, &body, content_type);
            let _ = parse(&slack, "s", &h, &body, now());
        }
        let _ = parse(
            &hook,
            "s",
            &keel_headers("s", NOW_SECS, &body),
            &body,
            now(),
        );
        seen += 1;
    }
    assert!(seen > 500, "{seen} bodies");
}
