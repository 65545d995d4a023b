//! Entry points for the fuzz targets under `fuzz/`: the readers of model
//! replies, reached exactly as a live reply reaches them, with no network.
//! Not part of the supported API.

use std::time::{Duration, SystemTime};

use futures::StreamExt;
use keel_protocol::{ModelError, ModelResponse, TokenUsage};

/// What a streamed reply came to, and the text forwarded while it streamed.
#[derive(Debug)]
pub struct Streamed {
    pub result: Result<ModelResponse, ModelError>,
    pub forwarded: String,
}

/// A whole (non-streamed) Chat Completions reply body.
pub fn openai_completion(body: &[u8]) -> Result<ModelResponse, ModelError> {
    crate::openai::wire::parse_completion(body)
}

/// The message keel makes of a Chat Completions error body.
pub fn openai_error_message(body: &str) -> String {
    crate::openai::wire::error_message(body)
}

/// A whole (non-streamed) Messages API reply body.
pub fn anthropic_message(body: &[u8]) -> Result<ModelResponse, ModelError> {
    crate::anthropic::wire::parse_message(body)
}

/// The message keel makes of a Messages API error body.
pub fn anthropic_error_message(body: &str) -> String {
    crate::anthropic::wire::error_message(body)
}

/// A `Retry-After` header value.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    crate::retry::parse_retry_after(value, now)
}

/// A JSON tool-mode reply text, read as the adapter reads it.
pub fn json_mode_reply(text: &str) -> Result<ModelResponse, String> {
    crate::json_mode::read_action(text, TokenUsage::default(), None, None)
        .map(|(response, _)| response)
}

/// A Chat Completions SSE body arriving in `chunks`, read by the same code
/// as a live stream (SSE decoding included).
pub async fn openai_stream(chunks: Vec<Vec<u8>>) -> Streamed {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let mut forwarded = false;
    let result = crate::openai::stream::read_stream(
        response(chunks),
        Duration::from_secs(60),
        Some(&tx),
        &mut forwarded,
    )
    .await;
    drop(tx);
    Streamed {
        result,
        forwarded: rx.collect::<Vec<String>>().await.concat(),
    }
}

/// A Messages API SSE body arriving in `chunks`, read by the same code as a
/// live stream (SSE decoding included).
pub async fn anthropic_stream(chunks: Vec<Vec<u8>>) -> Streamed {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let mut forwarded = false;
    let result = crate::anthropic::stream::read_stream(
        response(chunks),
        Duration::from_secs(60),
        Some(&tx),
        &mut forwarded,
    )
    .await;
    drop(tx);
    Streamed {
        result,
        forwarded: rx.collect::<Vec<String>>().await.concat(),
    }
}

/// An HTTP response whose body is `chunks`, one read each.
fn response(chunks: Vec<Vec<u8>>) -> reqwest::Response {
    let body = futures::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
    reqwest::Response::from(::http::Response::new(reqwest::Body::wrap_stream(body)))
}
