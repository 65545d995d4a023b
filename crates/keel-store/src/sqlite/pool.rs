//! A small pool of read-only connections used from blocking tasks.
//!
//! In WAL mode readers never wait for the writer, so reads run in parallel
//! with it; the pool bounds how many blocking threads they occupy.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::Semaphore;

use keel_protocol::StoreError;

use super::codec::db;

pub(super) struct ReadPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
}

impl ReadPool {
    pub(super) fn open(path: PathBuf, size: usize) -> Result<Arc<Self>, StoreError> {
        let idle = (0..size)
            .map(|_| open_reader(&path))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(Self {
            path,
            idle: Mutex::new(idle),
            permits: Arc::new(Semaphore::new(size)),
        }))
    }

    /// Runs `f` on a pooled connection in a blocking task.
    pub(super) async fn run<T, F>(self: &Arc<Self>, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Backend("store read pool is closed".into()))?;
        let pool = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let conn = pool.take()?;
            let result = f(&conn);
            pool.put(conn);
            drop(permit);
            result
        })
        .await
        .map_err(|e| StoreError::Backend(format!("store read task failed: {e}")))?
    }

    /// An idle connection; a new one if a failed task lost the one it held.
    fn take(&self) -> Result<Connection, StoreError> {
        let conn = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match conn {
            Some(conn) => Ok(conn),
            None => open_reader(&self.path),
        }
    }

    fn put(&self, conn: Connection) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(conn);
    }
}

fn open_reader(path: &PathBuf) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(db("opening read connection"))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(db("setting busy timeout"))?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}
