//! Reading keel's SSE event streams in tests, frame by frame.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

/// One SSE frame: `id`, `event` and the parsed `data`.
#[derive(Debug, Clone)]
pub struct Frame {
    pub id: u64,
    pub event: String,
    pub data: Value,
}

/// Reads frames from a streaming response until the server closes it, or
/// until `until` returns true for a frame (inclusive), or `limit` elapses.
pub async fn read_frames(
    resp: reqwest::Response,
    limit: Duration,
    until: impl Fn(&Frame) -> bool,
) -> Vec<Frame> {
    assert!(
        resp.status().is_success(),
        "stream request failed: {}",
        resp.status()
    );
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    assert!(ct.starts_with("text/event-stream"), "content-type {ct}");
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    let mut frames = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let chunk = match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => panic!(
                "event stream did not finish within {limit:?}; got {} frames: {:?}",
                frames.len(),
                frames
                    .iter()
                    .map(|f: &Frame| f.event.clone())
                    .collect::<Vec<_>>()
            ),
            Ok(None) => return frames,
            Ok(Some(c)) => c.unwrap(),
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(pos) = buf.find("\n\n") {
            let block: String = buf.drain(..pos + 2).collect();
            if let Some(f) = parse_block(&block) {
                let stop = until(&f);
                frames.push(f);
                if stop {
                    return frames;
                }
            }
        }
    }
}

fn parse_block(block: &str) -> Option<Frame> {
    let mut id = None;
    let mut event = None;
    let mut data = String::new();
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = Some(v.trim().parse().unwrap());
        } else if let Some(v) = line.strip_prefix("event:") {
            event = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    Some(Frame {
        id: id?,
        event: event?,
        data: serde_json::from_str(&data).unwrap(),
    })
}

/// Event types in order.
pub fn types(frames: &[Frame]) -> Vec<String> {
    frames.iter().map(|f| f.event.clone()).collect()
}

/// Whether `wanted` occurs in `types` in order (other events may sit between).
pub fn is_subsequence(types: &[String], wanted: &[&str]) -> bool {
    let mut it = types.iter();
    wanted.iter().all(|w| it.any(|t| t == w))
}
