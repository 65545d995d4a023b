//! Tuning of chunking and ranking (the `[memory]` config section).

/// How documents are chunked and results ranked.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Tokens per chunk (words, or CJK characters).
    pub chunk_tokens: usize,
    /// Tokens each chunk repeats from the previous one.
    pub chunk_overlap: usize,
    /// Weight of the BM25 score in the fused score.
    pub text_weight: f32,
    /// Weight of the cosine similarity in the fused score.
    pub vector_weight: f32,
    /// MMR trade-off: 1.0 = relevance only, lower = more diversity.
    pub mmr_lambda: f32,
    /// Scores halve every this many days since a document's date; 0 = off.
    pub time_decay_half_life_days: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            chunk_tokens: 256,
            chunk_overlap: 32,
            text_weight: 0.3,
            vector_weight: 0.7,
            mmr_lambda: 0.7,
            time_decay_half_life_days: 0.0,
        }
    }
}
