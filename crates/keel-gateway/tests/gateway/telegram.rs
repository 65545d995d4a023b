use keel_config::ChannelKind;
use keel_gateway::{
    ChatType, ClickAnswer, Command, Decision, Inbound, ReplyTarget, Webhook, WebhookError, parse,
};
use serde_json::json;

use crate::common::{channel, headers, now};

const SECRET: &str = "tg-Secret_token-123";

fn tg() -> keel_config::ChannelConfig {
    channel("tg", ChannelKind::Telegram, "acme")
}

fn send(body: &serde_json::Value) -> Result<Webhook, WebhookError> {
    parse(
        &tg(),
        SECRET,
        &headers(&[
            ("X-Telegram-Bot-Api-Secret-Token", SECRET),
            ("Content-Type", "application/json"),
        ]),
        body.to_string().as_bytes(),
        now(),
    )
}

fn message(w: Result<Webhook, WebhookError>) -> Inbound {
    match w {
        Ok(Webhook::Message(m)) => *m,
        other => panic!("expected a message, got {other:?}"),
    }
}

/// A private chat, as in the Bot API's webhook examples.
fn private_update() -> serde_json::Value {
    json!({
        "update_id": 10000,
        "message": {
            "message_id": 1365,
            "from": {
                "id": 1111111, "is_bot": false, "first_name": "Test",
                "last_name": "Lastname", "username": "Testuser", "language_code": "en"
            },
            "chat": {
                "id": 1111111, "first_name": "Test", "last_name": "Lastname",
                "username": "Testuser", "type": "private"
            },
            "date": 1441645532,
            "text": "How hot is furnace 2?"
        }
    })
}

#[test]
fn a_private_message_is_a_direct_message() {
    let m = message(send(&private_update()));
    assert_eq!(m.channel, "tg");
    assert_eq!(m.kind, ChannelKind::Telegram);
    assert_eq!(m.tenant, "acme");
    assert_eq!(m.account, "tg");
    assert_eq!(m.sender, "1111111");
    assert_eq!(m.sender_name.as_deref(), Some("Testuser"));
    assert_eq!(m.chat_type, ChatType::Direct);
    assert_eq!(m.chat, "1111111");
    assert_eq!(m.peer, "1111111");
    assert_eq!(m.parent_peer, None);
    assert_eq!(m.thread, None);
    assert_eq!(m.reply_to, None);
    assert_eq!(m.text, "How hot is furnace 2?");
    assert_eq!(m.dedupe_id, "10000");
    assert_eq!(
        m.reply,
        ReplyTarget {
            chat: "1111111".into(),
            thread: None,
            message: Some("1365".into()),
        }
    );
    assert_eq!(m.command, None);
    assert!(!m.command_authorized);
}

#[test]
fn a_forum_topic_message_is_a_thread_of_its_group_with_a_command() {
    let update = json!({
        "update_id": 10001,
        "message": {
            "message_id": 88,
            "message_thread_id": 42,
            "is_topic_message": true,
            "from": {"id": 2222, "is_bot": false, "first_name": "Ops", "username": "ops_lead"},
            "chat": {"id": -1001234567890i64, "title": "Plant ops", "is_forum": true, "type": "supergroup"},
            "date": 1700000000,
            // In a topic, every message replies to the topic's first message.
            "reply_to_message": {
                "message_id": 42,
                "from": {"id": 2222, "is_bot": false, "first_name": "Ops"},
                "chat": {"id": -1001234567890i64, "title": "Plant ops", "is_forum": true, "type": "supergroup"},
                "date": 1699990000,
                "forum_topic_created": {"name": "Furnaces", "icon_color": 7322096}
            },
            "text": "/stop@KeelOpsBot",
            "entities": [{"offset": 0, "length": 16, "type": "bot_command"}]
        }
    });
    let m = message(send(&update));
    assert_eq!(m.chat_type, ChatType::Group);
    assert_eq!(m.chat, "-1001234567890");
    assert_eq!(m.thread.as_deref(), Some("42"));
    assert_eq!(m.peer, "-1001234567890:42");
    assert_eq!(m.parent_peer.as_deref(), Some("-1001234567890"));
    assert_eq!(
        m.reply_to, None,
        "the topic root is the thread, not a reply"
    );
    assert_eq!(m.command, Some(Command::Stop));
    assert_eq!(m.reply.thread.as_deref(), Some("42"));
}

#[test]
fn a_reply_in_a_plain_group_is_no_thread() {
    let update = json!({
        "update_id": 10002,
        "message": {
            "message_id": 90,
            // Plain supergroups mark reply chains with a thread id too.
            "message_thread_id": 85,
            "from": {"id": 2222, "is_bot": false, "first_name": "Ops"},
            "chat": {"id": -100777, "title": "Shift", "type": "group"},
            "date": 1700000000,
            "reply_to_message": {
                "message_id": 85,
                "from": {"id": 3333, "is_bot": false, "first_name": "Other"},
                "chat": {"id": -100777, "title": "Shift", "type": "group"},
                "date": 1699999000,
                "text": "earlier"
            },
            "text": "/reset"
        }
    });
    let m = message(send(&update));
    assert_eq!(m.chat_type, ChatType::Group);
    assert_eq!(m.thread, None);
    assert_eq!(m.peer, "-100777");
    assert_eq!(m.reply_to.as_deref(), Some("85"));
    assert_eq!(m.command, Some(Command::Reset));
}

#[test]
fn a_channel_post_is_a_channel_message_from_the_channel() {
    let update = json!({
        "update_id": 10003,
        "channel_post": {
            "message_id": 5,
            "sender_chat": {"id": -100555, "title": "Announcements", "type": "channel"},
            "chat": {"id": -100555, "title": "Announcements", "type": "channel"},
            "date": 1700000000,
            "text": "/new"
        }
    });
    let m = message(send(&update));
    assert_eq!(m.chat_type, ChatType::Channel);
    assert_eq!(m.sender, "-100555");
    assert_eq!(m.command, Some(Command::New));
}

#[test]
fn a_photo_caption_is_the_text() {
    let mut update = private_update();
    let msg = update["message"].as_object_mut().unwrap();
    msg.remove("text");
    msg.insert("caption".into(), json!("see this"));
    msg.insert(
        "photo".into(),
        json!([{"file_id": "AgAD", "file_unique_id": "AQAD", "width": 90, "height": 90}]),
    );
    assert_eq!(message(send(&update)).text, "see this");
}

#[test]
fn approval_button_clicks_are_clicks() {
    let id = "apr_0123456789abcdef0123456789abcdef";
    let update = json!({
        "update_id": 10004,
        "callback_query": {
            "id": "4382bfdwdsb323b2d9",
            "from": {"id": 1111111, "is_bot": false, "first_name": "Test", "username": "Testuser"},
            "message": {
                "message_id": 1400,
                "from": {"id": 999, "is_bot": true, "first_name": "Keel", "username": "KeelOpsBot"},
                "chat": {"id": -100777, "title": "Approvers", "type": "group"},
                "date": 1700000000,
                "text": "Restart furnace 2?",
                "reply_markup": {"inline_keyboard": [[
                    {"text": "Approve", "callback_data": format!("approve:{id}")},
                    {"text": "Deny", "callback_data": format!("deny:{id}")}
                ]]}
            },
            "chat_instance": "-8851932412563298763",
            "data": format!("approve:{id}")
        }
    });
    let Ok(Webhook::Click(click)) = send(&update) else {
        panic!("expected a click");
    };
    assert_eq!(click.channel, "tg");
    assert_eq!(click.tenant, "acme");
    assert_eq!(click.sender, "1111111");
    assert_eq!(click.approval_id, id);
    assert_eq!(click.decision, Decision::Approve);
    assert_eq!(click.chat.as_deref(), Some("-100777"));
    assert_eq!(click.message.as_deref(), Some("1400"));
    assert_eq!(click.dedupe_id, "10004");
    assert_eq!(
        click.answer,
        ClickAnswer::Telegram {
            callback_query_id: "4382bfdwdsb323b2d9".into(),
            chat: Some("-100777".into()),
            message_id: Some("1400".into()),
        }
    );

    // Someone else's buttons are not approvals.
    let mut other = update.clone();
    other["callback_query"]["data"] = json!("page:2");
    assert!(matches!(send(&other), Ok(Webhook::Ignored(_))));
}

#[test]
fn edits_bots_and_textless_messages_are_ignored() {
    let edited = json!({
        "update_id": 10005,
        "edited_message": {
            "message_id": 1365,
            "from": {"id": 1111111, "is_bot": false, "first_name": "Test"},
            "chat": {"id": 1111111, "type": "private"},
            "date": 1441645532, "edit_date": 1441645600, "text": "changed"
        }
    });
    assert!(matches!(send(&edited), Ok(Webhook::Ignored(_))));

    let mut bot = private_update();
    bot["message"]["from"]["is_bot"] = json!(true);
    assert_eq!(
        send(&bot),
        Ok(Webhook::Ignored("message from a bot".into()))
    );

    let mut sticker = private_update();
    sticker["message"].as_object_mut().unwrap().remove("text");
    sticker["message"]["sticker"] = json!({"file_id": "CAAC", "width": 512, "height": 512});
    assert_eq!(
        send(&sticker),
        Ok(Webhook::Ignored("message without text".into()))
    );
}

/// Found with the `gateway_webhook` fuzz target, whose check is that a
/// message has text: blank text or caption was a message with nothing to
/// answer, where the other adapters ignore it.
#[test]
fn blank_text_and_captions_are_ignored() {
    for blank in ["", "  \n\t"] {
        let mut update = private_update();
        update["message"]["text"] = json!(blank);
        assert_eq!(
            send(&update),
            Ok(Webhook::Ignored("message without text".into())),
            "{blank:?}"
        );
        update["message"].as_object_mut().unwrap().remove("text");
        update["message"]["caption"] = json!(blank);
        assert_eq!(
            send(&update),
            Ok(Webhook::Ignored("message without text".into())),
            "caption {blank:?}"
        );
    }
}

#[test]
fn the_secret_token_must_be_present_and_equal() {
    let body = private_update().to_string();
    let wrong = parse(
        &tg(),
        SECRET,
        &headers(&[("X-Telegram-Bot-Api-Secret-Token", "tg-Secret_token-124")]),
        body.as_bytes(),
        now(),
    );
    assert!(
        matches!(&wrong, Err(WebhookError::Unauthorized(r)) if r.contains("does not match")),
        "{wrong:?}"
    );
    let prefix = parse(
        &tg(),
        SECRET,
        &headers(&[("X-Telegram-Bot-Api-Secret-Token", "tg-Secret")]),
        body.as_bytes(),
        now(),
    );
    assert!(matches!(prefix, Err(WebhookError::Unauthorized(_))));
    let missing = parse(&tg(), SECRET, &headers(&[]), body.as_bytes(), now());
    assert_eq!(
        missing,
        Err(WebhookError::Unauthorized(
            "missing x-telegram-bot-api-secret-token header".into()
        ))
    );
    // A channel whose secret is missing refuses everything, even a request
    // presenting an empty token.
    let unset = parse(
        &tg(),
        "",
        &headers(&[("X-Telegram-Bot-Api-Secret-Token", "")]),
        body.as_bytes(),
        now(),
    );
    assert!(matches!(unset, Err(WebhookError::Unauthorized(_))));
}

#[test]
fn malformed_updates_name_what_is_wrong() {
    let bad = |body: &[u8]| {
        parse(
            &tg(),
            SECRET,
            &headers(&[("X-Telegram-Bot-Api-Secret-Token", SECRET)]),
            body,
            now(),
        )
    };
    let reason = |r: Result<Webhook, WebhookError>| match r {
        Err(WebhookError::BadRequest(reason)) => reason,
        other => panic!("expected a bad request, got {other:?}"),
    };
    assert!(reason(bad(b"not json")).starts_with("Telegram update: "));
    let mut chat_id = private_update();
    chat_id["message"]["chat"]["id"] = json!("1111111");
    let r = reason(send(&chat_id));
    assert!(r.contains("message.chat.id: invalid type: string"), "{r}");
    let mut kind = private_update();
    kind["message"]["chat"]["type"] = json!("secret_chat");
    let r = reason(send(&kind));
    assert!(
        r.contains("message.chat.type: unknown variant `secret_chat`"),
        "{r}"
    );
    let r = reason(send(&json!({"message": private_update()["message"]})));
    assert!(r.contains("missing field `update_id`"), "{r}");
    let mut anonymous = private_update();
    anonymous["message"].as_object_mut().unwrap().remove("from");
    assert_eq!(
        reason(send(&anonymous)),
        "message has neither from nor sender_chat"
    );
}
