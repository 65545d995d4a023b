//! Request authentication: Telegram's shared secret token, and the HMAC
//! signatures Slack and keel's own webhooks use. Every comparison of a
//! secret with what a request carries is constant-time, so response timing
//! tells an attacker nothing about how much of a guess was right.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::inbound::WebhookError;

/// How far a signed request's timestamp may be from now, either way:
/// older requests are replays, and a clock that far off is broken.
pub const TIMESTAMP_WINDOW: Duration = Duration::from_secs(5 * 60);

type HmacSha256 = Hmac<Sha256>;

/// `hex(HMAC_SHA256(secret, message))`, the message given in parts.
/// `None` only if the HMAC cannot be keyed, which HMAC's definition rules
/// out (any key length is valid); callers refuse rather than assume.
pub fn hmac_sha256_hex(secret: &[u8], message: &[&[u8]]) -> Option<String> {
    let mut mac = HmacSha256::new_from_slice(secret).ok()?;
    for part in message {
        mac.update(part);
    }
    Some(hex::encode(mac.finalize().into_bytes()))
}

/// Checks `signature_hex` against `HMAC_SHA256(secret, message)`.
pub(crate) fn verify_hmac(
    secret: &[u8],
    message: &[&[u8]],
    signature_hex: &str,
) -> Result<(), WebhookError> {
    let Ok(signature) = hex::decode(signature_hex.trim()) else {
        return Err(WebhookError::Unauthorized(
            "signature is not hexadecimal".into(),
        ));
    };
    let Ok(mut mac) = HmacSha256::new_from_slice(secret) else {
        return Err(WebhookError::Unauthorized(
            "the signature cannot be computed".into(),
        ));
    };
    for part in message {
        mac.update(part);
    }
    mac.verify_slice(&signature)
        .map_err(|_| WebhookError::Unauthorized("signature does not match".into()))
}

/// Constant-time equality of a presented token and the configured one.
pub(crate) fn tokens_equal(presented: &[u8], expected: &[u8]) -> bool {
    presented.ct_eq(expected).into()
}

/// Checks that a Unix-seconds timestamp is within [`TIMESTAMP_WINDOW`] of
/// `now`.
pub(crate) fn check_timestamp(
    header: &str,
    raw: &str,
    now: SystemTime,
) -> Result<(), WebhookError> {
    let Ok(ts) = raw.trim().parse::<i64>() else {
        return Err(WebhookError::Unauthorized(format!(
            "{header} is not a Unix timestamp in seconds"
        )));
    };
    let now = unix_seconds(now);
    let skew = now.abs_diff(ts);
    if skew > TIMESTAMP_WINDOW.as_secs() {
        let when = if ts < now { "old" } else { "in the future" };
        return Err(WebhookError::Unauthorized(format!(
            "{header} is {skew} s {when}; at most {} s are accepted",
            TIMESTAMP_WINDOW.as_secs()
        )));
    }
    Ok(())
}

pub(crate) fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// The headers keel signs a webhook body with, for the given time:
/// `X-Keel-Timestamp` and `X-Keel-Signature: sha256=<hex>` over
/// `timestamp + "." + body`.
pub fn keel_signature_headers(
    secret: &[u8],
    body: &[u8],
    now: SystemTime,
) -> Option<[(String, String); 2]> {
    let ts = unix_seconds(now).to_string();
    let signature = hmac_sha256_hex(secret, &[ts.as_bytes(), b".", body])?;
    Some([
        (KEEL_TIMESTAMP.to_owned(), ts),
        (KEEL_SIGNATURE.to_owned(), format!("sha256={signature}")),
    ])
}

pub const KEEL_TIMESTAMP: &str = "x-keel-timestamp";
pub const KEEL_SIGNATURE: &str = "x-keel-signature";

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// RFC 4231, test case 2.
    #[test]
    fn hmac_matches_the_rfc_vector() {
        assert_eq!(
            hmac_sha256_hex(b"Jefe", &[b"what do ya want ", b"for nothing?"]).unwrap(),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(
            verify_hmac(
                b"Jefe",
                &[b"what do ya want for nothing?"],
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
            )
            .is_ok()
        );
        assert!(verify_hmac(b"Jefe", &[b"x"], "zz").is_err());
        assert!(verify_hmac(b"Jefe", &[b"x"], "").is_err());
    }

    #[test]
    fn timestamps_outside_the_window_are_refused_both_ways() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert!(check_timestamp("t", "1700000000", now).is_ok());
        assert!(check_timestamp("t", "1699999700", now).is_ok());
        let old = check_timestamp("t", "1699999400", now).unwrap_err();
        assert_eq!(
            old,
            WebhookError::Unauthorized("t is 600 s old; at most 300 s are accepted".into())
        );
        assert!(check_timestamp("t", "1700000400", now).is_err());
        assert!(check_timestamp("t", "soon", now).is_err());
        assert!(check_timestamp("t", "-99999999999999999999", now).is_err());
    }

    #[test]
    fn signature_headers_verify() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let [(_, ts), (_, sig)] = keel_signature_headers(b"k", b"{}", now).unwrap();
        assert_eq!(ts, "1700000000");
        let hex = sig.strip_prefix("sha256=").unwrap();
        assert!(verify_hmac(b"k", &[ts.as_bytes(), b".", b"{}"], hex).is_ok());
    }
}
