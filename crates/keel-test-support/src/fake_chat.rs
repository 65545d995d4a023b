//! Fake Telegram Bot API and Slack Web API servers for gateway tests. They
//! check what the real services check (the bot token in the path or the
//! `Authorization` header, the required fields), answer in the real
//! services' shapes, record every request, and can be told to fail the
//! next few sends to exercise retries.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `sendMessage`, `answerCallbackQuery`, `chat.postMessage`, `response`.
    pub method: String,
    /// The token the request carried (Telegram: in the path; Slack: the
    /// bearer token), if any.
    pub token: Option<String>,
    pub body: Value,
    /// Whether the fake accepted it.
    pub accepted: bool,
}

#[derive(Default)]
struct Inner {
    token: String,
    received: Mutex<Vec<Received>>,
    /// Sends still to fail with a 500.
    fail_next: AtomicU64,
    next_id: AtomicU64,
}

pub struct FakeChat {
    addr: SocketAddr,
    inner: Arc<Inner>,
    _task: tokio::task::JoinHandle<()>,
}

impl FakeChat {
    /// Serves both APIs: Telegram under `/bot<token>/<method>`, Slack under
    /// `/<method>` (`chat.postMessage`), and a Slack `response_url` at
    /// `/response`. `token` is the one bot token it accepts.
    pub async fn start(token: &str) -> FakeChat {
        let inner = Arc::new(Inner {
            token: token.to_owned(),
            next_id: AtomicU64::new(100),
            ..Inner::default()
        });
        let app = Router::new()
            .route("/{bot}/{method}", post(telegram))
            .route("/chat.postMessage", post(slack_post))
            .route("/response", post(response_url))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeChat {
            addr,
            inner,
            _task: task,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.inner.received.lock().unwrap().clone()
    }

    /// The accepted requests of one method.
    pub fn accepted(&self, method: &str) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.accepted && r.method == method)
            .collect()
    }

    /// The next `n` sends fail with HTTP 500.
    pub fn fail_next(&self, n: u64) {
        self.inner.fail_next.store(n, Ordering::SeqCst);
    }

    /// Waits until `n` requests of `method` were accepted.
    pub async fn wait_for(&self, method: &str, n: usize) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let got = self.accepted(method);
            if got.len() >= n {
                return got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{method} was accepted {} times, not {n}: {:?}",
                got.len(),
                self.received()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

impl Inner {
    fn record(&self, method: &str, token: Option<String>, body: Value, accepted: bool) {
        self.received.lock().unwrap().push(Received {
            method: method.to_owned(),
            token,
            body,
            accepted,
        });
    }

    fn should_fail(&self) -> bool {
        self.fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

fn json_of(body: &Bytes) -> Option<Value> {
    serde_json::from_slice(body).ok()
}

async fn telegram(
    State(inner): State<Arc<Inner>>,
    Path((bot, method)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Json<Value>) {
    let token = bot.strip_prefix("bot").map(str::to_owned);
    let body = json_of(&body);
    let json_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let Some(body) = body.filter(|_| json_type) else {
        inner.record(&method, token, Value::Null, false);
        return telegram_error(400, "Bad Request: a JSON body is required");
    };
    if token.as_deref() != Some(inner.token.as_str()) {
        inner.record(&method, token, body, false);
        return telegram_error(401, "Unauthorized");
    }
    if inner.should_fail() {
        inner.record(&method, token, body, false);
        return telegram_error(500, "Internal Server Error");
    }
    let missing = match method.as_str() {
        "sendMessage" => ["chat_id", "text"]
            .into_iter()
            .find(|k| body.get(*k).is_none_or(Value::is_null)),
        "answerCallbackQuery" => ["callback_query_id"]
            .into_iter()
            .find(|k| body.get(*k).is_none_or(Value::is_null)),
        "editMessageText" | "editMessageReplyMarkup" => None,
        _ => {
            inner.record(&method, token, body, false);
            return telegram_error(404, "Not Found: method not found");
        }
    };
    if let Some(field) = missing {
        inner.record(&method, token, body, false);
        return telegram_error(400, &format!("Bad Request: {field} is empty"));
    }
    inner.record(&method, token, body.clone(), true);
    let id = inner.next_id.fetch_add(1, Ordering::SeqCst);
    let result = match method.as_str() {
        "sendMessage" => json!({
            "message_id": id,
            "date": 1_700_000_000,
            "chat": {"id": body["chat_id"]},
            "text": body["text"],
        }),
        _ => Value::Bool(true),
    };
    (StatusCode::OK, Json(json!({"ok": true, "result": result})))
}

fn telegram_error(code: u16, description: &str) -> (StatusCode, Json<Value>) {
    (
        StatusCode::from_u16(code).unwrap(),
        Json(json!({"ok": false, "error_code": code, "description": description})),
    )
}

async fn slack_post(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Json<Value>) {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let method = "chat.postMessage";
    let Some(body) = json_of(&body) else {
        inner.record(method, token, Value::Null, false);
        return (
            StatusCode::OK,
            Json(json!({"ok": false, "error": "invalid_json"})),
        );
    };
    if token.as_deref() != Some(inner.token.as_str()) {
        inner.record(method, token, body, false);
        return (
            StatusCode::OK,
            Json(json!({"ok": false, "error": "not_authed"})),
        );
    }
    if inner.should_fail() {
        inner.record(method, token, body, false);
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"ok": false, "error": "internal_error"})),
        );
    }
    if body.get("channel").is_none_or(Value::is_null) {
        inner.record(method, token, body, false);
        return (
            StatusCode::OK,
            Json(json!({"ok": false, "error": "channel_not_found"})),
        );
    }
    inner.record(method, token, body.clone(), true);
    let id = inner.next_id.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::OK,
        Json(json!({"ok": true, "channel": body["channel"], "ts": format!("1700000000.{id:06}")})),
    )
}

async fn response_url(State(inner): State<Arc<Inner>>, body: Bytes) -> StatusCode {
    inner.record(
        "response",
        None,
        json_of(&body).unwrap_or(Value::Null),
        true,
    );
    StatusCode::OK
}
