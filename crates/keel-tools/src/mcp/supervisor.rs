//! Keeps a server usable: notices when the session ends, marks it as
//! restarting (so calls fail fast) and reconnects with backoff, so a server
//! that crashes on start does not spin. It also re-lists the tools when the
//! server says they changed and after every reconnect, since a restarted
//! server may offer a different set.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::connection::{Connection, Generation, Launch, Running, listen_for_changes};
use super::{Shared, State};

const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A server up this long is considered healthy again: the next crash
/// restarts it after the initial delay, not the accumulated one.
const STABLE_AFTER: Duration = Duration::from_secs(30);
/// How long a shutdown waits for the session to close gracefully.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Publishes `running` (whose session `gone` stands for) as the live
/// connection and watches it from then on.
pub(crate) fn spawn(
    shared: Arc<Shared>,
    launch: Launch,
    running: Running,
    gone: CancellationToken,
    generation: Generation,
) -> JoinHandle<()> {
    shared.set(State::Up(Connection {
        peer: running.peer().clone(),
        gone: gone.clone(),
    }));
    tokio::spawn(supervise(shared, launch, running, gone, generation))
}

async fn supervise(
    shared: Arc<Shared>,
    launch: Launch,
    mut running: Running,
    mut gone: CancellationToken,
    generation: Generation,
) {
    let mut delay = INITIAL_BACKOFF;
    loop {
        let up_since = Instant::now();
        let peer = running.peer().clone();
        let stop = running.cancellation_token();
        let waiting = running.waiting();
        tokio::pin!(waiting);
        loop {
            tokio::select! {
                reason = &mut waiting => {
                    tracing::debug!(server = %launch.server, ?reason, "mcp session ended");
                    break;
                }
                () = shared.shutdown.cancelled() => {
                    stop.cancel();
                    if tokio::time::timeout(SHUTDOWN_GRACE, waiting).await.is_err() {
                        tracing::warn!(server = %launch.server, "mcp server did not close in time");
                    }
                    gone.cancel();
                    shared.set(State::Stopped);
                    return;
                }
                () = launch.list_changed.notified() => {
                    tracing::info!(server = %launch.server, "mcp tools changed; listing again");
                    if let Err(e) = shared.relist(&peer).await {
                        tracing::warn!(server = %launch.server, error = %e, "mcp tools/list after a change failed");
                    }
                }
            }
        }
        gone.cancel();
        if shared.shutdown.is_cancelled() {
            shared.set(State::Stopped);
            return;
        }
        shared.set(State::Restarting);
        if up_since.elapsed() >= STABLE_AFTER {
            delay = INITIAL_BACKOFF;
        }
        tracing::warn!(server = %launch.server, retry_in = ?delay, "mcp session ended; reconnecting");

        running = loop {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = shared.shutdown.cancelled() => {
                    shared.set(State::Stopped);
                    return;
                }
            }
            delay = (delay * 2).min(MAX_BACKOFF);
            let attempt = tokio::select! {
                r = launch.connect(Some(generation)) => r,
                () = shared.shutdown.cancelled() => {
                    shared.set(State::Stopped);
                    return;
                }
            };
            match attempt {
                Ok((running, _)) => {
                    tracing::info!(server = %launch.server, "mcp server reconnected");
                    gone = CancellationToken::new();
                    listen_for_changes(
                        &running,
                        Arc::clone(&launch.list_changed),
                        gone.clone(),
                        launch.startup_timeout,
                    )
                    .await;
                    // Before publishing, so no call sees the new session
                    // with the old session's tool list.
                    if let Err(e) = shared.relist(running.peer()).await {
                        tracing::warn!(server = %launch.server, error = %e,
                            "mcp tools/list after reconnect failed; keeping the previous list");
                    }
                    shared.set(State::Up(Connection {
                        peer: running.peer().clone(),
                        gone: gone.clone(),
                    }));
                    break running;
                }
                Err(e) => tracing::warn!(
                    server = %launch.server,
                    error = %e,
                    retry_in = ?delay,
                    "mcp server reconnect failed"
                ),
            }
        };
    }
}
