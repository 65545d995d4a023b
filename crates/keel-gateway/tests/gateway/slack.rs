use keel_config::ChannelKind;
use keel_gateway::{
    ChatType, ClickAnswer, Command, Decision, Inbound, Webhook, WebhookError, parse,
};
use serde_json::json;

use crate::common::{NOW_SECS, channel, headers, now, slack_headers};

/// The signing secret of Slack's own verification example.
const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const JSON: &str = "application/json";
const FORM: &str = "application/x-www-form-urlencoded";

fn slack() -> keel_config::ChannelConfig {
    channel("slack", ChannelKind::Slack, "acme")
}

fn send_at(ts: u64, body: &[u8], content_type: &str) -> Result<Webhook, WebhookError> {
    parse(
        &slack(),
        SECRET,
        &slack_headers(SECRET, ts, body, content_type),
        body,
        now(),
    )
}

fn send(body: &serde_json::Value) -> Result<Webhook, WebhookError> {
    send_at(NOW_SECS, body.to_string().as_bytes(), JSON)
}

fn message(w: Result<Webhook, WebhookError>) -> Inbound {
    match w {
        Ok(Webhook::Message(m)) => *m,
        other => panic!("expected a message, got {other:?}"),
    }
}

/// An `event_callback` envelope as the Events API delivers it.
fn callback(event: serde_json::Value) -> serde_json::Value {
    json!({
        "token": "XXYYZZ",
        "team_id": "T123ABC456",
        "api_app_id": "A123ABC456",
        "event": event,
        "type": "event_callback",
        "event_id": "Ev123ABC456",
        "event_time": 1700000000,
        "authorizations": [{
            "enterprise_id": null, "team_id": "T123ABC456",
            "user_id": "U0BOTUSER", "is_bot": true, "is_enterprise_install": false
        }],
        "is_ext_shared_channel": false,
        "event_context": "4-eyJldCI6Im1lc3NhZ2UiLCJ0aWQiOiJUMTIzIn0"
    })
}

fn im_message() -> serde_json::Value {
    callback(json!({
        "type": "message",
        "channel": "D024BE91L",
        "user": "U2147483697",
        "text": "What is the status of furnace 2?",
        "ts": "1700000000.000200",
        "event_ts": "1700000000.000200",
        "channel_type": "im"
    }))
}

#[test]
fn slacks_documented_signature_verifies() {
    // The example request of Slack's "Verifying requests from Slack".
    let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    let ts = 1_531_420_618;
    let h = headers(&[
        ("X-Slack-Request-Timestamp", "1531420618"),
        (
            "X-Slack-Signature",
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
        ),
        ("Content-Type", FORM),
    ]);
    let then = std::time::UNIX_EPOCH + std::time::Duration::from_secs(ts);
    // Authentic: it gets past the signature to the (slash command) body,
    // which is not an interaction keel reads.
    let r = parse(&slack(), SECRET, &h, body, then);
    assert!(
        matches!(&r, Err(WebhookError::BadRequest(reason)) if reason.contains("payload")),
        "{r:?}"
    );
    // One byte changed and it is not.
    let mut tampered = body.to_vec();
    tampered[6] = b'X';
    assert_eq!(
        parse(&slack(), SECRET, &h, &tampered, then),
        Err(WebhookError::Unauthorized(
            "signature does not match".into()
        ))
    );
}

#[test]
fn url_verification_answers_the_challenge() {
    let body = json!({
        "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
        "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
        "type": "url_verification"
    });
    assert_eq!(
        send(&body),
        Ok(Webhook::Challenge(
            "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P".into()
        ))
    );
}

#[test]
fn a_direct_message_is_read() {
    let m = message(send(&im_message()));
    assert_eq!(m.channel, "slack");
    assert_eq!(m.tenant, "acme");
    assert_eq!(m.account, "A123ABC456");
    assert_eq!(m.team.as_deref(), Some("T123ABC456"));
    assert_eq!(m.sender, "U2147483697");
    assert_eq!(m.chat_type, ChatType::Direct);
    assert_eq!(m.chat, "D024BE91L");
    assert_eq!(m.peer, "U2147483697");
    assert_eq!(m.text, "What is the status of furnace 2?");
    assert_eq!(m.dedupe_id, "Ev123ABC456");
    assert_eq!(m.reply.chat, "D024BE91L");
    assert_eq!(m.reply.thread, None);
    assert_eq!(m.reply.message.as_deref(), Some("1700000000.000200"));
}

#[test]
fn an_app_mention_in_a_thread_loses_the_mention_and_keeps_the_command() {
    let event = callback(json!({
        "type": "app_mention",
        "user": "U061F7AUR",
        "text": "<@U0BOTUSER> /reset",
        "ts": "1700000100.000300",
        "thread_ts": "1700000000.000100",
        "channel": "C123ABC456",
        "event_ts": "1700000100.000300"
    }));
    let m = message(send(&event));
    assert_eq!(
        m.chat_type,
        ChatType::Group,
        "app_mention has no channel_type"
    );
    assert_eq!(m.text, "/reset");
    assert_eq!(m.command, Some(Command::Reset));
    assert_eq!(m.thread.as_deref(), Some("1700000000.000100"));
    assert_eq!(m.peer, "C123ABC456:1700000000.000100");
    assert_eq!(m.parent_peer.as_deref(), Some("C123ABC456"));
    assert_eq!(m.reply.thread.as_deref(), Some("1700000000.000100"));
}

#[test]
fn slack_escapes_are_undone_and_an_empty_mention_is_ignored() {
    let mut escaped = im_message();
    escaped["event"]["text"] = json!("is 3 &lt; 5 &amp;&amp; 7 &gt; 2? not &amp;lt;");
    assert_eq!(message(send(&escaped)).text, "is 3 < 5 && 7 > 2? not &lt;");
    let bare = callback(json!({
        "type": "app_mention", "user": "U061F7AUR", "text": "<@U0BOTUSER> ",
        "ts": "1700000100.000300", "channel": "C123ABC456"
    }));
    assert_eq!(
        send(&bare),
        Ok(Webhook::Ignored("message without text".into()))
    );
}

#[test]
fn channel_messages_are_group_messages_unless_they_mention_the_app() {
    let plain = callback(json!({
        "type": "message", "channel": "C123ABC456", "user": "U061F7AUR",
        "text": "shift handover done", "ts": "1700000000.000400", "channel_type": "channel"
    }));
    let m = message(send(&plain));
    assert_eq!(m.chat_type, ChatType::Group);
    assert_eq!(m.peer, "C123ABC456");

    // The same message also arrives as app_mention, which is answered.
    let mut mention = plain.clone();
    mention["event"]["text"] = json!("<@U0BOTUSER> status?");
    assert!(matches!(send(&mention), Ok(Webhook::Ignored(r)) if r.contains("app_mention")));

    // A thread's first message is not inside its thread.
    let mut root = plain.clone();
    root["event"]["thread_ts"] = json!("1700000000.000400");
    let m = message(send(&root));
    assert_eq!((m.thread, m.peer.as_str()), (None, "C123ABC456"));

    for kind in ["group", "mpim"] {
        let mut private = plain.clone();
        private["event"]["channel_type"] = json!(kind);
        assert_eq!(message(send(&private)).chat_type, ChatType::Group);
    }
}

#[test]
fn bot_messages_edits_and_other_events_are_ignored() {
    let mut bot = im_message();
    bot["event"]["subtype"] = json!("bot_message");
    bot["event"]["bot_id"] = json!("B0123");
    assert!(matches!(send(&bot), Ok(Webhook::Ignored(r)) if r.contains("bot_message")));

    // A bot token's own posts come without a subtype but with bot_id.
    let mut own = im_message();
    own["event"]["bot_id"] = json!("B0123");
    own["event"]["user"] = json!("U0BOTUSER");
    assert_eq!(
        send(&own),
        Ok(Webhook::Ignored("message from a bot".into()))
    );

    let changed = callback(json!({
        "type": "message", "subtype": "message_changed", "hidden": true,
        "channel": "C123ABC456", "ts": "1700000000.000500", "event_ts": "1700000000.000500",
        "message": {"type": "message", "user": "U061F7AUR", "text": "edited", "ts": "1700000000.000400"},
        "previous_message": {"type": "message", "user": "U061F7AUR", "text": "orig", "ts": "1700000000.000400"},
        "channel_type": "channel"
    }));
    assert!(matches!(send(&changed), Ok(Webhook::Ignored(r)) if r.contains("message_changed")));

    let reaction = callback(json!({
        "type": "reaction_added", "user": "U061F7AUR", "reaction": "thumbsup",
        "item": {"type": "message", "channel": "C123ABC456", "ts": "1700000000.000400"},
        "event_ts": "1700000000.000600"
    }));
    assert!(matches!(send(&reaction), Ok(Webhook::Ignored(_))));

    let limited = json!({
        "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "type": "app_rate_limited",
        "team_id": "T123ABC456", "minute_rate_limited": 1518467820, "api_app_id": "A123ABC456"
    });
    assert!(matches!(send(&limited), Ok(Webhook::Ignored(_))));

    // A thread reply also sent to the channel is still a person writing.
    let mut broadcast = im_message();
    broadcast["event"]["subtype"] = json!("thread_broadcast");
    assert!(matches!(send(&broadcast), Ok(Webhook::Message(_))));
}

/// A `block_actions` payload as Slack posts it: form-encoded `payload=`.
fn block_actions(value: &str) -> Vec<u8> {
    let payload = json!({
        "type": "block_actions",
        "user": {"id": "U2147483697", "username": "alice", "name": "alice", "team_id": "T123ABC456"},
        "api_app_id": "A123ABC456",
        "token": "9s8d9as89d8as9d8as989",
        "container": {
            "type": "message", "message_ts": "1700000200.000100",
            "channel_id": "C0APPROVE", "is_ephemeral": false
        },
        "trigger_id": "12321423423.333649436676.d8c1bb837935619ccad0f624c448ffb3",
        "team": {"id": "T123ABC456", "domain": "acme-plant"},
        "enterprise": null,
        "is_enterprise_install": false,
        "channel": {"id": "C0APPROVE", "name": "approvals"},
        "message": {
            "bot_id": "B0123", "type": "message", "text": "Restart furnace 2?",
            "user": "U0BOTUSER", "ts": "1700000200.000100", "team": "T123ABC456",
            "blocks": []
        },
        "state": {"values": {}},
        "response_url": "https://hooks.slack.com/actions/T123ABC456/1232321423432/D09sSasdasdAS9091209",
        "actions": [{
            "action_id": "keel_deny",
            "block_id": "keel_approval",
            "text": {"type": "plain_text", "text": "Deny", "emoji": true},
            "value": value,
            "style": "danger",
            "type": "button",
            "action_ts": "1700000210.840180"
        }]
    });
    serde_urlencoded::to_string([("payload", payload.to_string())])
        .unwrap()
        .into_bytes()
}

#[test]
fn approval_buttons_arrive_as_block_actions() {
    let id = "apr_0123456789abcdef0123456789abcdef";
    let body = block_actions(&format!("deny:{id}"));
    let Ok(Webhook::Click(click)) = send_at(NOW_SECS, &body, FORM) else {
        panic!("expected a click");
    };
    assert_eq!(click.channel, "slack");
    assert_eq!(click.sender, "U2147483697");
    assert_eq!(click.approval_id, id);
    assert_eq!(click.decision, Decision::Deny);
    assert_eq!(click.chat.as_deref(), Some("C0APPROVE"));
    assert_eq!(click.message.as_deref(), Some("1700000200.000100"));
    assert_eq!(click.team.as_deref(), Some("T123ABC456"));
    assert_eq!(
        click.dedupe_id,
        "12321423423.333649436676.d8c1bb837935619ccad0f624c448ffb3"
    );
    assert_eq!(
        click.answer,
        ClickAnswer::Slack {
            response_url:
                "https://hooks.slack.com/actions/T123ABC456/1232321423432/D09sSasdasdAS9091209"
                    .into()
        }
    );

    let foreign = block_actions("click_me_123");
    assert!(matches!(
        send_at(NOW_SECS, &foreign, FORM),
        Ok(Webhook::Ignored(_))
    ));
}

/// Found with the `gateway_webhook` fuzz target, whose check is that a
/// click has an id to drop repeats by: an empty trigger_id was that id,
/// so every click with one would have been a repeat of the first.
#[test]
fn a_click_with_an_empty_trigger_id_is_told_apart_by_its_action_ts() {
    let id = "apr_0123456789abcdef0123456789abcdef";
    let body = String::from_utf8(block_actions(&format!("approve:{id}"))).unwrap();
    let without = body.replace(
        "12321423423.333649436676.d8c1bb837935619ccad0f624c448ffb3",
        "",
    );
    assert_ne!(body, without);
    let Ok(Webhook::Click(click)) = send_at(NOW_SECS, without.as_bytes(), FORM) else {
        panic!("expected a click");
    };
    assert_eq!(click.dedupe_id, "1700000210.840180");

    let neither = without.replace("1700000210.840180", "");
    assert!(matches!(
        send_at(NOW_SECS, neither.as_bytes(), FORM),
        Err(WebhookError::BadRequest(m)) if m.contains("trigger_id")
    ));
}

#[test]
fn old_future_and_unsigned_requests_are_unauthorized() {
    let body = im_message().to_string();
    let old = send_at(NOW_SECS - 600, body.as_bytes(), JSON);
    assert_eq!(
        old,
        Err(WebhookError::Unauthorized(
            "x-slack-request-timestamp is 600 s old; at most 300 s are accepted".into()
        ))
    );
    assert!(matches!(
        send_at(NOW_SECS + 400, body.as_bytes(), JSON),
        Err(WebhookError::Unauthorized(r)) if r.contains("in the future")
    ));
    // Four minutes late is still inside the window.
    assert!(send_at(NOW_SECS - 240, body.as_bytes(), JSON).is_ok());

    let signed = slack_headers(SECRET, NOW_SECS, body.as_bytes(), JSON);
    let mut no_signature = signed.clone();
    no_signature.remove("x-slack-signature");
    assert_eq!(
        parse(&slack(), SECRET, &no_signature, body.as_bytes(), now()),
        Err(WebhookError::Unauthorized(
            "missing x-slack-signature header".into()
        ))
    );
    let mut no_timestamp = signed.clone();
    no_timestamp.remove("x-slack-request-timestamp");
    assert!(matches!(
        parse(&slack(), SECRET, &no_timestamp, body.as_bytes(), now()),
        Err(WebhookError::Unauthorized(r)) if r.contains("x-slack-request-timestamp")
    ));
    let other_secret = slack_headers("another-secret", NOW_SECS, body.as_bytes(), JSON);
    assert_eq!(
        parse(&slack(), SECRET, &other_secret, body.as_bytes(), now()),
        Err(WebhookError::Unauthorized(
            "signature does not match".into()
        ))
    );
    let mut unversioned = signed.clone();
    let bare = signed["x-slack-signature"].to_str().unwrap()[3..].to_owned();
    unversioned.insert("x-slack-signature", bare.parse().unwrap());
    assert!(matches!(
        parse(&slack(), SECRET, &unversioned, body.as_bytes(), now()),
        Err(WebhookError::Unauthorized(r)) if r.contains("v0=")
    ));
    // The signature covers the timestamp: moving it breaks the signature.
    let mut moved = signed;
    moved.insert(
        "x-slack-request-timestamp",
        (NOW_SECS - 1).to_string().parse().unwrap(),
    );
    assert!(matches!(
        parse(&slack(), SECRET, &moved, body.as_bytes(), now()),
        Err(WebhookError::Unauthorized(_))
    ));
}

#[test]
fn malformed_bodies_name_what_is_wrong() {
    let reason = |r: Result<Webhook, WebhookError>| match r {
        Err(WebhookError::BadRequest(reason)) => reason,
        other => panic!("expected a bad request, got {other:?}"),
    };
    assert!(reason(send_at(NOW_SECS, b"{", JSON)).starts_with("Slack event: "));
    let mut no_event = im_message();
    no_event.as_object_mut().unwrap().remove("event");
    let r = reason(send(&no_event));
    assert!(r.contains("missing field `event`"), "{r}");
    let mut no_user = im_message();
    no_user["event"].as_object_mut().unwrap().remove("user");
    assert_eq!(reason(send(&no_user)), "event.user is missing");
    let mut wrong_type = im_message();
    wrong_type["event"]["ts"] = json!(1700000000.0002);
    let r = reason(send(&wrong_type));
    assert!(r.contains("event.ts: invalid type"), "{r}");
    let r = reason(send_at(NOW_SECS, b"action=1", FORM));
    assert!(r.contains("expected payload=<json>"), "{r}");
    let r = reason(send_at(NOW_SECS, b"payload=%7Bnope", FORM));
    assert!(r.starts_with("Slack interaction payload: "), "{r}");
}
