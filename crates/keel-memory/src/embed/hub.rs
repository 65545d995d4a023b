//! Fetching a sentence-transformers model from a Hugging Face-style hub
//! (`<endpoint>/<repo>/resolve/<revision>/<file>`), for machines that can
//! reach one. `HF_ENDPOINT` points at a mirror, as with the Python tools.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::EmbedError;
use super::local::MODEL_FILES;

/// The default model: small (90 MB), fast on a CPU, 384 dimensions.
pub const DEFAULT_MODEL_REPO: &str = "sentence-transformers/all-MiniLM-L6-v2";

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Downloads the files a [`super::LocalEmbedder`] needs into `dir`, skipping
/// those already there, and returns `dir`. Each file is written under a
/// temporary name and renamed, so an interrupted download is never mistaken
/// for a complete one.
pub async fn download_model(
    repo: &str,
    revision: &str,
    dir: &Path,
    endpoint: Option<&str>,
) -> Result<PathBuf, EmbedError> {
    let endpoint = endpoint
        .map(str::to_owned)
        .or_else(|| std::env::var("HF_ENDPOINT").ok())
        .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned());
    let endpoint = endpoint.trim_end_matches('/');
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| unavailable(format!("creating {}: {e}", dir.display())))?;
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(600))
        .build()
        .map_err(|e| unavailable(format!("building the HTTP client: {e}")))?;
    for file in MODEL_FILES {
        let target = dir.join(file);
        if tokio::fs::metadata(&target)
            .await
            .is_ok_and(|m| m.len() > 0)
        {
            continue;
        }
        let url = format!("{endpoint}/{repo}/resolve/{revision}/{file}");
        tracing::info!(%url, "downloading embedding model file");
        let response = client
            .get(&url)
            .send()
            .await
            .map_err(|e| unavailable(format!("downloading {url}: {e}")))?;
        if !response.status().is_success() {
            return Err(unavailable(format!(
                "downloading {url}: HTTP {}",
                response.status()
            )));
        }
        let bytes = response
            .bytes()
            .await
            .map_err(|e| unavailable(format!("downloading {url}: {e}")))?;
        let partial = dir.join(format!("{file}.partial"));
        tokio::fs::write(&partial, &bytes)
            .await
            .map_err(|e| unavailable(format!("writing {}: {e}", partial.display())))?;
        tokio::fs::rename(&partial, &target)
            .await
            .map_err(|e| unavailable(format!("renaming {}: {e}", partial.display())))?;
    }
    Ok(dir.to_path_buf())
}

fn unavailable(message: String) -> EmbedError {
    EmbedError::Unavailable(message)
}
