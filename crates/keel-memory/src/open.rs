//! Building a memory from configuration: which database, which embedder,
//! and what to tell the operator when there is no embedding model.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_config::{Config, EmbedderKind, MemoryConfig};

use crate::embed::{Embedder, OpenAiEmbedder, resolve_local};
use crate::hybrid::HybridMemory;
use crate::index::Index;
use crate::postgres::PostgresIndex;
use crate::sqlite::SqliteIndex;
use crate::{Memory, MemoryError, Settings};

/// Opens memory with default settings: in PostgreSQL when `database_url` is
/// `postgres://…` (tables beside the run store), else in SQLite at
/// `<data_dir>/memory.db`, separate from `keel.db`. With no embedder,
/// search is BM25 only and [`Memory::status`] says so.
pub async fn open(
    database_url: &str,
    data_dir: &Path,
    embedder: Option<Arc<dyn Embedder>>,
) -> Result<Arc<dyn Memory>, MemoryError> {
    let notice = embedder
        .is_none()
        .then(|| bm25_only_notice("no embedder was given"));
    open_with(
        database_url,
        data_dir,
        embedder,
        Settings::default(),
        notice,
    )
    .await
}

/// [`open`] with explicit settings and operator notice.
pub async fn open_with(
    database_url: &str,
    data_dir: &Path,
    embedder: Option<Arc<dyn Embedder>>,
    settings: Settings,
    notice: Option<String>,
) -> Result<Arc<dyn Memory>, MemoryError> {
    let index: Arc<dyn Index> =
        if database_url.starts_with("postgres://") || database_url.starts_with("postgresql://") {
            Arc::new(PostgresIndex::connect(database_url).await?)
        } else {
            let path = data_dir.join("memory.db");
            Arc::new(
                tokio::task::spawn_blocking(move || SqliteIndex::open(&path))
                    .await
                    .map_err(|e| MemoryError::Backend(format!("opening memory.db: {e}")))??,
            )
        };
    if let Some(notice) = &notice {
        tracing::warn!("{notice}");
    }
    Ok(Arc::new(HybridMemory::new(
        index, embedder, settings, notice,
    )))
}

/// The embedder `[memory]` asks for, or `None` and the reason, phrased for
/// the operator, when there is none (BM25-only search).
pub async fn build_embedder(
    config: &MemoryConfig,
    data_dir: &Path,
) -> (Option<Arc<dyn Embedder>>, Option<String>) {
    match config.embedder {
        EmbedderKind::None => (
            None,
            Some("memory.embedder = \"none\": memory search uses BM25 only".to_owned()),
        ),
        EmbedderKind::Local => {
            let dir = config.model_dir.as_deref().map(PathBuf::from);
            match resolve_local(dir.as_deref(), data_dir).await {
                Ok(e) => {
                    tracing::info!(
                        model = e.name(),
                        dim = e.dim(),
                        "local embedding model loaded"
                    );
                    (Some(Arc::new(e)), None)
                }
                Err(e) => (None, Some(bm25_only_notice(&e.to_string()))),
            }
        }
        EmbedderKind::Openai => {
            let (Some(url), Some(model)) = (&config.embeddings_base_url, &config.embeddings_model)
            else {
                return (
                    None,
                    Some(bm25_only_notice(
                        "memory.embeddings_base_url and memory.embeddings_model are required \
                         for embedder = \"openai\"",
                    )),
                );
            };
            let key = config
                .api_key_env
                .as_deref()
                .and_then(|var| std::env::var(var).ok())
                .filter(|k| !k.is_empty());
            match OpenAiEmbedder::connect(url, model, key).await {
                Ok(e) => (Some(Arc::new(e)), None),
                Err(e) => (None, Some(bm25_only_notice(&e.to_string()))),
            }
        }
    }
}

/// Memory as the configuration describes it: the database of
/// `server.database_url` (SQLite `memory.db` under `server.data_dir` by
/// default), the `[memory]` embedder and ranking settings.
pub async fn from_config(config: &Config) -> Result<Arc<dyn Memory>, MemoryError> {
    let data_dir = PathBuf::from(&config.server.data_dir);
    let url = config.server.database_url.clone().unwrap_or_default();
    let (embedder, notice) = build_embedder(&config.memory, &data_dir).await;
    open_with(
        &url,
        &data_dir,
        embedder,
        settings_of(&config.memory),
        notice,
    )
    .await
}

/// The ranking and chunking part of `[memory]`.
pub fn settings_of(m: &MemoryConfig) -> Settings {
    Settings {
        chunk_tokens: m.chunk_tokens.max(1),
        chunk_overlap: m.chunk_overlap,
        text_weight: m.text_weight as f32,
        vector_weight: m.vector_weight as f32,
        mmr_lambda: m.mmr_lambda as f32,
        time_decay_half_life_days: m.time_decay_half_life_days,
    }
}

fn bm25_only_notice(reason: &str) -> String {
    format!("no embedding model available: memory search uses BM25 only ({reason})")
}
