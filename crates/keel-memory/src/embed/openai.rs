//! Any OpenAI-compatible `/v1/embeddings` endpoint (OpenAI, vLLM, Ollama,
//! llama.cpp server, DashScope…).

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;

use super::{EmbedError, Embedder};
use crate::rank::normalize;

/// Texts sent in one request; endpoints cap the batch size.
const BATCH: usize = 64;

pub struct OpenAiEmbedder {
    client: reqwest::Client,
    url: String,
    model: String,
    name: String,
    api_key: Option<String>,
    dim: usize,
}

#[derive(Deserialize)]
struct Response {
    data: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    index: usize,
    embedding: Vec<f32>,
}

impl OpenAiEmbedder {
    /// Connects to `base_url` (ending in `/v1`) and learns the model's
    /// dimension by embedding one probe text, so a wrong URL, key or model
    /// fails here, at startup, instead of on the first search.
    pub async fn connect(
        base_url: &str,
        model: &str,
        api_key: Option<String>,
    ) -> Result<Self, EmbedError> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| EmbedError::Remote(format!("building the HTTP client: {e}")))?;
        let mut embedder = Self {
            client,
            url: format!("{}/embeddings", base_url.trim_end_matches('/')),
            model: model.to_owned(),
            name: format!("openai/{model}"),
            api_key,
            dim: 0,
        };
        let probe = embedder.request(&["dimension probe".to_owned()]).await?;
        embedder.dim = probe.first().map_or(0, Vec::len);
        if embedder.dim == 0 {
            return Err(EmbedError::Remote(format!(
                "{} returned an empty embedding for model {model}",
                embedder.url
            )));
        }
        Ok(embedder)
    }

    async fn request(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut req = self
            .client
            .post(&self.url)
            .json(&json!({"model": self.model, "input": texts}));
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let response = req
            .send()
            .await
            .map_err(|e| EmbedError::Remote(format!("POST {}: {e}", self.url)))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            let body: String = body.chars().take(300).collect();
            return Err(EmbedError::Remote(format!(
                "POST {}: HTTP {status}: {body}",
                self.url
            )));
        }
        let mut parsed: Response = response
            .json()
            .await
            .map_err(|e| EmbedError::Remote(format!("reading {} response: {e}", self.url)))?;
        if parsed.data.len() != texts.len() {
            return Err(EmbedError::Remote(format!(
                "{} returned {} embeddings for {} texts",
                self.url,
                parsed.data.len(),
                texts.len()
            )));
        }
        parsed.data.sort_by_key(|item| item.index);
        Ok(parsed
            .data
            .into_iter()
            .map(|item| normalize(item.embedding))
            .collect())
    }
}

#[async_trait]
impl Embedder for OpenAiEmbedder {
    fn name(&self) -> &str {
        &self.name
    }

    fn dim(&self) -> usize {
        self.dim
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out = Vec::with_capacity(texts.len());
        for batch in texts.chunks(BATCH) {
            let vectors = self.request(batch).await?;
            if let Some(bad) = vectors.iter().find(|v| v.len() != self.dim) {
                return Err(EmbedError::Remote(format!(
                    "{} returned a {}-dimension vector, expected {}",
                    self.url,
                    bad.len(),
                    self.dim
                )));
            }
            out.extend(vectors);
        }
        Ok(out)
    }
}
