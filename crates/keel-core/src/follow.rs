//! Following a run: its stored backlog first, then live events, with no gap
//! and no duplicate. A lagging subscriber catches up from the store instead
//! of losing events. Used by the SSE endpoint and the CLI timeline.

use std::sync::Arc;

use keel_protocol::{Event, StoreError};
use tokio::sync::{broadcast, mpsc};

use crate::Runtime;

const PAGE: u32 = 500;

/// Events of `run_id` after `after`, in order; the channel closes after the
/// terminal event, or when the receiver is dropped.
pub fn follow(runtime: Runtime, run_id: String, after: u64) -> mpsc::Receiver<Arc<Event>> {
    let live = runtime.subscribe(&run_id);
    spawn_pump(runtime, run_id, after, live, Backlog::Read)
}

/// Every event of a run from its first, given `live`, the run's events
/// subscribed to before its actor was spawned: no event can be stored that
/// the subscription missed, so the stream begins with the live events and
/// reads the store only for a gap, saving a read per run. Without such a
/// subscription (a run an idempotency key found, or one another node
/// runs), the store is read first, as [`follow`] does.
pub(crate) fn follow_started(
    runtime: Runtime,
    run_id: String,
    live: Option<broadcast::Receiver<Arc<Event>>>,
) -> mpsc::Receiver<Arc<Event>> {
    match live {
        Some(live) => spawn_pump(runtime, run_id, 0, live, Backlog::None),
        None => follow(runtime, run_id, 0),
    }
}

/// Whether stored events may precede the subscription.
#[derive(Clone, Copy)]
enum Backlog {
    Read,
    None,
}

fn spawn_pump(
    runtime: Runtime,
    run_id: String,
    after: u64,
    mut live: broadcast::Receiver<Arc<Event>>,
    backlog: Backlog,
) -> mpsc::Receiver<Arc<Event>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        if let Err(e) = pump(&runtime, &run_id, after, &mut live, backlog, &tx).await {
            tracing::debug!(run = %run_id, reason = %e, "event follower stopped");
        }
        drop(live);
        runtime.release(&run_id);
    });
    rx
}

#[derive(Debug, thiserror::Error)]
enum Stop {
    #[error("receiver went away")]
    Gone,
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

async fn pump(
    runtime: &Runtime,
    run_id: &str,
    mut last: u64,
    live: &mut broadcast::Receiver<Arc<Event>>,
    backlog: Backlog,
    tx: &mpsc::Sender<Arc<Event>>,
) -> Result<(), Stop> {
    if matches!(backlog, Backlog::Read) && catch_up(runtime, run_id, &mut last, tx).await? {
        return Ok(());
    }
    loop {
        match live.recv().await {
            Ok(e) if e.seq <= last => {}
            Ok(e) if e.seq == last + 1 => {
                last = e.seq;
                let terminal = e.is_terminal();
                tx.send(e).await.map_err(|_| Stop::Gone)?;
                if terminal {
                    return Ok(());
                }
            }
            // A gap (published before we subscribed, or lag): read it from the store.
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                if catch_up(runtime, run_id, &mut last, tx).await? {
                    return Ok(());
                }
            }
            Err(broadcast::error::RecvError::Closed) => {
                // The run ended or its channel was dropped: the rest is stored.
                if !catch_up(runtime, run_id, &mut last, tx).await? {
                    // Not ended (channel dropped while a run waits): listen again.
                    *live = runtime.subscribe(run_id);
                    if catch_up(runtime, run_id, &mut last, tx).await? {
                        return Ok(());
                    }
                    continue;
                }
                return Ok(());
            }
        }
    }
}

/// Sends stored events after `last`. Returns true when a terminal event was sent.
async fn catch_up(
    runtime: &Runtime,
    run_id: &str,
    last: &mut u64,
    tx: &mpsc::Sender<Arc<Event>>,
) -> Result<bool, Stop> {
    loop {
        let batch = runtime.store().events_after(run_id, *last, PAGE).await?;
        let n = batch.len();
        for e in batch {
            *last = e.seq;
            let terminal = e.is_terminal();
            tx.send(Arc::new(e)).await.map_err(|_| Stop::Gone)?;
            if terminal {
                return Ok(true);
            }
        }
        if n < PAGE as usize {
            return Ok(false);
        }
    }
}
