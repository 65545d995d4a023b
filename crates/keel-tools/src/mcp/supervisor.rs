//! Keeps a server running: notices when the process dies, marks it as
//! restarting (so calls fail fast) and starts it again with backoff, so a
//! server that crashes on start does not spin.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::connection::{Connection, Launch, Running};
use super::{Shared, State};

const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A server up this long is considered healthy again: the next crash
/// restarts it after the initial delay, not the accumulated one.
const STABLE_AFTER: Duration = Duration::from_secs(30);
/// How long a shutdown waits for the process to close gracefully.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Publishes `running` as the live connection and watches it from then on.
pub(crate) fn spawn(shared: Arc<Shared>, launch: Launch, running: Running) -> JoinHandle<()> {
    let gone = publish(&shared, &running);
    tokio::spawn(supervise(shared, launch, running, gone))
}

fn publish(shared: &Shared, running: &Running) -> CancellationToken {
    let gone = CancellationToken::new();
    shared.set(State::Up(Connection {
        peer: running.peer().clone(),
        gone: gone.clone(),
    }));
    gone
}

async fn supervise(
    shared: Arc<Shared>,
    launch: Launch,
    mut running: Running,
    mut gone: CancellationToken,
) {
    let mut delay = INITIAL_BACKOFF;
    loop {
        let up_since = Instant::now();
        let stop = running.cancellation_token();
        let waiting = running.waiting();
        tokio::pin!(waiting);
        tokio::select! {
            reason = &mut waiting => {
                tracing::debug!(server = %launch.server, ?reason, "mcp session ended");
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
        tracing::warn!(server = %launch.server, retry_in = ?delay, "mcp server exited; restarting");

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
                r = launch.connect() => r,
                () = shared.shutdown.cancelled() => {
                    shared.set(State::Stopped);
                    return;
                }
            };
            match attempt {
                Ok(running) => {
                    tracing::info!(server = %launch.server, "mcp server restarted");
                    gone = publish(&shared, &running);
                    break running;
                }
                Err(e) => tracing::warn!(
                    server = %launch.server,
                    error = %e,
                    retry_in = ?delay,
                    "mcp server restart failed"
                ),
            }
        };
    }
}
