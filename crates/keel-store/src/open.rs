//! Picks the store backend from a database URL, as `server.database_url`
//! gives it (SPEC §9).

use std::path::PathBuf;
use std::sync::Arc;

use keel_protocol::{Store, StoreError};

use crate::{PostgresStore, SqliteStore};

/// Opens the store at `url`: `sqlite://PATH` (the file is created if
/// missing) or `postgres://…` / `postgresql://…`. Either way the schema is
/// brought up to date before this returns.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err(StoreError::Backend("sqlite:// URL has no file path".into()));
        }
        let path = PathBuf::from(path);
        // Opening creates directories, migrates and starts a thread: blocking work.
        let store = tokio::task::spawn_blocking(move || SqliteStore::open(&path))
            .await
            .map_err(|e| StoreError::Backend(format!("opening the SQLite store: {e}")))??;
        return Ok(Arc::new(store));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Arc::new(PostgresStore::connect(url).await?));
    }
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    Err(StoreError::Backend(format!(
        "unsupported database URL scheme {scheme:?}: use sqlite://PATH or postgres://…"
    )))
}
