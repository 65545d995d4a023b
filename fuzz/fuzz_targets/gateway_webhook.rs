//! Webhook requests from chat services, correctly signed so that the body
//! reaches the adapters: Telegram updates, Slack events and interactions,
//! and keel's own signed webhook. The first byte picks the adapter.
#![no_main]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue};
use keel_config::{ChannelConfig, ChannelKind, Config, DmScope};
use keel_gateway::signature::{hmac_sha256_hex, keel_signature_headers};
use keel_gateway::{
    ApprovalClick, Inbound, Router, Webhook, button_data, parse, parse_button_data, session_key,
};
use libfuzzer_sys::fuzz_target;

const SECRET: &str = "fuzz-secret";
const NOW_SECS: u64 = 1_700_000_000;

fn channel(kind: ChannelKind) -> ChannelConfig {
    ChannelConfig {
        id: "chan".into(),
        kind,
        tenant: "acme".into(),
        bot_token_env: None,
        secret_token_env: None,
        signing_secret_env: None,
        api_base: None,
        approvers_chat: None,
        reply_url: None,
    }
}

fn headers(pairs: &[(&str, String)]) -> Option<HeaderMap> {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.insert(
            HeaderName::from_bytes(name.as_bytes()).ok()?,
            HeaderValue::from_str(value).ok()?,
        );
    }
    Some(map)
}

fn request(selector: u8, body: &[u8], now: SystemTime) -> Option<(ChannelConfig, HeaderMap)> {
    let ts = NOW_SECS.to_string();
    Some(match selector % 4 {
        0 => (
            channel(ChannelKind::Telegram),
            headers(&[("x-telegram-bot-api-secret-token", SECRET.to_owned())])?,
        ),
        n @ (1 | 2) => {
            let signature =
                hmac_sha256_hex(SECRET.as_bytes(), &[b"v0:", ts.as_bytes(), b":", body])?;
            let content_type = if n == 1 {
                "application/json"
            } else {
                "application/x-www-form-urlencoded"
            };
            (
                channel(ChannelKind::Slack),
                headers(&[
                    ("x-slack-request-timestamp", ts),
                    ("x-slack-signature", format!("v0={signature}")),
                    ("content-type", content_type.to_owned()),
                ])?,
            )
        }
        _ => {
            let [(n1, v1), (n2, v2)] = keel_signature_headers(SECRET.as_bytes(), body, now)?;
            (
                channel(ChannelKind::Webhook),
                headers(&[(n1.as_str(), v1), (n2.as_str(), v2)])?,
            )
        }
    })
}

fn check_message(msg: &Inbound) {
    assert!(!msg.sender.is_empty(), "{msg:?}");
    assert!(!msg.chat.is_empty(), "{msg:?}");
    assert!(!msg.peer.is_empty(), "{msg:?}");
    assert!(!msg.dedupe_id.is_empty(), "{msg:?}");
    assert!(
        !msg.text.trim().is_empty(),
        "a message without text: {msg:?}"
    );
    assert!(!msg.command_authorized, "an adapter granted a command");
    let json = serde_json::to_string(msg).unwrap_or_default();
    let back: Option<Inbound> = serde_json::from_str(&json).ok();
    assert_eq!(back.as_ref(), Some(msg), "{json}");

    let mut config = Config::default();
    config.routing.default_agent = Some("main".into());
    let route = Router::new(&config).route(msg);
    assert!(route.is_some(), "no route with a default agent");
    for scope in [
        DmScope::Main,
        DmScope::PerPeer,
        DmScope::PerChannelPeer,
        DmScope::PerAccountChannelPeer,
    ] {
        assert!(session_key("main", msg, scope, None).starts_with("agent:main:"));
    }
}

fn check_click(click: &ApprovalClick) {
    assert!(!click.sender.is_empty(), "{click:?}");
    assert!(!click.dedupe_id.is_empty(), "{click:?}");
    let json = serde_json::to_string(click).unwrap_or_default();
    let back: Option<ApprovalClick> = serde_json::from_str(&json).ok();
    assert_eq!(back.as_ref(), Some(click), "{json}");
    // A button keel could write for this click reads back the same.
    if let Ok(data) = button_data(click.decision, &click.approval_id) {
        assert_eq!(
            parse_button_data(&data),
            Some((click.decision, click.approval_id.clone()))
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let now = UNIX_EPOCH + Duration::from_secs(NOW_SECS);
    let Some((channel, headers)) = request(selector, body, now) else {
        return;
    };
    match parse(&channel, SECRET, &headers, body, now) {
        Ok(Webhook::Message(msg)) => check_message(&msg),
        Ok(Webhook::Click(click)) => check_click(&click),
        Ok(Webhook::Challenge(_) | Webhook::Ignored(_)) => {}
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
