//! The single writer: one thread owns the write connection and applies
//! queued requests in one transaction per batch (group commit). On a
//! current-thread runtime a request that is alone is written on the
//! runtime's thread instead (`Writer::submit`).
//!
//! SQLite admits one writer at a time anyway; funnelling writes through one
//! thread avoids lock contention and `SQLITE_BUSY`, and batching amortizes the
//! cost of a commit over every request that arrived while the last one ran.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::{mpsc, oneshot};

use keel_protocol::{ApprovalRecord, ApprovalStatus, Commit, Event, NewRun, RunRecord, StoreError};

use super::checkpoint::{self, Nudge};
use super::writes;

/// At most this many requests share one transaction, which bounds how long
/// the first of them waits for its reply.
const MAX_BATCH: usize = 256;

/// Requests waiting for the writer; senders wait when it is this far behind.
const QUEUE_DEPTH: usize = 4096;

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

pub(super) enum WriteOp {
    CreateRun {
        run: NewRun,
        reply: Reply<(RunRecord, bool)>,
    },
    Commit {
        run_id: String,
        commit: Commit,
        reply: Reply<Vec<Event>>,
    },
    Decide {
        tenant: String,
        id: String,
        decision: ApprovalStatus,
        by: String,
        reason: String,
        reply: Reply<ApprovalRecord>,
    },
    /// Any other write, as a closure over the connection.
    Exec {
        run: ExecFn,
        reply: Reply<serde_json::Value>,
    },
}

pub(super) type ExecFn =
    Box<dyn FnOnce(&Connection) -> Result<serde_json::Value, StoreError> + Send>;

/// A request that has been applied (or refused) inside the open transaction;
/// its result is only sent once that transaction has committed.
enum Applied {
    // Boxed: a run record is large and batches hold many of these.
    CreateRun(
        Reply<(RunRecord, bool)>,
        Box<Result<(RunRecord, bool), StoreError>>,
    ),
    Commit(Reply<Vec<Event>>, Result<Vec<Event>, StoreError>),
    Decide(
        Reply<ApprovalRecord>,
        Box<Result<ApprovalRecord, StoreError>>,
    ),
    Exec(
        Reply<serde_json::Value>,
        Result<serde_json::Value, StoreError>,
    ),
}

impl Applied {
    fn succeeded(&self) -> bool {
        match self {
            Self::CreateRun(_, r) => r.is_ok(),
            Self::Commit(_, r) => r.is_ok(),
            Self::Decide(_, r) => r.is_ok(),
            Self::Exec(_, r) => r.is_ok(),
        }
    }

    fn deliver(self) {
        // A caller that stopped waiting has nothing left to tell.
        match self {
            Self::CreateRun(reply, result) => drop(reply.send(*result)),
            Self::Commit(reply, result) => drop(reply.send(result)),
            Self::Decide(reply, result) => drop(reply.send(*result)),
            Self::Exec(reply, result) => drop(reply.send(result)),
        }
    }

    /// Replaces the result: the transaction carrying it did not commit.
    fn fail(self, message: &str) {
        match self {
            Self::CreateRun(reply, _) => drop(reply.send(backend(message))),
            Self::Commit(reply, _) => drop(reply.send(backend(message))),
            Self::Decide(reply, _) => drop(reply.send(backend(message))),
            Self::Exec(reply, _) => drop(reply.send(backend(message))),
        }
    }
}

impl WriteOp {
    fn reject(self, message: &str) {
        match self {
            Self::CreateRun { reply, .. } => drop(reply.send(backend(message))),
            Self::Commit { reply, .. } => drop(reply.send(backend(message))),
            Self::Decide { reply, .. } => drop(reply.send(backend(message))),
            Self::Exec { reply, .. } => drop(reply.send(backend(message))),
        }
    }
}

/// The writing side of the store; dropping it returns once the requests
/// already submitted are written and the file is released.
pub(super) struct Writer {
    queue: Option<mpsc::Sender<WriteOp>>,
    thread: Option<JoinHandle<()>>,
    checkpointer: Option<JoinHandle<()>>,
    conn: Arc<Mutex<Connection>>,
    nudge: Option<Nudge>,
    /// On a current-thread runtime: how many requests are deciding whether
    /// to be written where they are (see [`Writer::submit`]).
    deciding: Option<AtomicUsize>,
    busy: Duration,
}

impl Writer {
    /// Starts the writer on `conn` (whose automatic checkpoints must be
    /// off) and the checkpoint thread on a connection of its own to `path`.
    pub(super) fn spawn(
        conn: Connection,
        path: PathBuf,
        busy: Duration,
    ) -> Result<Self, StoreError> {
        let (nudge, checkpointer) = checkpoint::spawn(path, busy)?;
        let conn = Arc::new(Mutex::new(conn));
        let (queue, rx) = mpsc::channel(QUEUE_DEPTH);
        // Should this fail, dropping `nudge` stops the checkpoint thread.
        let thread = std::thread::Builder::new()
            .name("keel-store-writer".into())
            .spawn({
                let conn = Arc::clone(&conn);
                let nudge = nudge.clone();
                move || run(&conn, rx, &nudge)
            })
            .map_err(|e| StoreError::Backend(format!("starting store writer thread: {e}")))?;
        // Opened from a current-thread runtime (or its blocking pool).
        let one_thread = Handle::try_current()
            .is_ok_and(|runtime| runtime.runtime_flavor() == RuntimeFlavor::CurrentThread);
        Ok(Self {
            queue: Some(queue),
            thread: Some(thread),
            checkpointer: Some(checkpointer),
            conn,
            nudge: Some(nudge),
            deciding: one_thread.then(AtomicUsize::default),
            busy,
        })
    }

    /// Queues a request and waits until the transaction holding it commits.
    ///
    /// On a current-thread runtime a request that finds itself alone is
    /// written on the runtime's thread instead. There the writer thread
    /// shares the one CPU, so a lone commit cost two thread switches and
    /// their wake-ups for nothing: the runtime's thread had nothing else to
    /// run meanwhile. The request first yields, so that every other task
    /// ready to run can submit too; when others did, the writer thread takes
    /// them all in one batch, as before, and the runtime's thread goes on
    /// with other runs while it writes. A request also goes to the thread
    /// when the thread is writing, or another connection holds the write
    /// lock: the runtime's thread never waits for it.
    pub(super) async fn submit<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> WriteOp,
    ) -> Result<T, StoreError> {
        let queue = self.queue.as_ref().ok_or_else(stopped)?;
        let (reply, result) = oneshot::channel();
        let mut op = make(reply);
        if let Some(deciding) = &self.deciding {
            let alone = {
                let _deciding = Deciding::enter(deciding);
                tokio::task::yield_now().await;
                deciding.load(Ordering::Relaxed) == 1
            };
            if alone && queue.capacity() == queue.max_capacity() {
                match self.write_here(op) {
                    Some(left) => op = left,
                    None => return received(result).await,
                }
            }
        }
        queue.send(op).await.map_err(|_| stopped())?;
        received(result).await
    }

    /// Writes `op` in a transaction of its own on the calling thread, unless
    /// the writer thread or another connection is writing: then hands it back.
    fn write_here(&self, op: WriteOp) -> Option<WriteOp> {
        let Ok(conn) = self.conn.try_lock() else {
            return Some(op);
        };
        match begin_now(&conn, self.busy) {
            Begin::Open => {
                apply_begun(&conn, std::iter::once(op));
                if let Some(nudge) = &self.nudge {
                    nudge.send();
                }
                None
            }
            Begin::Busy => Some(op),
            Begin::Failed(message) => {
                op.reject(&message);
                None
            }
        }
    }

    pub(super) fn is_running(&self) -> bool {
        self.queue.as_ref().is_some_and(|q| !q.is_closed())
    }
}

async fn received<T>(result: oneshot::Receiver<Result<T, StoreError>>) -> Result<T, StoreError> {
    result
        .await
        .map_err(|_| StoreError::Backend("store writer dropped the request".into()))?
}

/// Counts a request among those deciding; uncounts it however its task ends.
struct Deciding<'a>(&'a AtomicUsize);

impl<'a> Deciding<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Deciding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Writer {
    /// Waits for queued writes so that a store reopened right after this one
    /// sees them and finds the file released.
    fn drop(&mut self) {
        drop(self.queue.take());
        drop(self.nudge.take());
        // The writer thread holds the checkpointer's other nudge: once it
        // has stopped, so does the checkpointer.
        for thread in [self.thread.take(), self.checkpointer.take()]
            .into_iter()
            .flatten()
        {
            if thread.join().is_err() {
                tracing::error!("store background thread panicked");
            }
        }
    }
}

fn backend<T>(message: &str) -> Result<T, StoreError> {
    Err(StoreError::Backend(message.to_owned()))
}

fn stopped() -> StoreError {
    StoreError::Backend("store writer has stopped".into())
}

fn run(conn: &Mutex<Connection>, mut rx: mpsc::Receiver<WriteOp>, nudge: &Nudge) {
    // Woken by the first commit queued, it lets the runtime queue the rest.
    crate::yield_when_woken();
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.blocking_recv_many(&mut batch, MAX_BATCH) > 0 {
        apply_batch(&lock(conn), batch.drain(..));
        nudge.send();
    }
    tracing::debug!("store writer stopped");
}

/// Applies `ops` in one transaction and hands each its result once it has
/// committed (or its error, if it did not).
fn apply_batch(conn: &Connection, ops: impl ExactSizeIterator<Item = WriteOp>) {
    match begin(conn) {
        Ok(()) => apply_begun(conn, ops),
        Err(message) => ops.for_each(|op| op.reject(&message)),
    }
}

/// [`apply_batch`] once its transaction is open: ends it.
fn apply_begun(conn: &Connection, mut ops: impl ExactSizeIterator<Item = WriteOp>) {
    let size = ops.len();
    if size == 1
        && let Some(op) = ops.next()
    {
        apply_single(conn, op);
        return;
    }
    let mut applied = Vec::with_capacity(size);
    let mut broken: Option<String> = None;
    for op in ops {
        if let Some(message) = &broken {
            op.reject(message);
            continue;
        }
        // A savepoint that cannot be opened leaves the transaction
        // untrusted: the whole batch rolls back.
        if let Err(e) = exec_cached(conn, "SAVEPOINT keel_request") {
            let message = format!("opening savepoint: {e}");
            op.reject(&message);
            broken = Some(message);
            continue;
        }
        let (done, failure) = apply_one(conn, op);
        applied.push(done);
        broken = failure;
    }
    let outcome = match broken {
        Some(message) => {
            roll_back(conn);
            Err(message)
        }
        None => end(conn, true),
    };
    match outcome {
        Ok(()) => {
            tracing::trace!(size, "store batch committed");
            applied.into_iter().for_each(Applied::deliver);
        }
        Err(message) => {
            tracing::error!(error = %message, size, "store batch rolled back");
            applied.into_iter().for_each(|a| a.fail(&message));
        }
    }
}

/// A batch of one (the common case when runs are few) needs no savepoint:
/// its transaction is the unit that commits or rolls back. The transaction
/// statements are cached, so nothing is parsed again per commit.
fn apply_single(conn: &Connection, op: WriteOp) {
    let applied = match op {
        WriteOp::CreateRun { run, reply } => {
            Applied::CreateRun(reply, Box::new(writes::create_run(conn, run)))
        }
        WriteOp::Commit {
            run_id,
            commit,
            reply,
        } => Applied::Commit(reply, writes::commit(conn, &run_id, commit)),
        WriteOp::Decide {
            tenant,
            id,
            decision,
            by,
            reason,
            reply,
        } => Applied::Decide(
            reply,
            Box::new(super::approvals::decide(
                conn, &tenant, &id, decision, &by, &reason,
            )),
        ),
        WriteOp::Exec { run, reply } => Applied::Exec(reply, run(conn)),
    };
    match end(conn, applied.succeeded()) {
        Ok(()) => applied.deliver(),
        Err(message) => {
            tracing::error!(error = %message, "store write rolled back");
            applied.fail(&message);
        }
    }
}

/// Opens the write transaction of a batch. Its statements, like every
/// other the writer runs, are cached: rusqlite's `Transaction` would have
/// SQLite parse them anew for every batch.
fn begin(conn: &Connection) -> Result<(), String> {
    exec_cached(conn, "BEGIN IMMEDIATE").map_err(|e| {
        tracing::error!(error = %e, "store writer could not start a transaction");
        format!("starting write transaction: {e}")
    })
}

/// The outcome of trying to open a write transaction without waiting.
enum Begin {
    Open,
    /// Another connection holds the write lock (a checkpoint, another process).
    Busy,
    Failed(String),
}

/// [`begin`] without waiting for the write lock, on a connection that
/// otherwise waits up to `busy` for it: says so when another connection
/// holds it.
fn begin_now(conn: &Connection, busy: Duration) -> Begin {
    if let Err(e) = conn.busy_timeout(Duration::ZERO) {
        return Begin::Failed(format!("setting busy timeout: {e}"));
    }
    let begun = match exec_cached(conn, "BEGIN IMMEDIATE") {
        Ok(()) => Begin::Open,
        Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {
            roll_back(conn);
            Begin::Busy
        }
        Err(e) => {
            tracing::error!(error = %e, "store writer could not start a transaction");
            Begin::Failed(format!("starting write transaction: {e}"))
        }
    };
    match conn.busy_timeout(busy) {
        Ok(()) => begun,
        Err(e) => {
            roll_back(conn);
            Begin::Failed(format!("setting busy timeout: {e}"))
        }
    }
}

/// The connection, also after a panic while it was held: whatever that
/// left open is rolled back.
fn lock(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    conn.lock().unwrap_or_else(|poisoned| {
        let conn = poisoned.into_inner();
        roll_back(&conn);
        conn
    })
}

/// Commits the open transaction, or rolls it back when `commit` is false.
/// A COMMIT that fails leaves the transaction open, so it is rolled back.
fn end(conn: &Connection, commit: bool) -> Result<(), String> {
    let sql = if commit { "COMMIT" } else { "ROLLBACK" };
    exec_cached(conn, sql).map_err(|e| {
        roll_back(conn);
        format!("ending write transaction: {e}")
    })
}

/// Rolls back whatever transaction is still open; one that cannot be
/// rolled back is left to report.
fn roll_back(conn: &Connection) {
    if !conn.is_autocommit()
        && let Err(e) = exec_cached(conn, "ROLLBACK")
    {
        tracing::error!(error = %e, "store writer could not roll back");
    }
}

fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Applies one request inside the savepoint just opened for it, so that a
/// refused request leaves no trace while the others of the batch still
/// commit. The second value is set when releasing or rolling back to the
/// savepoint failed: the transaction can no longer be trusted and the whole
/// batch must roll back.
///
/// The savepoint statements are cached: rusqlite's `Savepoint` names each
/// one anew and has SQLite parse it every time, a cost paid per request in
/// every batch.
fn apply_one(conn: &Connection, op: WriteOp) -> (Applied, Option<String>) {
    match op {
        WriteOp::CreateRun { run, reply } => {
            let (result, failure) = settle(conn, writes::create_run(conn, run));
            (Applied::CreateRun(reply, Box::new(result)), failure)
        }
        WriteOp::Commit {
            run_id,
            commit,
            reply,
        } => {
            let (result, failure) = settle(conn, writes::commit(conn, &run_id, commit));
            (Applied::Commit(reply, result), failure)
        }
        WriteOp::Decide {
            tenant,
            id,
            decision,
            by,
            reason,
            reply,
        } => {
            let result = super::approvals::decide(conn, &tenant, &id, decision, &by, &reason);
            let (result, failure) = settle(conn, result);
            (Applied::Decide(reply, Box::new(result)), failure)
        }
        WriteOp::Exec { run, reply } => {
            let (result, failure) = settle(conn, run(conn));
            (Applied::Exec(reply, result), failure)
        }
    }
}

/// Releases the savepoint of a request that succeeded; rolls back to it,
/// then releases it, for one that failed.
fn settle<T>(
    conn: &Connection,
    result: Result<T, StoreError>,
) -> (Result<T, StoreError>, Option<String>) {
    match result {
        Ok(value) => match exec_cached(conn, "RELEASE keel_request") {
            Ok(()) => (Ok(value), None),
            Err(e) => {
                let message = format!("releasing savepoint: {e}");
                (Err(StoreError::Backend(message.clone())), Some(message))
            }
        },
        Err(err) => match exec_cached(conn, "ROLLBACK TO keel_request")
            .and_then(|()| exec_cached(conn, "RELEASE keel_request"))
        {
            Ok(()) => (Err(err), None),
            Err(e) => (Err(err), Some(format!("rolling back savepoint: {e}"))),
        },
    }
}
