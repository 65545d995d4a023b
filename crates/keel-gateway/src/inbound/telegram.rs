//! Telegram Bot API updates. Telegram authenticates a webhook only by the
//! `secret_token` given to `setWebhook`, sent back in
//! `X-Telegram-Bot-Api-Secret-Token`; there is no signature and no
//! timestamp, so replays are caught by deduplicating `update_id`.

use http::HeaderMap;
use keel_config::ChannelConfig;
use serde::Deserialize;

use super::{
    ApprovalClick, ChatType, ClickAnswer, Parts, Webhook, WebhookError, from_json, required_header,
};
use crate::approval::parse_button_data;
use crate::signature::tokens_equal;

pub(crate) const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

#[derive(Deserialize)]
struct Update {
    update_id: i64,
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    channel_post: Option<Message>,
    #[serde(default)]
    callback_query: Option<CallbackQuery>,
}

#[derive(Deserialize)]
struct Message {
    message_id: i64,
    #[serde(default)]
    message_thread_id: Option<i64>,
    #[serde(default)]
    is_topic_message: bool,
    #[serde(default)]
    from: Option<User>,
    /// Who posted on behalf of a chat: a channel's post, an anonymous
    /// group admin.
    #[serde(default)]
    sender_chat: Option<Chat>,
    chat: Chat,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    caption: Option<String>,
    #[serde(default)]
    reply_to_message: Option<RepliedTo>,
}

/// Only the id of the message replied to is needed; its contents are not
/// read, so however it is shaped it cannot make the update unreadable.
#[derive(Deserialize)]
struct RepliedTo {
    message_id: i64,
}

#[derive(Deserialize)]
struct User {
    id: i64,
    #[serde(default)]
    is_bot: bool,
    #[serde(default)]
    username: Option<String>,
}

#[derive(Deserialize)]
struct Chat {
    id: i64,
    #[serde(rename = "type")]
    kind: TelegramChatType,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum TelegramChatType {
    Private,
    Group,
    Supergroup,
    Channel,
}

#[derive(Deserialize)]
struct CallbackQuery {
    id: String,
    from: User,
    #[serde(default)]
    message: Option<CallbackMessage>,
    #[serde(default)]
    data: Option<String>,
}

/// The message the pressed button is under (possibly too old for Telegram
/// to send in full, so only the ids are read).
#[derive(Deserialize)]
struct CallbackMessage {
    message_id: i64,
    chat: CallbackChat,
}

#[derive(Deserialize)]
struct CallbackChat {
    id: i64,
}

pub(super) fn parse(
    channel: &ChannelConfig,
    secret: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Webhook, WebhookError> {
    let presented = required_header(headers, SECRET_HEADER)?;
    if !tokens_equal(presented.as_bytes(), secret.as_bytes()) {
        return Err(WebhookError::Unauthorized(format!(
            "{SECRET_HEADER} does not match the channel's secret token"
        )));
    }
    let update: Update = from_json(body, "Telegram update")?;
    let dedupe_id = update.update_id.to_string();
    if let Some(query) = update.callback_query {
        return Ok(click(channel, query, dedupe_id));
    }
    let Some(message) = update.message.or(update.channel_post) else {
        return Ok(Webhook::Ignored(
            "Telegram update without a new message or button click".into(),
        ));
    };
    message_webhook(channel, message, dedupe_id)
}

fn message_webhook(
    channel: &ChannelConfig,
    message: Message,
    dedupe_id: String,
) -> Result<Webhook, WebhookError> {
    if message.from.as_ref().is_some_and(|u| u.is_bot) {
        return Ok(Webhook::Ignored("message from a bot".into()));
    }
    // Blank text is no text, as for the other adapters: it would start a
    // run with nothing to answer.
    let Some(text) = message
        .text
        .or(message.caption)
        .filter(|t| !t.trim().is_empty())
    else {
        return Ok(Webhook::Ignored("message without text".into()));
    };
    let (sender, sender_name) = match (&message.from, &message.sender_chat) {
        (Some(user), _) => (user.id.to_string(), user.username.clone()),
        (None, Some(chat)) => (chat.id.to_string(), None),
        (None, None) => {
            return Err(WebhookError::BadRequest(
                "message has neither from nor sender_chat".into(),
            ));
        }
    };
    let chat_type = match message.chat.kind {
        TelegramChatType::Private => ChatType::Direct,
        TelegramChatType::Group | TelegramChatType::Supergroup => ChatType::Group,
        TelegramChatType::Channel => ChatType::Channel,
    };
    // Outside forum topics `message_thread_id` only marks reply chains;
    // sending with it there fails, so only a topic is a thread.
    let thread = message
        .message_thread_id
        .filter(|_| message.is_topic_message);
    // In a topic every message "replies" to the topic's first message;
    // that is the thread, not a reply.
    let reply_to = message
        .reply_to_message
        .map(|r| r.message_id)
        .filter(|id| Some(*id) != thread);
    Ok(Webhook::Message(Box::new(
        Parts {
            account: channel.id.clone(),
            sender,
            sender_name,
            chat_type,
            chat: message.chat.id.to_string(),
            guild: None,
            team: None,
            roles: Vec::new(),
            thread: thread.map(|t| t.to_string()),
            reply_to: reply_to.map(|r| r.to_string()),
            text,
            dedupe_id,
            message: Some(message.message_id.to_string()),
        }
        .build(channel),
    )))
}

fn click(channel: &ChannelConfig, query: CallbackQuery, dedupe_id: String) -> Webhook {
    let Some((decision, approval_id)) = query.data.as_deref().and_then(parse_button_data) else {
        return Webhook::Ignored("button click that is not a keel approval".into());
    };
    Webhook::Click(Box::new(ApprovalClick {
        channel: channel.id.clone(),
        tenant: channel.tenant.clone(),
        sender: query.from.id.to_string(),
        approval_id,
        decision,
        chat: query.message.as_ref().map(|m| m.chat.id.to_string()),
        message: query.message.as_ref().map(|m| m.message_id.to_string()),
        team: None,
        answer: ClickAnswer::Telegram {
            callback_query_id: query.id,
            chat: query.message.as_ref().map(|m| m.chat.id.to_string()),
            message_id: query.message.as_ref().map(|m| m.message_id.to_string()),
        },
        dedupe_id,
    }))
}
