//! The SQLite index: its own file (`<data_dir>/memory.db`), FTS5 for BM25,
//! vectors as BLOBs beside the chunks. One write connection behind a lock
//! (memory writes are rare and small) and a few read connections; WAL lets
//! reads run while a write is in progress.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::MemoryError;
use crate::error::backend;
use crate::index::{DocRow, FoundChunk, Index, NewChunk, StoredChunk, Written};
use crate::index::{decode_vector, encode_vector};
use crate::vectors::VectorSet;

/// Migration `i` brings `user_version` from `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/sqlite/0001_init.sql"),
    include_str!("../migrations/sqlite/0002_document_meta_index.sql"),
];

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How much of memory.db read connections map into memory (address space,
/// not RAM: the pages are the OS file cache's); beyond it, reads use pread.
const MMAP_BYTES: i64 = 1 << 30;

pub(crate) struct SqliteIndex {
    path: PathBuf,
    writer: Arc<Mutex<Connection>>,
    readers: Arc<Mutex<Vec<Connection>>>,
}

impl SqliteIndex {
    /// Opens (creating it and its directory if needed) and migrates the
    /// memory database at `path`. Blocking.
    pub(crate) fn open(path: &Path) -> Result<Self, MemoryError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| MemoryError::Backend(format!("creating {}: {e}", dir.display())))?;
        }
        let mut conn = Connection::open(path)
            .map_err(|e| MemoryError::Backend(format!("opening {}: {e}", path.display())))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(backend("enabling WAL"))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(backend("setting synchronous"))?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(backend("enabling foreign keys"))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(backend("setting busy timeout"))?;
        migrate(&mut conn)?;
        Ok(Self {
            path: path.to_path_buf(),
            writer: Arc::new(Mutex::new(conn)),
            readers: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// Runs `f` on a read connection in a blocking task.
    async fn read<T, F>(&self, f: F) -> Result<T, MemoryError>
    where
        F: FnOnce(&Connection) -> Result<T, MemoryError> + Send + 'static,
        T: Send + 'static,
    {
        let (path, readers) = (self.path.clone(), Arc::clone(&self.readers));
        tokio::task::spawn_blocking(move || {
            let idle = readers.lock().unwrap_or_else(PoisonError::into_inner).pop();
            let conn = match idle {
                Some(conn) => conn,
                None => open_reader(&path)?,
            };
            let result = f(&conn);
            readers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(conn);
            result
        })
        .await
        .map_err(|e| MemoryError::Backend(format!("memory read task failed: {e}")))?
    }

    /// Runs `f` on the write connection in a blocking task.
    async fn write<T, F>(&self, f: F) -> Result<T, MemoryError>
    where
        F: FnOnce(&mut Connection) -> Result<T, MemoryError> + Send + 'static,
        T: Send + 'static,
    {
        let writer = Arc::clone(&self.writer);
        tokio::task::spawn_blocking(move || {
            let mut conn = writer.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut conn)
        })
        .await
        .map_err(|e| MemoryError::Backend(format!("memory write task failed: {e}")))?
    }
}

fn open_reader(path: &Path) -> Result<Connection, MemoryError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(backend("opening memory read connection"))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(backend("setting busy timeout"))?;
    // Searches read pages all over the file (FTS5 doclists and docsizes,
    // chunk rows): mapped, a page costs a memory access instead of a
    // pread() and a copy into SQLite's cache (measured: the text search
    // and the vector fetch take about a third less time at 100k chunks).
    conn.pragma_update(None, "mmap_size", MMAP_BYTES)
        .map_err(backend("setting mmap_size"))?;
    Ok(conn)
}

fn migrate(conn: &mut Connection) -> Result<(), MemoryError> {
    let tx = conn.transaction().map_err(backend("starting migration"))?;
    let current: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(backend("reading schema version"))?;
    let latest = MIGRATIONS.len() as i64;
    if current > latest {
        return Err(MemoryError::Backend(format!(
            "memory.db schema version {current} is newer than this build supports ({latest})"
        )));
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        tx.execute_batch(sql).map_err(|e| {
            MemoryError::Backend(format!("applying memory migration {}: {e}", index + 1))
        })?;
        tx.pragma_update(None, "user_version", index as i64 + 1)
            .map_err(backend("recording schema version"))?;
    }
    tx.commit().map_err(backend("committing migrations"))
}

fn timestamp(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn parse_time(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).map_or_else(|_| Utc::now(), |t| t.with_timezone(&Utc))
}

/// An FTS5 query matching any of `terms`, each quoted as a string.
fn fts_query(terms: &[String]) -> String {
    terms
        .iter()
        .map(|t| format!("\"{}\"", t.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(" OR ")
}

fn to_usize(v: i64) -> usize {
    usize::try_from(v).unwrap_or(0)
}

fn put(conn: &mut Connection, doc: DocRow, chunks: Vec<NewChunk>) -> Result<Written, MemoryError> {
    let tx = conn
        .transaction()
        .map_err(backend("starting memory write"))?;
    let existing: Option<String> = tx
        .query_row(
            "SELECT id FROM memory_documents WHERE tenant = ?1 AND agent = ?2 AND source = ?3",
            params![doc.tenant, doc.agent, doc.source],
            |r| r.get(0),
        )
        .optional()
        .map_err(backend("looking up the document"))?;
    let now = timestamp(&Utc::now());
    let mut removed = Vec::new();
    let id = match existing {
        Some(id) => {
            tx.execute(
                "UPDATE memory_documents SET title = ?2, text = ?3, created_at = ?4, updated_at = ?5 \
                 WHERE id = ?1",
                params![id, doc.title, doc.text, timestamp(&doc.created_at), now],
            )
            .map_err(backend("updating the document"))?;
            removed = tx
                .prepare("SELECT id FROM memory_chunks WHERE doc_id = ?1")
                .and_then(|mut s| {
                    s.query_map(params![id], |r| r.get::<_, i64>(0))?
                        .collect::<Result<Vec<_>, _>>()
                })
                .map_err(backend("listing old chunks"))?;
            tx.execute(
                "DELETE FROM memory_fts WHERE rowid IN (SELECT id FROM memory_chunks WHERE doc_id = ?1)",
                params![id],
            )
            .map_err(backend("removing old text index entries"))?;
            tx.execute("DELETE FROM memory_chunks WHERE doc_id = ?1", params![id])
                .map_err(backend("removing old chunks"))?;
            id
        }
        None => {
            tx.execute(
                "INSERT INTO memory_documents (id, tenant, agent, source, title, text, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    doc.id,
                    doc.tenant,
                    doc.agent,
                    doc.source,
                    doc.title,
                    doc.text,
                    timestamp(&doc.created_at),
                    now
                ],
            )
            .map_err(backend("inserting the document"))?;
            doc.id.clone()
        }
    };
    let mut added = Vec::with_capacity(chunks.len());
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO memory_chunks \
                 (doc_id, tenant, agent, ordinal, start_line, end_line, text, hash, model, embedding) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )
            .map_err(backend("preparing chunk insert"))?;
        let mut fts = tx
            .prepare("INSERT INTO memory_fts (rowid, text) VALUES (?1, ?2)")
            .map_err(backend("preparing text index insert"))?;
        for c in &chunks {
            insert
                .execute(params![
                    id,
                    doc.tenant,
                    doc.agent,
                    c.chunk.ordinal as i64,
                    c.chunk.start_line as i64,
                    c.chunk.end_line as i64,
                    c.chunk.text,
                    c.chunk.hash,
                    c.model,
                    c.embedding.as_deref().map(encode_vector),
                ])
                .map_err(backend("inserting a chunk"))?;
            let rowid = tx.last_insert_rowid();
            fts.execute(params![rowid, c.chunk.text])
                .map_err(backend("indexing a chunk's text"))?;
            added.push(rowid);
        }
    }
    let version: i64 = tx
        .query_row(
            "INSERT INTO memory_scopes (tenant, agent, version, chunks) \
             VALUES (?1, ?2, 1, (SELECT count(*) FROM memory_chunks WHERE tenant = ?1 AND agent = ?2)) \
             ON CONFLICT (tenant, agent) DO UPDATE SET version = version + 1, chunks = excluded.chunks \
             RETURNING version",
            params![doc.tenant, doc.agent],
            |r| r.get(0),
        )
        .map_err(backend("bumping the scope version"))?;
    tx.commit().map_err(backend("committing the document"))?;
    Ok(Written {
        id,
        version,
        removed,
        added,
    })
}

#[async_trait]
impl Index for SqliteIndex {
    async fn existing(
        &self,
        tenant: &str,
        agent: &str,
        source: &str,
    ) -> Result<Vec<StoredChunk>, MemoryError> {
        let (tenant, agent, source) = (tenant.to_owned(), agent.to_owned(), source.to_owned());
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT c.hash, c.model, c.embedding FROM memory_chunks c \
                     JOIN memory_documents d ON d.id = c.doc_id \
                     WHERE d.tenant = ?1 AND d.agent = ?2 AND d.source = ?3 \
                       AND c.tenant = ?1 AND c.agent = ?2 \
                     ORDER BY c.ordinal",
                )
                .map_err(backend("preparing chunk lookup"))?;
            let rows = stmt
                .query_map(params![tenant, agent, source], |r| {
                    Ok(StoredChunk {
                        hash: r.get(0)?,
                        model: r.get(1)?,
                        embedding: r.get::<_, Option<Vec<u8>>>(2)?.map(|b| decode_vector(&b)),
                    })
                })
                .map_err(backend("reading chunks"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(backend("reading chunks"))
        })
        .await
    }

    async fn put(&self, doc: DocRow, chunks: Vec<NewChunk>) -> Result<Written, MemoryError> {
        self.write(move |conn| put(conn, doc, chunks)).await
    }

    async fn text_search(
        &self,
        tenant: &str,
        agent: &str,
        terms: &[String],
        limit: usize,
    ) -> Result<Vec<(i64, f32)>, MemoryError> {
        if terms.is_empty() {
            return Ok(Vec::new());
        }
        let (tenant, agent, query) = (tenant.to_owned(), agent.to_owned(), fts_query(terms));
        self.read(move |conn| {
            // Every match is scored (bm25 needs all of them), but only
            // until `limit` matches of the scope are found is each one
            // checked against its chunk's tenant and agent: the scored
            // matches come out of a co-routine best first (`LIMIT -1` keeps
            // SQLite from flattening it into a join that checks them all).
            // At 100k chunks that check was a sixth of the text search.
            let mut stmt = conn
                .prepare_cached(
                    "SELECT c.id, f.score FROM \
                       (SELECT rowid, bm25(memory_fts) AS score FROM memory_fts \
                        WHERE memory_fts MATCH ?1 ORDER BY score LIMIT -1) f \
                     JOIN memory_chunks c INDEXED BY memory_chunks_owner ON c.id = f.rowid \
                     WHERE c.tenant = ?2 AND c.agent = ?3 \
                     ORDER BY f.score LIMIT ?4",
                )
                .map_err(backend("preparing text search"))?;
            let rows = stmt
                .query_map(params![query, tenant, agent, limit as i64], |r| {
                    // bm25() is lower-is-better; callers want higher-is-better.
                    Ok((r.get::<_, i64>(0)?, -(r.get::<_, f64>(1)? as f32)))
                })
                .map_err(backend("running text search"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(backend("running text search"))
        })
        .await
    }

    async fn term_counts(&self, terms: &[String], cap: usize) -> Result<Vec<usize>, MemoryError> {
        let queries: Vec<String> = terms
            .iter()
            .map(|t| fts_query(std::slice::from_ref(t)))
            .collect();
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT count(*) FROM (SELECT 1 FROM memory_fts WHERE memory_fts MATCH ?1 LIMIT ?2)",
                )
                .map_err(backend("preparing term count"))?;
            queries
                .iter()
                .map(|q| {
                    stmt.query_row(params![q, cap as i64], |r| r.get::<_, i64>(0))
                        .map(to_usize)
                        .map_err(backend("counting a term"))
                })
                .collect()
        })
        .await
    }

    async fn chunk_count(&self) -> Result<usize, MemoryError> {
        self.read(|conn| {
            conn.prepare_cached("SELECT COALESCE(SUM(chunks), 0) FROM memory_scopes")
                .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
                .map(to_usize)
                .map_err(backend("counting chunks"))
        })
        .await
    }

    async fn version(&self, tenant: &str, agent: &str) -> Result<i64, MemoryError> {
        let (tenant, agent) = (tenant.to_owned(), agent.to_owned());
        self.read(move |conn| {
            conn.prepare_cached(
                "SELECT version FROM memory_scopes WHERE tenant = ?1 AND agent = ?2",
            )
            .and_then(|mut s| s.query_row(params![tenant, agent], |r| r.get(0)).optional())
            .map(|v| v.unwrap_or(0))
            .map_err(backend("reading the scope version"))
        })
        .await
    }

    async fn vectors(
        &self,
        tenant: &str,
        agent: &str,
        model: &str,
    ) -> Result<(i64, VectorSet), MemoryError> {
        let (tenant, agent, model) = (tenant.to_owned(), agent.to_owned(), model.to_owned());
        self.read(move |conn| {
            // One read transaction: the version is that of the vectors read.
            let tx = conn
                .unchecked_transaction()
                .map_err(backend("starting vector load"))?;
            let version: i64 = tx
                .prepare_cached(
                    "SELECT version FROM memory_scopes WHERE tenant = ?1 AND agent = ?2",
                )
                .and_then(|mut s| s.query_row(params![tenant, agent], |r| r.get(0)).optional())
                .map_err(backend("reading the scope version"))?
                .unwrap_or(0);
            let mut set = VectorSet::default();
            {
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT id, embedding FROM memory_chunks \
                         WHERE tenant = ?1 AND agent = ?2 AND model = ?3 AND embedding IS NOT NULL",
                    )
                    .map_err(backend("preparing vector load"))?;
                let mut rows = stmt
                    .query(params![tenant, agent, model])
                    .map_err(backend("loading vectors"))?;
                while let Some(row) = rows.next().map_err(backend("loading vectors"))? {
                    let rowid: i64 = row.get(0).map_err(backend("loading vectors"))?;
                    let bytes = row.get_ref(1).map_err(backend("loading vectors"))?;
                    if let Ok(bytes) = bytes.as_blob() {
                        set.push_le_bytes(rowid, bytes);
                    }
                }
            }
            tx.finish().map_err(backend("ending vector load"))?;
            Ok((version, set))
        })
        .await
    }

    async fn embeddings(
        &self,
        tenant: &str,
        agent: &str,
        model: &str,
        rowids: &[i64],
    ) -> Result<Vec<(i64, Vec<f32>)>, MemoryError> {
        let (tenant, agent, model) = (tenant.to_owned(), agent.to_owned(), model.to_owned());
        let ids = serde_json::to_string(rowids)
            .map_err(|e| MemoryError::Backend(format!("encoding chunk ids: {e}")))?;
        self.read(move |conn| {
            // The `+` keeps the planner on rowid lookups: the scope index
            // matches all three columns and would scan the whole scope.
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, embedding FROM memory_chunks \
                     WHERE id IN (SELECT value FROM json_each(?3)) \
                       AND +tenant = ?1 AND +agent = ?2 AND +model = ?4 AND embedding IS NOT NULL",
                )
                .map_err(backend("preparing vector fetch"))?;
            let rows = stmt
                .query_map(params![tenant, agent, ids, model], |r| {
                    Ok((r.get::<_, i64>(0)?, decode_vector(&r.get::<_, Vec<u8>>(1)?)))
                })
                .map_err(backend("fetching vectors"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(backend("fetching vectors"))
        })
        .await
    }

    async fn chunks(
        &self,
        tenant: &str,
        agent: &str,
        rowids: &[i64],
        model: Option<&str>,
    ) -> Result<Vec<FoundChunk>, MemoryError> {
        let (tenant, agent, model) = (
            tenant.to_owned(),
            agent.to_owned(),
            model.map(str::to_owned),
        );
        let ids = serde_json::to_string(rowids)
            .map_err(|e| MemoryError::Backend(format!("encoding chunk ids: {e}")))?;
        self.read(move |conn| {
            // `+` as in `embeddings`; the document's source and date come
            // from the covering index `memory_documents_meta`, not the row.
            let mut stmt = conn
                .prepare_cached(
                    "SELECT c.id, c.doc_id, c.ordinal, d.source, c.text, d.created_at, \
                       CASE WHEN c.model = ?4 THEN c.embedding END \
                     FROM memory_chunks c \
                     JOIN memory_documents d INDEXED BY memory_documents_meta ON d.id = c.doc_id \
                     WHERE c.id IN (SELECT value FROM json_each(?3)) \
                       AND +c.tenant = ?1 AND +c.agent = ?2",
                )
                .map_err(backend("preparing chunk fetch"))?;
            let rows = stmt
                .query_map(params![tenant, agent, ids, model], |r| {
                    Ok(FoundChunk {
                        rowid: r.get(0)?,
                        doc_id: r.get(1)?,
                        ordinal: to_usize(r.get(2)?),
                        source: r.get(3)?,
                        text: r.get(4)?,
                        created_at: parse_time(&r.get::<_, String>(5)?),
                        embedding: r.get::<_, Option<Vec<u8>>>(6)?.map(|b| decode_vector(&b)),
                    })
                })
                .map_err(backend("fetching chunks"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(backend("fetching chunks"))
        })
        .await
    }

    async fn document_text(
        &self,
        tenant: &str,
        agent: &str,
        doc_id: &str,
        ordinal: Option<usize>,
    ) -> Result<Option<(String, usize)>, MemoryError> {
        let (tenant, agent, doc_id) = (tenant.to_owned(), agent.to_owned(), doc_id.to_owned());
        self.read(move |conn| {
            let text: Option<String> = conn
                .query_row(
                    "SELECT text FROM memory_documents WHERE id = ?1 AND tenant = ?2 AND agent = ?3",
                    params![doc_id, tenant, agent],
                    |r| r.get(0),
                )
                .optional()
                .map_err(backend("reading the document"))?;
            let Some(text) = text else { return Ok(None) };
            let Some(ordinal) = ordinal else {
                return Ok(Some((text, 1)));
            };
            let line: Option<i64> = conn
                .query_row(
                    "SELECT start_line FROM memory_chunks \
                     WHERE doc_id = ?1 AND ordinal = ?2 AND tenant = ?3 AND agent = ?4",
                    params![doc_id, ordinal as i64, tenant, agent],
                    |r| r.get(0),
                )
                .optional()
                .map_err(backend("reading the chunk"))?;
            Ok(line.map(|l| (text, to_usize(l).max(1))))
        })
        .await
    }

    async fn all_documents(&self) -> Result<Vec<DocRow>, MemoryError> {
        self.read(|conn| {
            let mut stmt = conn
                .prepare(
                    "SELECT id, tenant, agent, source, title, text, created_at \
                     FROM memory_documents ORDER BY tenant, agent, id",
                )
                .map_err(backend("preparing document list"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(DocRow {
                        id: r.get(0)?,
                        tenant: r.get(1)?,
                        agent: r.get(2)?,
                        source: r.get(3)?,
                        title: r.get(4)?,
                        text: r.get(5)?,
                        created_at: parse_time(&r.get::<_, String>(6)?),
                    })
                })
                .map_err(backend("listing documents"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(backend("listing documents"))
        })
        .await
    }
}
