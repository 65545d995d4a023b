//! HTTP plumbing every provider shares: bounded body reads and transport
//! error mapping, so each wire format only has to say what its bytes mean.

use std::time::Duration;

use futures::StreamExt;
use keel_protocol::ModelError;

/// Largest reply body keel reads; past it the provider is misbehaving and the
/// reply is refused rather than allowed to exhaust memory.
pub(crate) const MAX_REPLY_BYTES: usize = 64 * 1024 * 1024;

/// Largest error body kept for the error message.
pub(crate) const MAX_ERROR_BODY: usize = 64 * 1024;

/// Reads a whole body, failing on an idle gap longer than `idle` or past `limit` bytes.
pub(crate) async fn read_body(
    response: reqwest::Response,
    idle: Duration,
    limit: usize,
) -> Result<Vec<u8>, ModelError> {
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    loop {
        let next = tokio::time::timeout(idle, chunks.next())
            .await
            .map_err(|_| ModelError::Timeout)?;
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(|e| transport_error(&e))?;
        if body.len() + chunk.len() > limit {
            return Err(ModelError::Protocol(format!(
                "reply body exceeds {limit} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Maps a transport failure, keeping the cause chain (reqwest's own message
/// alone is just "error sending request").
pub(crate) fn transport_error(error: &reqwest::Error) -> ModelError {
    if error.is_timeout() {
        return ModelError::Timeout;
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    ModelError::Connect(text)
}

/// Shortens provider text quoted in errors so one bad reply cannot flood logs.
pub(crate) fn excerpt(text: &str) -> String {
    const LIMIT: usize = 500;
    if text.len() <= LIMIT {
        return text.to_string();
    }
    let mut end = LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}
