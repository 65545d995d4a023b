//! Drift scoring by meaning: the memory's embedder compares the run's goal
//! with its recent actions, so a paraphrased but relevant step is not
//! mistaken for drift the way word overlap alone would.

use std::sync::Arc;

use keel_memory::Embedder;

pub struct EmbedderSimilarity {
    pub embedder: Arc<dyn Embedder>,
    /// The last goal and its vector: a run's goal is compared at every step.
    goal: std::sync::Mutex<Option<(String, Vec<f32>)>>,
}

impl EmbedderSimilarity {
    pub fn new(embedder: Arc<dyn Embedder>) -> Self {
        Self {
            embedder,
            goal: std::sync::Mutex::new(None),
        }
    }

    async fn embed(&self, text: &str) -> Option<Vec<f32>> {
        match self.embedder.embed(&[text.to_owned()]).await {
            Ok(mut v) if v.len() == 1 => v.pop(),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "drift: embedding failed; scoring lexically");
                None
            }
        }
    }
}

#[async_trait::async_trait]
impl keel_core::Similarity for EmbedderSimilarity {
    async fn similarity(&self, a: &str, b: &str) -> Option<f32> {
        let cached = self
            .goal
            .lock()
            .ok()
            .and_then(|g| g.as_ref().filter(|(t, _)| t == a).map(|(_, v)| v.clone()));
        let x = match cached {
            Some(v) => v,
            None => {
                let v = self.embed(a).await?;
                if let Ok(mut g) = self.goal.lock() {
                    *g = Some((a.to_owned(), v.clone()));
                }
                v
            }
        };
        let y = self.embed(b).await?;
        cosine(&x, &y).map(|c| c.clamp(0.0, 1.0))
    }
}

fn cosine(x: &[f32], y: &[f32]) -> Option<f32> {
    if x.len() != y.len() || x.is_empty() {
        return None;
    }
    let dot: f32 = x.iter().zip(y).map(|(a, b)| a * b).sum();
    let nx: f32 = x.iter().map(|a| a * a).sum::<f32>().sqrt();
    let ny: f32 = y.iter().map(|a| a * a).sum::<f32>().sqrt();
    (nx > 0.0 && ny > 0.0).then(|| dot / (nx * ny))
}
