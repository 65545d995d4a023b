//! A run's event stream as SSE frames (`id: seq`, `event: type`, `data: json`).
//!
//! The frames are written here rather than by axum's `Sse`: each of a run's
//! events becomes one buffer sized for it at once, where axum's `Event`
//! grows its buffer field by field, and the heartbeat is one interval for
//! the stream instead of a timer reset at every event.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use keel_core::Runtime;
use keel_protocol::Event;
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};

/// SPEC §3 asks for a heartbeat at least every 15 s while a run waits.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// A comment line: clients ignore it, proxies see the connection is alive.
const HEARTBEAT_FRAME: &[u8] = b":\n\n";

pub fn stream(runtime: Runtime, run_id: String, after: u64) -> Response {
    frames(keel_core::follow::follow(runtime, run_id, after))
}

/// The stream of a run's events already followed
/// (`Runtime::start_run_followed`).
pub fn frames(events: mpsc::Receiver<Arc<Event>>) -> Response {
    let mut heartbeat = tokio::time::interval_at(Instant::now() + HEARTBEAT, HEARTBEAT);
    heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let frames = futures::stream::unfold((events, heartbeat), next_frame);
    sse_response(Body::from_stream(frames))
}

/// The stream of a run that has ended, read after its last event: no frame.
pub fn ended() -> Response {
    sse_response(Body::empty())
}

fn sse_response(body: Body) -> Response {
    (
        [
            (CONTENT_TYPE, "text/event-stream"),
            (CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

type State = (mpsc::Receiver<Arc<Event>>, Interval);

/// The next event's frame, or a heartbeat when the run has been quiet for
/// a while; the stream ends when the run's events do.
async fn next_frame(
    (mut events, mut heartbeat): State,
) -> Option<(Result<Bytes, Infallible>, State)> {
    let frame = tokio::select! {
        biased;
        event = events.recv() => frame(event?.as_ref()),
        _ = heartbeat.tick() => Bytes::from_static(HEARTBEAT_FRAME),
    };
    Some((Ok(frame), (events, heartbeat)))
}

/// `id: seq`, `event: type` and the event's JSON as `data`, one line per
/// line of text (compact JSON has none, but a line break must never end
/// the frame early).
fn frame(event: &Event) -> Bytes {
    // The text the store wrote, when the event came from this node's commit.
    let data = event.json().unwrap_or("{}");
    let kind = event.type_name();
    let seq = event.seq.to_string();
    let mut out = Vec::with_capacity(data.len() + seq.len() + kind.len() + 32);
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(seq.as_bytes());
    out.extend_from_slice(b"\nevent: ");
    out.extend_from_slice(kind.as_bytes());
    out.push(b'\n');
    for line in data.split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.trim_end_matches('\r').as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use keel_protocol::EventKind;

    #[test]
    fn a_frame_is_id_event_and_data_lines() {
        let event = Event::new(
            "run-1",
            7,
            keel_protocol::now(),
            EventKind::MessageDelta {
                text: "two\nlines".into(),
            },
        );
        let text = String::from_utf8(frame(&event).to_vec()).unwrap();
        let json = event.json().unwrap();
        assert!(!json.contains('\n'), "{json}");
        assert_eq!(
            text,
            format!("id: 7\nevent: message_delta\ndata: {json}\n\n")
        );
    }
}
