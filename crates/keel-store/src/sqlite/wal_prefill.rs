//! The WAL file written ahead as zeros when the store opens.
//!
//! Each commit appends its frames (a 24-byte header and a page each) to the
//! WAL, and the checkpoint thread makes it start over from the beginning
//! once it is long (see `checkpoint`). Until the WAL first reaches that
//! length, every commit extends the file: the file system allocates new
//! blocks for it and the kernel zeroes each new page-cache page around the
//! frame, since a frame (2,072 bytes with 2 KiB pages) never covers a page
//! whole: 7% of keel's CPU in the benchmark's sequential runs, which each
//! start a new store (bench/README.md). Written ahead as zeros, the
//! WAL's first pass writes over blocks and cached pages the file already
//! has, as every later pass does. PostgreSQL zero-fills its WAL segments
//! ahead for the same reason.
//!
//! SQLite takes a WAL whose header is not valid (all zeros here) as one
//! holding no frames, and writes its header at the start with the first
//! commit, so the zeros are never read as frames.

use std::fs::OpenOptions;
use std::io::Read;
use std::path::Path;

use rusqlite::Connection;

use super::checkpoint::RESTART_FRAMES;

/// A WAL frame's header, before its page.
const FRAME_HEADER: u64 = 24;

/// The WAL file's own header.
const WAL_HEADER: u64 = 32;

/// Writes the WAL of the database `conn` has open ahead as zeros, to the
/// length at which the checkpoint makes it start over. Only an empty WAL is
/// written: the checkpoint first folds in whatever an earlier process left,
/// and the write lock is held throughout, so no other connection can be
/// writing frames meanwhile. A failure is logged and leaves the store as it
/// was: commits then extend the WAL themselves.
pub(super) fn prefill(conn: &Connection, db_path: &Path) {
    if let Err(e) = try_prefill(conn, db_path) {
        tracing::debug!(path = %db_path.display(), error = %e, "WAL not written ahead");
    }
}

fn try_prefill(conn: &Connection, db_path: &Path) -> Result<(), String> {
    let page_size: u64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .map_err(|e| format!("reading the page size: {e}"))?;
    let want = WAL_HEADER + RESTART_FRAMES.unsigned_abs() * (FRAME_HEADER + page_size);
    // Copies every frame into the database and truncates the WAL to zero
    // bytes; `busy` is set when another connection's reader kept it from
    // finishing, and then the WAL is left alone.
    let busy: i64 = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
        .map_err(|e| format!("checkpointing: {e}"))?;
    if busy != 0 {
        return Err("another connection is reading the WAL".into());
    }
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| format!("taking the write lock: {e}"))?;
    let written = write_zeros(db_path, want);
    conn.execute_batch("ROLLBACK")
        .map_err(|e| format!("releasing the write lock: {e}"))?;
    written
}

fn write_zeros(db_path: &Path, want: u64) -> Result<(), String> {
    let mut wal_path = db_path.as_os_str().to_owned();
    wal_path.push("-wal");
    // Never created here: a WAL that is not there is SQLite's to make.
    let mut file = OpenOptions::new()
        .write(true)
        .open(&wal_path)
        .map_err(|e| format!("opening the WAL: {e}"))?;
    let len = file
        .metadata()
        .map_err(|e| format!("reading the WAL's size: {e}"))?
        .len();
    if len != 0 {
        return Err(format!("the WAL holds {len} bytes after a full checkpoint"));
    }
    // Written, not sized with `set_len`: a hole would leave the blocks
    // unallocated, which is what this is here to avoid.
    std::io::copy(&mut std::io::repeat(0).take(want), &mut file)
        .map_err(|e| format!("writing the WAL: {e}"))?;
    Ok(())
}
