#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A scripted Anthropic Messages API server on 127.0.0.1.
//!
//! It speaks the honest wire format (whole `message` objects or the SSE event
//! sequence, as the request's `stream` flag asks) and rejects, like the real
//! API, requests that break its rules (alternating roles, every `tool_use`
//! answered by one `tool_result` in the next message, `max_tokens` present,
//! no `system` role in `messages`), recording each such violation.

mod invariants;
mod render;
mod reply;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use futures::StreamExt;
use serde_json::Value;

pub use reply::Reply;
use reply::{ReplyKind, error_body, error_status};

type HandlerFn = dyn Fn(&Value) -> Reply + Send + Sync + 'static;

/// How the fake chooses its answer to each (valid) request.
pub struct Script {
    source: Source,
}

enum Source {
    Queue(Mutex<VecDeque<Reply>>),
    Handler(Box<HandlerFn>),
}

impl Script {
    /// Answers with `replies` in order; once they run out, with the text "done".
    pub fn queue(replies: Vec<Reply>) -> Self {
        Self {
            source: Source::Queue(Mutex::new(replies.into())),
        }
    }

    /// Answers each request with `handler(request_body)`, for tests whose
    /// requests arrive concurrently and must be routed on their content.
    pub fn handler(handler: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> Self {
        Self {
            source: Source::Handler(Box::new(handler)),
        }
    }

    fn next(&self, request: &Value) -> Reply {
        match &self.source {
            Source::Queue(queue) => queue
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or_else(|| Reply::text("done")),
            Source::Handler(handler) => handler(request),
        }
    }
}

impl From<Vec<Reply>> for Script {
    fn from(replies: Vec<Reply>) -> Self {
        Self::queue(replies)
    }
}

/// The headers of one request that matter to the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeaders {
    pub api_key: Option<String>,
    pub version: Option<String>,
    pub authorization: Option<String>,
}

struct Shared {
    script: Script,
    requests: Mutex<Vec<Value>>,
    headers: Mutex<Vec<RequestHeaders>>,
    violations: Mutex<Vec<String>>,
    next_tool_use: AtomicU64,
    next_message: AtomicU64,
}

/// A running fake server; it stops when dropped.
pub struct FakeAnthropic {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeAnthropic {
    /// Binds 127.0.0.1:0 and serves `POST /v1/messages` until dropped.
    pub async fn start(script: impl Into<Script>) -> FakeAnthropic {
        let shared = Arc::new(Shared {
            script: script.into(),
            requests: Mutex::new(Vec::new()),
            headers: Mutex::new(Vec::new()),
            violations: Mutex::new(Vec::new()),
            next_tool_use: AtomicU64::new(1),
            next_message: AtomicU64::new(1),
        });
        let app = Router::new()
            .route("/v1/messages", post(messages))
            .layer(DefaultBodyLimit::disable())
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake Anthropic server");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("fake Anthropic server");
        });
        FakeAnthropic { addr, shared, task }
    }

    /// `http://127.0.0.1:PORT`, to use as the provider's base URL (the client
    /// appends `/v1/messages`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request body received, in arrival order (invalid ones included).
    pub fn requests(&self) -> Vec<Value> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// The most recent request body, if any.
    pub fn last_request(&self) -> Option<Value> {
        self.shared.requests.lock().unwrap().last().cloned()
    }

    /// The `x-api-key`, `anthropic-version` and `Authorization` headers of
    /// each request, in arrival order.
    pub fn headers(&self) -> Vec<RequestHeaders> {
        self.shared.headers.lock().unwrap().clone()
    }

    /// Every broken API rule seen so far; each was answered with HTTP 400.
    pub fn violations(&self) -> Vec<String> {
        self.shared.violations.lock().unwrap().clone()
    }

    pub fn request_count(&self) -> usize {
        self.shared.requests.lock().unwrap().len()
    }
}

impl Drop for FakeAnthropic {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

async fn messages(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let seen = RequestHeaders {
        api_key: header_text(&headers, "x-api-key"),
        version: header_text(&headers, "anthropic-version"),
        authorization: header_text(&headers, "authorization"),
    };
    shared.headers.lock().unwrap().push(seen.clone());
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            shared.requests.lock().unwrap().push(Value::Null);
            let problem = format!("request body is not valid JSON: {e}");
            shared.violations.lock().unwrap().push(problem.clone());
            return json_response(400, &error_body("invalid_request_error", &problem));
        }
    };
    shared.requests.lock().unwrap().push(request.clone());
    let mut problems = Vec::new();
    if seen.version.is_none() {
        problems.push("anthropic-version: header is required".to_string());
    }
    problems.extend(invariants::check(&request));
    if !problems.is_empty() {
        shared
            .violations
            .lock()
            .unwrap()
            .extend(problems.iter().cloned());
        return json_response(
            400,
            &error_body("invalid_request_error", &problems.join("; ")),
        );
    }
    let reply = shared.script.next(&request);
    answer(&shared, &request, reply).await
}

async fn answer(shared: &Shared, request: &Value, reply: Reply) -> Response {
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let streaming = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut response = match &reply.kind {
        ReplyKind::Hang => std::future::pending::<Response>().await,
        ReplyKind::Status { code, body } => {
            let content_type = if serde_json::from_str::<Value>(body).is_ok() {
                "application/json"
            } else {
                "text/plain; charset=utf-8"
            };
            let mut r = Response::new(Body::from(body.clone()));
            *r.status_mut() = StatusCode::from_u16(*code).expect("valid status code");
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            r
        }
        ReplyKind::RawJson(body) => json_response(200, body),
        ReplyKind::RawSse(events) => sse_response(events.clone(), reply.chunk_gap, Ending::Clean),
        ReplyKind::Message { text, tool_uses } => {
            let message = build(shared, request, &reply, text, tool_uses);
            if streaming {
                sse_response(
                    render::stream_events(&message),
                    reply.chunk_gap,
                    Ending::Clean,
                )
            } else {
                json_response(200, &render::message_object(&message))
            }
        }
        ReplyKind::BrokenStream { text } | ReplyKind::StalledStream { text } => {
            let ending = if matches!(reply.kind, ReplyKind::BrokenStream { .. }) {
                Ending::Cut
            } else {
                Ending::Stall
            };
            if streaming {
                let message = build(shared, request, &reply, text, &[]);
                sse_response(partial_events(&message), reply.chunk_gap, ending)
            } else {
                // A whole-body reply can only fail before its first byte.
                sse_response(Vec::new(), Duration::ZERO, ending)
            }
        }
        ReplyKind::ErrorEvent {
            text,
            error_type,
            message: error_message,
        } => {
            if streaming {
                let message = build(shared, request, &reply, text, &[]);
                let mut events = partial_events(&message);
                events.push(render::error_event(error_type, error_message));
                sse_response(events, reply.chunk_gap, Ending::Clean)
            } else {
                json_response(
                    error_status(error_type),
                    &error_body(error_type, error_message),
                )
            }
        }
    };
    for (name, value) in &reply.headers {
        response.headers_mut().insert(
            HeaderName::try_from(name.as_str()).expect("valid header name"),
            HeaderValue::try_from(value.as_str()).expect("valid header value"),
        );
    }
    response
}

/// `message_start` and the blocks, without the closing events.
fn partial_events(message: &render::Message<'_>) -> Vec<(String, String)> {
    let mut events = vec![render::start_event(message)];
    for (index, block) in message.blocks.iter().enumerate() {
        events.extend(render::block_events(index, block));
    }
    events
}

fn build<'a>(
    shared: &Shared,
    request: &'a Value,
    reply: &'a Reply,
    text: &'a str,
    tool_uses: &'a [(String, Value)],
) -> render::Message<'a> {
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("fake");
    let mut blocks = Vec::new();
    if let Some(thinking) = &reply.thinking {
        blocks.push(render::Block::Thinking(thinking));
    }
    if reply.redacted_thinking {
        blocks.push(render::Block::RedactedThinking);
    }
    if !text.is_empty() {
        blocks.push(render::Block::Text(text));
    }
    for (name, input) in tool_uses {
        let n = shared.next_tool_use.fetch_add(1, Ordering::SeqCst);
        blocks.push(render::Block::ToolUse {
            id: format!("toolu_fake{n:04}"),
            name,
            input,
        });
    }
    let stop_reason = reply.stop_reason.clone().unwrap_or_else(|| {
        if tool_uses.is_empty() {
            "end_turn"
        } else {
            "tool_use"
        }
        .to_string()
    });
    let usage = reply.usage.unwrap_or_else(|| {
        let prompt_chars = request
            .get("messages")
            .map(|m| m.to_string().len())
            .unwrap_or(0)
            + request
                .get("system")
                .map(|s| s.to_string().len())
                .unwrap_or(0);
        let out_chars = text.len()
            + tool_uses
                .iter()
                .map(|(n, i)| n.len() + i.to_string().len())
                .sum::<usize>();
        (estimate_tokens(prompt_chars), estimate_tokens(out_chars))
    });
    render::Message {
        id: format!(
            "msg_fake{:04}",
            shared.next_message.fetch_add(1, Ordering::SeqCst)
        ),
        model,
        blocks,
        stop_reason,
        usage,
    }
}

/// How an SSE body ends after its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Clean,
    /// The connection drops mid-body.
    Cut,
    /// The connection stays open and silent.
    Stall,
}

fn estimate_tokens(chars: usize) -> u64 {
    (chars as u64 / 4).max(1)
}

fn json_response(status: u16, body: &Value) -> Response {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = StatusCode::from_u16(status).expect("valid status code");
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// An SSE body of `event:`/`data:` pairs, optionally paced, then ended as `ending` says.
fn sse_response(events: Vec<(String, String)>, gap: Duration, ending: Ending) -> Response {
    let frames = futures::stream::iter(events).then(move |(event, data)| async move {
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        Ok::<_, std::io::Error>(Bytes::from(format!("event: {event}\ndata: {data}\n\n")))
    });
    let tail = match ending {
        Ending::Clean => futures::stream::empty().boxed(),
        // The pause lets the events reach the client before the cut, as on a
        // real connection that breaks mid-reply.
        Ending::Cut => futures::stream::once(async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err(std::io::Error::other("fake server cut the connection"))
        })
        .boxed(),
        Ending::Stall => futures::stream::pending().boxed(),
    };
    let mut r = Response::new(Body::from_stream(frames.chain(tail)));
    let headers = r.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
