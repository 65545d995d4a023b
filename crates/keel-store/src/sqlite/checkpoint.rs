//! WAL checkpoints, moved off the writer thread.
//!
//! A checkpoint copies the WAL back into the database file and syncs both;
//! SQLite's automatic checkpoint runs it inside whichever commit crosses the
//! threshold, which makes that commit wait for two `fsync`s. Here the writer
//! disables it and nudges this thread instead, which runs a PASSIVE
//! checkpoint (it never blocks the writer or readers) on its own connection.
//!
//! A PASSIVE checkpoint alone never lets the WAL start over under a steady
//! stream of commits: SQLite rewinds the WAL only when a write begins after
//! a checkpoint has copied every frame, and the writer keeps appending while
//! the checkpoint runs. The WAL then grew by every commit's pages for as
//! long as the load lasted (900 MB in six seconds of the benchmark), and each
//! commit paid the file system for new blocks and zeroed pages. Past
//! [`RESTART_FRAMES`] this thread runs a RESTART checkpoint instead: it holds
//! writers off while it copies the few frames the PASSIVE ones left, so the
//! next commit writes from the start of the WAL again, over blocks the file
//! already has.

use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use keel_protocol::StoreError;

use super::codec::db;

/// Least time between two checkpoints: bounds their cost under a steady
/// stream of commits while keeping the WAL short.
const MIN_INTERVAL: Duration = Duration::from_millis(50);

/// A checkpoint also runs this long after the last one when nothing nudges,
/// so that a write burst is folded back into the database soon after.
const IDLE_INTERVAL: Duration = Duration::from_secs(1);

/// WAL frames (a page and a small header each) past which a checkpoint
/// makes the WAL start over: about 8 MiB with keel's 2 KiB pages (16 MiB in
/// a file made with SQLite's default 4 KiB), the WAL file's size under load.
pub(super) const RESTART_FRAMES: i64 = 4096;

/// How long a RESTART checkpoint waits for the writer's transaction and
/// then for readers to finish. It holds new commits off while it waits for
/// readers, so it gives up soon and tries again at the next checkpoint.
const RESTART_WAIT: Duration = Duration::from_millis(100);

/// Lets the writer ask for a checkpoint; the thread stops once every copy
/// of this is dropped.
#[derive(Clone)]
pub(super) struct Nudge(SyncSender<()>);

impl Nudge {
    /// Asks for a checkpoint without ever waiting: one already requested suffices.
    pub(super) fn send(&self) {
        match self.0.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }
}

pub(super) fn spawn(path: PathBuf, busy: Duration) -> Result<(Nudge, JoinHandle<()>), StoreError> {
    let conn = Connection::open(&path).map_err(db("opening checkpoint connection"))?;
    conn.busy_timeout(busy.min(RESTART_WAIT))
        .map_err(db("setting busy timeout"))?;
    let (nudge, requests) = mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name("keel-store-checkpoint".into())
        .spawn(move || run(&conn, &requests))
        .map_err(|e| StoreError::Backend(format!("starting checkpoint thread: {e}")))?;
    Ok((Nudge(nudge), thread))
}

fn run(conn: &Connection, requests: &mpsc::Receiver<()>) {
    crate::yield_when_woken();
    let mut due = false;
    loop {
        if !due {
            match requests.recv_timeout(IDLE_INTERVAL) {
                Ok(()) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        checkpoint(conn);
        // Rest before the next one; a nudge meanwhile makes it due at once.
        let rested = Instant::now() + MIN_INTERVAL;
        due = match requests.recv_timeout(MIN_INTERVAL) {
            Ok(()) => {
                std::thread::sleep(rested.saturating_duration_since(Instant::now()));
                true
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => break,
        };
    }
}

fn checkpoint(conn: &Connection) {
    let Some(frames) = run_checkpoint(conn, "PASSIVE") else {
        return;
    };
    if frames >= RESTART_FRAMES {
        run_checkpoint(conn, "RESTART");
    }
}

/// Runs one checkpoint; the WAL's size in frames when it ran.
fn run_checkpoint(conn: &Connection, mode: &str) -> Option<i64> {
    let result = conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    });
    match result {
        Ok((busy, wal_pages, copied)) => {
            tracing::trace!(mode, busy, wal_pages, copied, "wal checkpoint");
            Some(wal_pages)
        }
        Err(e) => {
            tracing::warn!(mode, error = %e, "wal checkpoint failed");
            None
        }
    }
}
