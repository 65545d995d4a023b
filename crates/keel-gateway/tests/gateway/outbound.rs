//! Outbound requests against a local server standing in for each service,
//! which records exactly what arrives.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use keel_config::{ChannelConfig, ChannelKind, MapEnv};
use keel_gateway::{
    ChannelSecrets, ClickAnswer, Outbound, OutboundError, OutboundMessage, Outcome,
    PreparedRequest, ReplyTarget, RetryPolicy, SecretError, Sender,
};
use secrecy::SecretString;
use serde_json::json;

use crate::common::{channel, hmac_hex};

const TOKEN: &str = "123456:ABC-DEF1234ghIkl-zyx57W2v1u123ew11";
const XOXB: &str = "xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy";

struct Seen {
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Seen {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// A canned answer: status, extra headers, body.
type Reply = (u16, Vec<(&'static str, &'static str)>, String);

#[derive(Clone, Default)]
struct Service {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// (status, extra headers, body), answered in order; then a Telegram
    /// style success.
    replies: Arc<Mutex<VecDeque<Reply>>>,
}

async fn record(State(service): State<Service>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap()
        .to_vec();
    service.seen.lock().unwrap().push(Seen {
        path: parts.uri.path().to_owned(),
        headers: parts.headers,
        body,
    });
    let (status, headers, body) = service.replies.lock().unwrap().pop_front().unwrap_or((
        200,
        vec![],
        r#"{"ok":true,"result":{"message_id":4242}}"#.into(),
    ));
    let mut response = Response::builder().status(StatusCode::from_u16(status).unwrap());
    for (k, v) in headers {
        response = response.header(k, v);
    }
    response.body(Body::from(body)).unwrap()
}

/// Starts the stand-in; returns its base URL.
async fn serve(service: &Service) -> String {
    let app = axum::Router::new()
        .fallback(record)
        .with_state(service.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn secrets(bot_token: Option<&str>, inbound: &str) -> ChannelSecrets {
    ChannelSecrets {
        bot_token: bot_token.map(|t| SecretString::from(t.to_owned())),
        inbound: SecretString::from(inbound.to_owned()),
    }
}

fn telegram(base: &str) -> (ChannelConfig, Outbound) {
    let mut c = channel("tg", ChannelKind::Telegram, "acme");
    c.api_base = Some(base.into());
    c.approvers_chat = Some("-100999".into());
    let out = Outbound::new(&c, &secrets(Some(TOKEN), "s")).unwrap();
    (c, out)
}

fn slack(base: &str) -> Outbound {
    let mut c = channel("slack", ChannelKind::Slack, "acme");
    c.api_base = Some(format!("{base}/api/"));
    Outbound::new(&c, &secrets(Some(XOXB), "s")).unwrap()
}

fn sender() -> Sender {
    Sender::new(Duration::from_secs(5)).unwrap()
}

fn one(mut requests: Vec<PreparedRequest>) -> PreparedRequest {
    assert_eq!(requests.len(), 1, "{requests:?}");
    requests.remove(0)
}

fn target(chat: &str, thread: Option<&str>, message: Option<&str>) -> ReplyTarget {
    ReplyTarget {
        chat: chat.into(),
        thread: thread.map(Into::into),
        message: message.map(Into::into),
    }
}

const APPROVAL: &str = "apr_0123456789abcdef0123456789abcdef";

#[tokio::test]
async fn telegram_send_message_is_posted_as_the_bot_api_expects() {
    let service = Service::default();
    let (_, out) = telegram(&serve(&service).await);
    let request = one(out
        .prepare(&OutboundMessage::Text {
            to: target("-1001234567890", Some("42"), Some("1365")),
            text: "Furnace 2 is at 1180 °C.".into(),
        })
        .unwrap());
    assert!(!request.target.contains(TOKEN));
    assert!(!format!("{request:?}").contains(TOKEN));

    let attempt = sender().send(&request, 1).await;
    assert_eq!(attempt.status, Some(200));
    assert_eq!(
        attempt.outcome,
        Outcome::Delivered {
            message_id: Some("4242".into())
        }
    );
    let seen = service.seen.lock().unwrap();
    assert_eq!(seen[0].path, format!("/bot{TOKEN}/sendMessage"));
    assert_eq!(seen[0].header("content-type"), Some("application/json"));
    assert_eq!(
        seen[0].json(),
        json!({
            "chat_id": -1001234567890i64,
            "text": "Furnace 2 is at 1180 °C.",
            "message_thread_id": 42,
            "reply_parameters": {"message_id": 1365, "allow_sending_without_reply": true}
        })
    );
}

#[tokio::test]
async fn a_long_telegram_answer_is_split_and_only_the_first_part_quotes() {
    let (_, out) = telegram("http://127.0.0.1:1");
    let text = format!("{}\n{}", "a".repeat(4000), "b".repeat(200));
    let requests = out
        .prepare(&OutboundMessage::Text {
            to: target("5", None, Some("9")),
            text,
        })
        .unwrap();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].json()["text"], json!("a".repeat(4000)));
    assert_eq!(
        requests[0].json()["reply_parameters"]["message_id"],
        json!(9)
    );
    assert_eq!(
        requests[1].json(),
        json!({"chat_id": 5, "text": "b".repeat(200)})
    );
}

#[tokio::test]
async fn telegram_approvals_carry_inline_buttons_and_clicks_are_answered() {
    let service = Service::default();
    let (_, out) = telegram(&serve(&service).await);
    let to = out.approvals_target(&target("111", Some("7"), Some("1365")));
    assert_eq!(to, target("-100999", None, None));
    let request = one(out
        .prepare(&OutboundMessage::ApprovalRequest {
            to,
            approval_id: APPROVAL.into(),
            text: "Restart furnace 2?".into(),
        })
        .unwrap());
    assert!(sender().send(&request, 1).await.is_delivered());

    let answer = ClickAnswer::Telegram {
        callback_query_id: "4382bfdwdsb323b2d9".into(),
        chat: Some("-100999".into()),
        message_id: Some("1400".into()),
    };
    let requests = out
        .prepare(&OutboundMessage::ClickAnswer {
            answer,
            text: "Approved by alice".into(),
        })
        .unwrap();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert!(sender().send(r, 1).await.is_delivered());
    }

    let seen = service.seen.lock().unwrap();
    assert_eq!(seen[0].path, format!("/bot{TOKEN}/sendMessage"));
    assert_eq!(
        seen[0].json(),
        json!({
            "chat_id": -100999,
            "text": "Restart furnace 2?",
            "reply_markup": {"inline_keyboard": [[
                {"text": "Approve", "callback_data": format!("approve:{APPROVAL}")},
                {"text": "Deny", "callback_data": format!("deny:{APPROVAL}")}
            ]]}
        })
    );
    assert_eq!(seen[1].path, format!("/bot{TOKEN}/answerCallbackQuery"));
    assert_eq!(
        seen[1].json(),
        json!({"callback_query_id": "4382bfdwdsb323b2d9", "text": "Approved by alice"})
    );
    assert_eq!(seen[2].path, format!("/bot{TOKEN}/editMessageReplyMarkup"));
    assert_eq!(
        seen[2].json(),
        json!({"chat_id": -100999, "message_id": 1400, "reply_markup": {"inline_keyboard": []}})
    );
}

#[tokio::test]
async fn slack_post_message_sends_the_bot_token_and_reads_ok_false_as_failure() {
    let service = Service::default();
    service.replies.lock().unwrap().push_back((
        200,
        vec![("content-type", "application/json")],
        r#"{"ok":false,"error":"channel_not_found"}"#.into(),
    ));
    let out = slack(&serve(&service).await);
    let request = one(out
        .prepare(&OutboundMessage::Text {
            to: target(
                "C123ABC456",
                Some("1700000000.000100"),
                Some("1700000100.000300"),
            ),
            text: "Done <!channel> & ok".into(),
        })
        .unwrap());
    assert!(!format!("{request:?}").contains(XOXB));
    let attempt = sender().send(&request, 1).await;
    assert_eq!(attempt.status, Some(200));
    assert_eq!(
        attempt.outcome,
        Outcome::Failed {
            error: "channel_not_found".into(),
            retryable: false,
            retry_after: None
        }
    );
    let seen = service.seen.lock().unwrap();
    assert_eq!(seen[0].path, "/api/chat.postMessage");
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {XOXB}").as_str())
    );
    assert_eq!(
        seen[0].header("content-type"),
        Some("application/json; charset=utf-8")
    );
    assert_eq!(
        seen[0].json(),
        json!({
            "channel": "C123ABC456",
            "thread_ts": "1700000000.000100",
            "text": "Done &lt;!channel&gt; &amp; ok"
        })
    );
}

#[tokio::test]
async fn slack_approvals_are_block_kit_buttons_and_clicks_replace_the_message() {
    let service = Service::default();
    service.replies.lock().unwrap().push_back((
        200,
        vec![],
        r#"{"ok":true,"channel":"C0APPROVE","ts":"1700000200.000100"}"#.into(),
    ));
    service
        .replies
        .lock()
        .unwrap()
        .push_back((200, vec![], "ok".into()));
    let base = serve(&service).await;
    let out = slack(&base);
    let request = one(out
        .prepare(&OutboundMessage::ApprovalRequest {
            to: target("C0APPROVE", None, None),
            approval_id: APPROVAL.into(),
            text: "Restart *furnace 2*?".into(),
        })
        .unwrap());
    let attempt = sender().send(&request, 1).await;
    assert_eq!(
        attempt.outcome,
        Outcome::Delivered {
            message_id: Some("1700000200.000100".into())
        }
    );

    let answer = ClickAnswer::Slack {
        response_url: format!("{base}/actions/T123ABC456/1232321423432/D09sSasdasdAS9091209"),
    };
    let request = one(out
        .prepare(&OutboundMessage::ClickAnswer {
            answer,
            text: "Approved by <@U2147483697>".into(),
        })
        .unwrap());
    assert!(sender().send(&request, 1).await.is_delivered());

    let seen = service.seen.lock().unwrap();
    assert_eq!(
        seen[0].json(),
        json!({
            "channel": "C0APPROVE",
            "text": "Restart *furnace 2*?",
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": "Restart *furnace 2*?"}},
                {"type": "actions", "block_id": "keel_approval", "elements": [
                    {"type": "button", "action_id": "keel_approve", "style": "primary",
                     "text": {"type": "plain_text", "text": "Approve"},
                     "value": format!("approve:{APPROVAL}")},
                    {"type": "button", "action_id": "keel_deny", "style": "danger",
                     "text": {"type": "plain_text", "text": "Deny"},
                     "value": format!("deny:{APPROVAL}")}
                ]}
            ]
        })
    );
    assert_eq!(
        seen[1].path,
        "/actions/T123ABC456/1232321423432/D09sSasdasdAS9091209"
    );
    assert_eq!(seen[1].header("authorization"), None);
    assert_eq!(
        seen[1].json(),
        json!({"replace_original": true, "text": "Approved by &lt;@U2147483697&gt;"})
    );
}

#[tokio::test]
async fn webhook_answers_are_signed_like_inbound_requests() {
    let service = Service::default();
    service
        .replies
        .lock()
        .unwrap()
        .push_back((204, vec![], String::new()));
    let base = serve(&service).await;
    let mut c = channel("hook", ChannelKind::Webhook, "acme");
    c.reply_url = Some(format!("{base}/keel/replies"));
    let out = Outbound::new(&c, &secrets(None, "bridge-secret")).unwrap();
    let request = one(out
        .prepare(&OutboundMessage::Text {
            to: target("room-7", Some("t-3"), Some("m-2")),
            text: "hello".into(),
        })
        .unwrap());
    assert!(sender().send(&request, 1).await.is_delivered());

    let seen = service.seen.lock().unwrap();
    assert_eq!(seen[0].path, "/keel/replies");
    assert_eq!(
        seen[0].json(),
        json!({
            "type": "message", "channel": "hook", "chat": "room-7",
            "thread": "t-3", "reply_to": "m-2", "text": "hello"
        })
    );
    let ts = seen[0].header("x-keel-timestamp").unwrap();
    let mut signed = format!("{ts}.").into_bytes();
    signed.extend_from_slice(&seen[0].body);
    assert_eq!(
        seen[0].header("x-keel-signature"),
        Some(format!("sha256={}", hmac_hex("bridge-secret", &signed)).as_str())
    );

    let approval = one(out
        .prepare(&OutboundMessage::ApprovalRequest {
            to: target("approvers", None, None),
            approval_id: APPROVAL.into(),
            text: "Restart furnace 2?".into(),
        })
        .unwrap());
    assert_eq!(
        approval.json(),
        json!({
            "type": "approval_request", "channel": "hook", "chat": "approvers",
            "approval_id": APPROVAL, "text": "Restart furnace 2?",
            "decisions": ["approve", "deny"]
        })
    );
    let answer = one(out
        .prepare(&OutboundMessage::ClickAnswer {
            answer: ClickAnswer::Webhook {
                chat: None,
                click_id: "c-1".into(),
            },
            text: "Approved".into(),
        })
        .unwrap());
    assert_eq!(
        answer.json(),
        json!({"type": "click_answer", "channel": "hook", "click_id": "c-1", "text": "Approved"})
    );
}

#[tokio::test]
async fn retries_back_off_report_each_attempt_and_stop_at_success() {
    let service = Service::default();
    {
        let mut replies = service.replies.lock().unwrap();
        replies.push_back((
            429,
            vec![],
            r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 0","parameters":{"retry_after":0}}"#.into(),
        ));
        replies.push_back((502, vec![], "<html>Bad Gateway</html>".into()));
    }
    let (_, out) = telegram(&serve(&service).await);
    let request = one(out
        .prepare(&OutboundMessage::Text {
            to: target("5", None, None),
            text: "hi".into(),
        })
        .unwrap());
    let policy = RetryPolicy {
        attempts: 4,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(10),
    };
    let mut attempts = Vec::new();
    let last = sender()
        .send_with_retry(&request, &policy, |a| attempts.push(a.clone()))
        .await;
    assert!(last.is_delivered());
    let statuses: Vec<(u32, Option<u16>)> = attempts.iter().map(|a| (a.number, a.status)).collect();
    assert_eq!(
        statuses,
        vec![(1, Some(429)), (2, Some(502)), (3, Some(200))]
    );
    assert!(matches!(
        &attempts[0].outcome,
        Outcome::Failed { retryable: true, retry_after: Some(d), error } if d.is_zero() && error.starts_with("Too Many Requests")
    ));
    assert_eq!(service.seen.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn a_connection_failure_is_retryable_and_never_shows_the_token() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let (_, out) = telegram(&base);
    let request = one(out
        .prepare(&OutboundMessage::Text {
            to: target("5", None, None),
            text: "hi".into(),
        })
        .unwrap());
    let attempt = sender().send(&request, 1).await;
    let Outcome::Failed {
        error, retryable, ..
    } = &attempt.outcome
    else {
        panic!("{attempt:?}");
    };
    assert!(retryable);
    assert_eq!(attempt.status, None);
    assert!(!error.contains(TOKEN), "{error}");
    assert!(!error.contains("ABC-DEF"), "{error}");
}

#[test]
fn what_cannot_be_sent_is_an_error_before_sending() {
    let (_, out) = telegram("http://127.0.0.1:1");
    assert!(matches!(
        out.prepare(&OutboundMessage::Text {
            to: target("5", None, None),
            text: "  \n ".into()
        }),
        Err(OutboundError::EmptyText)
    ));
    assert!(matches!(
        out.prepare(&OutboundMessage::Text {
            to: target("5", Some("1700000000.000100"), None),
            text: "x".into()
        }),
        Err(OutboundError::BadTarget(r)) if r.contains("thread")
    ));
    assert!(matches!(
        out.prepare(&OutboundMessage::ApprovalRequest {
            to: target("5", None, None),
            approval_id: "x".repeat(80),
            text: "x".into()
        }),
        Err(OutboundError::Button(_))
    ));
    assert!(matches!(
        out.prepare(&OutboundMessage::ClickAnswer {
            answer: ClickAnswer::Slack {
                response_url: "http://x".into()
            },
            text: "x".into()
        }),
        Err(OutboundError::WrongChannel {
            answer: "slack",
            kind: "telegram"
        })
    ));

    let c = channel("tg", ChannelKind::Telegram, "acme");
    assert!(matches!(
        Outbound::new(&c, &secrets(None, "s")),
        Err(OutboundError::NotConfigured {
            what: "bot token",
            ..
        })
    ));
    let hook = channel("hook", ChannelKind::Webhook, "acme");
    assert!(matches!(
        Outbound::new(&hook, &secrets(None, "s")),
        Err(OutboundError::NotConfigured {
            what: "reply_url",
            ..
        })
    ));
}

#[test]
fn secrets_come_from_the_variables_the_channel_names() {
    let mut c = channel("tg", ChannelKind::Telegram, "acme");
    c.bot_token_env = Some("TG_TOKEN".into());
    c.secret_token_env = Some("TG_SECRET".into());
    let env = MapEnv::new()
        .with("TG_TOKEN", TOKEN)
        .with("TG_SECRET", "s3");
    let s = ChannelSecrets::from_env(&c, &env).unwrap();
    assert!(!format!("{s:?}").contains(TOKEN));
    assert_eq!(
        ChannelSecrets::from_env(&c, &MapEnv::new().with("TG_TOKEN", TOKEN)).unwrap_err(),
        SecretError::Unset {
            channel: "tg".into(),
            key: "secret_token_env",
            var: "TG_SECRET".into()
        }
    );
    let mut webhook = channel("hook", ChannelKind::Webhook, "acme");
    assert_eq!(
        ChannelSecrets::from_env(&webhook, &env).unwrap_err(),
        SecretError::NotConfigured {
            channel: "hook".into(),
            key: "signing_secret_env"
        }
    );
    webhook.signing_secret_env = Some("TG_SECRET".into());
    let s = ChannelSecrets::from_env(&webhook, &env).unwrap();
    assert!(s.bot_token.is_none());
}
