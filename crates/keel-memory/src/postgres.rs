//! The PostgreSQL index: tables beside the run store in the same database,
//! a generated tsvector with a GIN index for text, vectors as bytea.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::{Connection, PgPool, Row};

use crate::MemoryError;
use crate::error::backend;
use crate::index::{DocRow, FoundChunk, Index, NewChunk, StoredChunk, Written};
use crate::index::{decode_vector, encode_vector};
use crate::vectors::VectorSet;

/// Migration `i` brings the memory schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[include_str!("../migrations/postgres/0001_init.sql")];

/// Advisory lock serializing memory migrations across nodes ("kmem").
const MIGRATION_LOCK: i64 = 0x6b6d_656d;

const MAX_CONNECTIONS: u32 = 5;

pub(crate) struct PostgresIndex {
    pool: PgPool,
}

impl PostgresIndex {
    pub(crate) async fn connect(url: &str) -> Result<Self, MemoryError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| MemoryError::Backend(format!("invalid PostgreSQL URL: {e}")))?;
        let mut conn = PgConnection::connect_with(&options)
            .await
            .map_err(backend("connecting to PostgreSQL"))?;
        migrate(&mut conn).await?;
        conn.close()
            .await
            .map_err(backend("closing migration connection"))?;
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .map_err(backend("connecting to PostgreSQL"))?;
        Ok(Self { pool })
    }
}

async fn migrate(conn: &mut PgConnection) -> Result<(), MemoryError> {
    let mut tx = conn.begin().await.map_err(backend("starting migration"))?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await
        .map_err(backend("taking the migration lock"))?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS keel_memory_schema_version (\
           version    BIGINT PRIMARY KEY, \
           applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .execute(&mut *tx)
    .await
    .map_err(backend("creating the memory schema version table"))?;
    let current: i64 =
        sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM keel_memory_schema_version")
            .fetch_one(&mut *tx)
            .await
            .map_err(backend("reading memory schema version"))?;
    let latest = MIGRATIONS.len() as i64;
    if current > latest {
        return Err(MemoryError::Backend(format!(
            "memory schema version {current} is newer than this build supports ({latest})"
        )));
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        let target = index as i64 + 1;
        sqlx::raw_sql(*sql).execute(&mut *tx).await.map_err(|e| {
            MemoryError::Backend(format!("applying memory migration {target}: {e}"))
        })?;
        sqlx::query("INSERT INTO keel_memory_schema_version (version) VALUES ($1)")
            .bind(target)
            .execute(&mut *tx)
            .await
            .map_err(backend("recording memory schema version"))?;
    }
    tx.commit()
        .await
        .map_err(backend("committing memory migrations"))
}

/// A tsquery text matching any of `terms` (already plain words).
fn ts_query(terms: &[String]) -> String {
    terms
        .iter()
        .map(|t| {
            t.replace(
                ['\'', '\\', '&', '|', '!', ':', '(', ')', '<', '>', '*'],
                "",
            )
        })
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

fn to_usize(v: i32) -> usize {
    usize::try_from(v).unwrap_or(0)
}

#[async_trait]
impl Index for PostgresIndex {
    async fn existing(
        &self,
        tenant: &str,
        agent: &str,
        source: &str,
    ) -> Result<Vec<StoredChunk>, MemoryError> {
        let rows = sqlx::query(
            "SELECT c.hash, c.model, c.embedding FROM memory_chunks c \
             JOIN memory_documents d ON d.id = c.doc_id \
             WHERE d.tenant = $1 AND d.agent = $2 AND d.source = $3 \
               AND c.tenant = $1 AND c.agent = $2 \
             ORDER BY c.ordinal",
        )
        .bind(tenant)
        .bind(agent)
        .bind(source)
        .fetch_all(&self.pool)
        .await
        .map_err(backend("reading chunks"))?;
        rows.iter()
            .map(|r| {
                Ok(StoredChunk {
                    hash: r.try_get(0)?,
                    model: r.try_get(1)?,
                    embedding: r
                        .try_get::<Option<Vec<u8>>, _>(2)?
                        .map(|b| decode_vector(&b)),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(backend("reading chunks"))
    }

    async fn put(&self, doc: DocRow, chunks: Vec<NewChunk>) -> Result<Written, MemoryError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(backend("starting memory write"))?;
        // Insert or keep the existing row; either way this locks it, so two
        // nodes writing the same document take turns.
        let id: String = sqlx::query_scalar(
            "INSERT INTO memory_documents (id, tenant, agent, source, title, text, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, now()) \
             ON CONFLICT (tenant, agent, source) DO UPDATE SET \
               title = EXCLUDED.title, text = EXCLUDED.text, \
               created_at = EXCLUDED.created_at, updated_at = now() \
             RETURNING id",
        )
        .bind(&doc.id)
        .bind(&doc.tenant)
        .bind(&doc.agent)
        .bind(&doc.source)
        .bind(&doc.title)
        .bind(&doc.text)
        .bind(doc.created_at)
        .fetch_one(&mut *tx)
        .await
        .map_err(backend("writing the document"))?;
        let removed: Vec<i64> =
            sqlx::query_scalar("DELETE FROM memory_chunks WHERE doc_id = $1 RETURNING id")
                .bind(&id)
                .fetch_all(&mut *tx)
                .await
                .map_err(backend("removing old chunks"))?;
        let mut added = Vec::with_capacity(chunks.len());
        for c in &chunks {
            let rowid: i64 = sqlx::query_scalar(
                "INSERT INTO memory_chunks \
                 (doc_id, tenant, agent, ordinal, start_line, end_line, text, hash, model, embedding) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
            )
            .bind(&id)
            .bind(&doc.tenant)
            .bind(&doc.agent)
            .bind(i32::try_from(c.chunk.ordinal).unwrap_or(i32::MAX))
            .bind(i32::try_from(c.chunk.start_line).unwrap_or(i32::MAX))
            .bind(i32::try_from(c.chunk.end_line).unwrap_or(i32::MAX))
            .bind(&c.chunk.text)
            .bind(&c.chunk.hash)
            .bind(&c.model)
            .bind(c.embedding.as_deref().map(encode_vector))
            .fetch_one(&mut *tx)
            .await
            .map_err(backend("inserting a chunk"))?;
            added.push(rowid);
        }
        let version: i64 = sqlx::query_scalar(
            "INSERT INTO memory_scopes (tenant, agent, version, chunks) \
             VALUES ($1, $2, 1, (SELECT count(*) FROM memory_chunks WHERE tenant = $1 AND agent = $2)) \
             ON CONFLICT (tenant, agent) DO UPDATE SET \
               version = memory_scopes.version + 1, chunks = EXCLUDED.chunks \
             RETURNING version",
        )
        .bind(&doc.tenant)
        .bind(&doc.agent)
        .fetch_one(&mut *tx)
        .await
        .map_err(backend("bumping the scope version"))?;
        tx.commit()
            .await
            .map_err(backend("committing the document"))?;
        Ok(Written {
            id,
            version,
            removed,
            added,
        })
    }

    async fn text_search(
        &self,
        tenant: &str,
        agent: &str,
        terms: &[String],
        limit: usize,
    ) -> Result<Vec<(i64, f32)>, MemoryError> {
        let query = ts_query(terms);
        if query.is_empty() {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(
            "SELECT id, ts_rank_cd(tsv, q)::real FROM memory_chunks, to_tsquery('english', $3) q \
             WHERE tenant = $1 AND agent = $2 AND tsv @@ q \
             ORDER BY 2 DESC, id LIMIT $4",
        )
        .bind(tenant)
        .bind(agent)
        .bind(query)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(backend("running text search"))?;
        rows.iter()
            .map(|r| Ok((r.try_get::<i64, _>(0)?, r.try_get::<f32, _>(1)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(backend("running text search"))
    }

    async fn term_counts(&self, terms: &[String], cap: usize) -> Result<Vec<usize>, MemoryError> {
        let mut counts = Vec::with_capacity(terms.len());
        for term in terms {
            let query = ts_query(std::slice::from_ref(term));
            if query.is_empty() {
                counts.push(0);
                continue;
            }
            // A stop word becomes an empty tsquery, which matches nothing.
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM (SELECT 1 FROM memory_chunks \
                 WHERE tsv @@ to_tsquery('english', $1) LIMIT $2) t",
            )
            .bind(query)
            .bind(i64::try_from(cap).unwrap_or(i64::MAX))
            .fetch_one(&self.pool)
            .await
            .map_err(backend("counting a term"))?;
            counts.push(usize::try_from(n).unwrap_or(0));
        }
        Ok(counts)
    }

    async fn chunk_count(&self) -> Result<usize, MemoryError> {
        let n: i64 =
            sqlx::query_scalar("SELECT COALESCE(SUM(chunks), 0)::BIGINT FROM memory_scopes")
                .fetch_one(&self.pool)
                .await
                .map_err(backend("counting chunks"))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    async fn version(&self, tenant: &str, agent: &str) -> Result<i64, MemoryError> {
        let v: Option<i64> = sqlx::query_scalar(
            "SELECT version FROM memory_scopes WHERE tenant = $1 AND agent = $2",
        )
        .bind(tenant)
        .bind(agent)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend("reading the scope version"))?;
        Ok(v.unwrap_or(0))
    }

    async fn vectors(
        &self,
        tenant: &str,
        agent: &str,
        model: &str,
    ) -> Result<(i64, VectorSet), MemoryError> {
        use futures::TryStreamExt;
        // One snapshot: the version is that of the vectors read.
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(backend("starting vector load"))?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await
            .map_err(backend("starting vector load"))?;
        let version: Option<i64> = sqlx::query_scalar(
            "SELECT version FROM memory_scopes WHERE tenant = $1 AND agent = $2",
        )
        .bind(tenant)
        .bind(agent)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend("reading the scope version"))?;
        let mut set = VectorSet::default();
        {
            // Streamed: the f32 vectors are never all in memory at once.
            let mut rows = sqlx::query(
                "SELECT id, embedding FROM memory_chunks \
                 WHERE tenant = $1 AND agent = $2 AND model = $3 AND embedding IS NOT NULL",
            )
            .bind(tenant)
            .bind(agent)
            .bind(model)
            .fetch(&mut *tx);
            while let Some(r) = rows.try_next().await.map_err(backend("loading vectors"))? {
                let rowid: i64 = r.try_get(0).map_err(backend("loading vectors"))?;
                let bytes: &[u8] = r.try_get(1).map_err(backend("loading vectors"))?;
                set.push_le_bytes(rowid, bytes);
            }
        }
        tx.commit().await.map_err(backend("ending vector load"))?;
        Ok((version.unwrap_or(0), set))
    }

    async fn embeddings(
        &self,
        tenant: &str,
        agent: &str,
        model: &str,
        rowids: &[i64],
    ) -> Result<Vec<(i64, Vec<f32>)>, MemoryError> {
        let rows = sqlx::query(
            "SELECT id, embedding FROM memory_chunks \
             WHERE id = ANY($3) AND tenant = $1 AND agent = $2 AND model = $4 \
               AND embedding IS NOT NULL",
        )
        .bind(tenant)
        .bind(agent)
        .bind(rowids)
        .bind(model)
        .fetch_all(&self.pool)
        .await
        .map_err(backend("fetching vectors"))?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<i64, _>(0)?,
                    decode_vector(r.try_get::<&[u8], _>(1)?),
                ))
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(backend("fetching vectors"))
    }

    async fn chunks(
        &self,
        tenant: &str,
        agent: &str,
        rowids: &[i64],
        model: Option<&str>,
    ) -> Result<Vec<FoundChunk>, MemoryError> {
        let rows = sqlx::query(
            "SELECT c.id, c.doc_id, c.ordinal, d.source, c.text, d.created_at, \
               CASE WHEN c.model = $4 THEN c.embedding END \
             FROM memory_chunks c JOIN memory_documents d ON d.id = c.doc_id \
             WHERE c.id = ANY($3) AND c.tenant = $1 AND c.agent = $2",
        )
        .bind(tenant)
        .bind(agent)
        .bind(rowids)
        .bind(model)
        .fetch_all(&self.pool)
        .await
        .map_err(backend("fetching chunks"))?;
        rows.iter()
            .map(|r| {
                Ok(FoundChunk {
                    rowid: r.try_get(0)?,
                    doc_id: r.try_get(1)?,
                    ordinal: to_usize(r.try_get(2)?),
                    source: r.try_get(3)?,
                    text: r.try_get(4)?,
                    created_at: r.try_get::<DateTime<Utc>, _>(5)?,
                    embedding: r
                        .try_get::<Option<Vec<u8>>, _>(6)?
                        .map(|b| decode_vector(&b)),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(backend("fetching chunks"))
    }

    async fn document_text(
        &self,
        tenant: &str,
        agent: &str,
        doc_id: &str,
        ordinal: Option<usize>,
    ) -> Result<Option<(String, usize)>, MemoryError> {
        let text: Option<String> = sqlx::query_scalar(
            "SELECT text FROM memory_documents WHERE id = $1 AND tenant = $2 AND agent = $3",
        )
        .bind(doc_id)
        .bind(tenant)
        .bind(agent)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend("reading the document"))?;
        let Some(text) = text else { return Ok(None) };
        let Some(ordinal) = ordinal else {
            return Ok(Some((text, 1)));
        };
        let line: Option<i32> = sqlx::query_scalar(
            "SELECT start_line FROM memory_chunks \
             WHERE doc_id = $1 AND ordinal = $2 AND tenant = $3 AND agent = $4",
        )
        .bind(doc_id)
        .bind(i32::try_from(ordinal).unwrap_or(i32::MAX))
        .bind(tenant)
        .bind(agent)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend("reading the chunk"))?;
        Ok(line.map(|l| (text, to_usize(l).max(1))))
    }

    async fn all_documents(&self) -> Result<Vec<DocRow>, MemoryError> {
        let rows = sqlx::query(
            "SELECT id, tenant, agent, source, title, text, created_at \
             FROM memory_documents ORDER BY tenant, agent, id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(backend("listing documents"))?;
        rows.iter()
            .map(|r| {
                Ok(DocRow {
                    id: r.try_get(0)?,
                    tenant: r.try_get(1)?,
                    agent: r.try_get(2)?,
                    source: r.try_get(3)?,
                    title: r.try_get(4)?,
                    text: r.try_get(5)?,
                    created_at: r.try_get(6)?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(backend("listing documents"))
    }
}
