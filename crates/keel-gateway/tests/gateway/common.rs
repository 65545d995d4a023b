//! Channels, clocks and signatures shared by the adapter tests.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use keel_config::{ChannelConfig, ChannelKind};
use sha2::Sha256;

pub const NOW_SECS: u64 = 1_700_000_000;

pub fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW_SECS)
}

pub fn channel(id: &str, kind: ChannelKind, tenant: &str) -> ChannelConfig {
    ChannelConfig {
        id: id.into(),
        kind,
        tenant: tenant.into(),
        bot_token_env: None,
        secret_token_env: None,
        signing_secret_env: None,
        api_base: None,
        approvers_chat: None,
        reply_url: None,
    }
}

pub fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

/// `hex(HMAC_SHA256(secret, message))`, computed here with the hmac crate
/// rather than with the code under test.
pub fn hmac_hex(secret: &str, message: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(message);
    hex::encode(mac.finalize().into_bytes())
}

/// Slack's signature headers for `body` sent at `ts`.
pub fn slack_headers(secret: &str, ts: u64, body: &[u8], content_type: &str) -> HeaderMap {
    let mut base = format!("v0:{ts}:").into_bytes();
    base.extend_from_slice(body);
    let signature = format!("v0={}", hmac_hex(secret, &base));
    headers(&[
        ("X-Slack-Request-Timestamp", &ts.to_string()),
        ("X-Slack-Signature", &signature),
        ("Content-Type", content_type),
    ])
}

/// keel's webhook signature headers for `body` sent at `ts`.
pub fn keel_headers(secret: &str, ts: u64, body: &[u8]) -> HeaderMap {
    let mut base = format!("{ts}.").into_bytes();
    base.extend_from_slice(body);
    let signature = format!("sha256={}", hmac_hex(secret, &base));
    headers(&[
        ("X-Keel-Timestamp", &ts.to_string()),
        ("X-Keel-Signature", &signature),
        ("Content-Type", "application/json"),
    ])
}
