#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A scripted OpenAI-compatible Chat Completions server on 127.0.0.1.
//!
//! It speaks the honest wire format (whole objects or SSE chunks, as the
//! request asks) and rejects, like the real API, conversations whose tool
//! calls and tool results do not pair up, recording each such violation.

mod invariants;
mod render;
mod reply;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use futures::StreamExt;
use serde_json::Value;

pub use reply::Reply;
use reply::ReplyKind;

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

struct Shared {
    script: Script,
    requests: Mutex<Vec<Value>>,
    authorizations: Mutex<Vec<Option<String>>>,
    violations: Mutex<Vec<String>>,
    next_call: AtomicU64,
    next_completion: AtomicU64,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
}

/// Counts a request as in flight while its reply is being made.
struct Answering<'a>(&'a Shared);

impl<'a> Answering<'a> {
    fn start(shared: &'a Shared) -> Self {
        let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.most_in_flight.fetch_max(now, Ordering::SeqCst);
        Self(shared)
    }
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running fake server; it stops when dropped.
pub struct FakeOpenAi {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeOpenAi {
    /// Binds 127.0.0.1:0 and serves `POST /v1/chat/completions` (and
    /// `/chat/completions`) until dropped.
    pub async fn start(script: impl Into<Script>) -> FakeOpenAi {
        let shared = Arc::new(Shared {
            script: script.into(),
            requests: Mutex::new(Vec::new()),
            authorizations: Mutex::new(Vec::new()),
            violations: Mutex::new(Vec::new()),
            next_call: AtomicU64::new(1),
            next_completion: AtomicU64::new(1),
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/chat/completions", post(chat))
            .layer(DefaultBodyLimit::disable())
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake OpenAI server");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("fake OpenAI server");
        });
        FakeOpenAi { addr, shared, task }
    }

    /// `http://127.0.0.1:PORT/v1`, to use as a provider's base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request body received, in arrival order (invalid ones included).
    pub fn requests(&self) -> Vec<Value> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// The most recent request body, if any.
    pub fn last_request(&self) -> Option<Value> {
        self.shared.requests.lock().unwrap().last().cloned()
    }

    /// The `Authorization` header of each request, in arrival order.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.shared.authorizations.lock().unwrap().clone()
    }

    /// Every broken API rule seen so far; each was answered with HTTP 400.
    pub fn violations(&self) -> Vec<String> {
        self.shared.violations.lock().unwrap().clone()
    }

    pub fn request_count(&self) -> usize {
        self.shared.requests.lock().unwrap().len()
    }

    /// The most requests this server was answering at once: each counts
    /// from its arrival until its reply (after the reply's delay) is made.
    pub fn most_in_flight(&self) -> usize {
        self.shared.most_in_flight.load(Ordering::SeqCst)
    }
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn chat(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let _answering = Answering::start(&shared);
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    shared.authorizations.lock().unwrap().push(auth);
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            shared.requests.lock().unwrap().push(Value::Null);
            let problem = format!("request body is not valid JSON: {e}");
            shared.violations.lock().unwrap().push(problem.clone());
            return json_response(
                400,
                &render::error_body(&problem, "invalid_request_error", None),
            );
        }
    };
    shared.requests.lock().unwrap().push(request.clone());
    let problems = invariants::check(&request);
    if !problems.is_empty() {
        shared
            .violations
            .lock()
            .unwrap()
            .extend(problems.iter().cloned());
        return json_response(
            400,
            &render::error_body(
                &problems.join("; "),
                "invalid_request_error",
                Some("messages"),
            ),
        );
    }
    let reply = shared.script.next(&request);
    answer(&shared, &request, reply).await
}

async fn answer(shared: &Shared, request: &Value, reply: Reply) -> Response {
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
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
        ReplyKind::RawSse(payloads) => {
            sse_response(payloads.clone(), reply.chunk_gap, Ending::Clean)
        }
        ReplyKind::Completion { text, calls } => {
            completion_response(shared, request, &reply, text, calls, Ending::Clean)
        }
        ReplyKind::BrokenStream { text } => {
            completion_response(shared, request, &reply, text, &[], Ending::Cut)
        }
        ReplyKind::StalledStream { text } => {
            completion_response(shared, request, &reply, text, &[], Ending::Stall)
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

fn completion_response(
    shared: &Shared,
    request: &Value,
    reply: &Reply,
    text: &str,
    calls: &[(String, String)],
    ending: Ending,
) -> Response {
    let complete = ending == Ending::Clean;
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("fake");
    let calls: Vec<(String, &str, &str)> = calls
        .iter()
        .map(|(name, args)| {
            let n = shared.next_call.fetch_add(1, Ordering::SeqCst);
            (format!("call_{n}"), name.as_str(), args.as_str())
        })
        .collect();
    let finish_reason = reply.finish_reason.clone().unwrap_or_else(|| {
        if calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        }
        .to_string()
    });
    let usage = reply.usage.unwrap_or_else(|| {
        let prompt_chars = request
            .get("messages")
            .map(|m| m.to_string().len())
            .unwrap_or(0);
        let out_chars = text.len() + calls.iter().map(|c| c.1.len() + c.2.len()).sum::<usize>();
        (estimate_tokens(prompt_chars), estimate_tokens(out_chars))
    });
    let completion = render::Completion {
        id: format!(
            "chatcmpl-fake{}",
            shared.next_completion.fetch_add(1, Ordering::SeqCst)
        ),
        model,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        text,
        calls,
        reasoning: reply.reasoning.as_deref(),
        finish_reason,
        usage,
    };
    let streaming = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if !streaming {
        if !complete {
            // A whole-body reply can only fail before its first byte.
            return sse_response(Vec::new(), Duration::ZERO, ending);
        }
        return json_response(200, &render::completion_object(&completion));
    }
    let include_usage = request
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut payloads = render::chunk_payloads(&completion, include_usage, complete);
    if complete {
        payloads.push("[DONE]".to_string());
    }
    sse_response(payloads, reply.chunk_gap, ending)
}

/// How an SSE body ends after its frames.
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

/// An SSE body of `data:` frames, optionally paced, then ended as `ending` says.
fn sse_response(payloads: Vec<String>, gap: Duration, ending: Ending) -> Response {
    let frames = futures::stream::iter(payloads).then(move |payload| async move {
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        Ok::<_, std::io::Error>(Bytes::from(format!("data: {payload}\n\n")))
    });
    let tail = match ending {
        Ending::Clean => futures::stream::empty().boxed(),
        // The pause lets the frames reach the client before the cut, as on a
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
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
