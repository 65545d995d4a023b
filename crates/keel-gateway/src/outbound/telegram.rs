//! Telegram Bot API requests: `POST {api_base}/bot{token}/{method}`.
//! Text is sent without `parse_mode`, so nothing in an answer is read as
//! markup.

use serde_json::{Value, json};

use super::text::{split_text, truncate};
use super::{
    Outbound, OutboundError, OutboundMessage, PreparedRequest, ResponseKind, answer_kind, json_body,
};
use crate::approval::{Decision, button_data};
use crate::inbound::{ClickAnswer, ReplyTarget};

/// Telegram's limit on a message's text.
const MESSAGE_MAX: usize = 4096;
/// Telegram's limit on a callback answer's notification.
const CALLBACK_TEXT_MAX: usize = 200;

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
            pieces
                .iter()
                .enumerate()
                // Only the first piece quotes the message it answers.
                .map(|(i, piece)| send_message(out, to, piece, i == 0, None))
                .collect()
        }
        OutboundMessage::ApprovalRequest {
            to,
            approval_id,
            text,
        } => {
            let keyboard = json!({"inline_keyboard": [[
                {"text": "Approve", "callback_data": button_data(Decision::Approve, approval_id)?},
                {"text": "Deny", "callback_data": button_data(Decision::Deny, approval_id)?},
            ]]});
            let text = truncate(text.trim(), MESSAGE_MAX);
            if text.is_empty() {
                return Err(OutboundError::EmptyText);
            }
            Ok(vec![send_message(out, to, &text, true, Some(keyboard))?])
        }
        OutboundMessage::ClickAnswer { answer, text } => {
            let ClickAnswer::Telegram {
                callback_query_id,
                chat,
                message_id,
            } = answer
            else {
                return Err(OutboundError::WrongChannel {
                    answer: answer_kind(answer),
                    kind: "telegram",
                });
            };
            let mut requests = vec![request(
                out,
                Method::AnswerCallbackQuery,
                &json!({
                    "callback_query_id": callback_query_id,
                    "text": truncate(text, CALLBACK_TEXT_MAX),
                }),
            )];
            // Without its buttons the request cannot be decided twice.
            if let (Some(chat), Some(message_id)) = (chat, message_id) {
                requests.push(request(
                    out,
                    Method::EditMessageReplyMarkup,
                    &json!({
                        "chat_id": chat_id(chat),
                        "message_id": integer(message_id, "message_id")?,
                        "reply_markup": {"inline_keyboard": []},
                    }),
                ));
            }
            Ok(requests)
        }
    }
}

fn send_message(
    out: &Outbound,
    to: &ReplyTarget,
    text: &str,
    quote: bool,
    reply_markup: Option<Value>,
) -> Result<PreparedRequest, OutboundError> {
    let mut body = json!({"chat_id": chat_id(&to.chat), "text": text});
    if let Some(thread) = &to.thread {
        body["message_thread_id"] = json!(integer(thread, "thread")?);
    }
    if quote && let Some(message) = &to.message {
        // The replied-to message may be gone by the time the answer is
        // ready; the answer is still worth sending.
        body["reply_parameters"] = json!({
            "message_id": integer(message, "message")?,
            "allow_sending_without_reply": true,
        });
    }
    if let Some(markup) = reply_markup {
        body["reply_markup"] = markup;
    }
    Ok(request(out, Method::SendMessage, &body))
}

/// The Bot API methods keel calls.
#[derive(Clone, Copy)]
enum Method {
    SendMessage,
    AnswerCallbackQuery,
    EditMessageReplyMarkup,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Self::SendMessage => "sendMessage",
            Self::AnswerCallbackQuery => "answerCallbackQuery",
            Self::EditMessageReplyMarkup => "editMessageReplyMarkup",
        }
    }

    fn operation(self) -> &'static str {
        match self {
            Self::SendMessage => "telegram.sendMessage",
            Self::AnswerCallbackQuery => "telegram.answerCallbackQuery",
            Self::EditMessageReplyMarkup => "telegram.editMessageReplyMarkup",
        }
    }
}

fn request(out: &Outbound, method: Method, body: &Value) -> PreparedRequest {
    let name = method.name();
    PreparedRequest {
        url: format!("{}/bot{}/{name}", out.api_base, out.token()),
        target: format!("{}/bot<token>/{name}", out.api_base),
        operation: method.operation(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: json_body(body),
        response: ResponseKind::TelegramApi,
        sign_with: None,
    }
}

/// Chat ids are integers, except `@channelusername`.
fn chat_id(chat: &str) -> Value {
    match chat.parse::<i64>() {
        Ok(id) => json!(id),
        Err(_) => json!(chat),
    }
}

fn integer(value: &str, what: &str) -> Result<i64, OutboundError> {
    value.parse().map_err(|_| {
        OutboundError::BadTarget(format!("Telegram {what} {value:?} is not an integer"))
    })
}
