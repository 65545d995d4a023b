//! A run's event stream as SSE frames (`id: seq`, `event: type`, `data: json`).

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use keel_core::Runtime;
use tokio_stream::wrappers::ReceiverStream;

/// SPEC §3 asks for a heartbeat at least every 15 s while a run waits.
const HEARTBEAT: Duration = Duration::from_secs(10);

pub fn stream(
    runtime: Runtime,
    run_id: String,
    after: u64,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let events = keel_core::follow::follow(runtime, run_id, after);
    let frames = ReceiverStream::new(events).map(|e| {
        let frame = SseEvent::default()
            .id(e.seq.to_string())
            .event(e.type_name());
        // The text the store wrote, when the event came from this node's commit.
        Ok(match e.json() {
            Ok(data) => frame.data(data),
            Err(_) => frame.data("{}"),
        })
    });
    Sse::new(frames).keep_alive(KeepAlive::new().interval(HEARTBEAT))
}

/// The stream of a run that has ended, read after its last event: no frame.
pub fn ended() -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    Sse::new(futures::stream::empty())
}
