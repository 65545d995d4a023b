//! How a local model is run.

use std::path::PathBuf;

/// Output budget when neither the request nor the configuration names one.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 256;
/// The default thread count never exceeds this: beyond it, small models
/// gain little and the rest of keel loses its cores.
pub const MAX_DEFAULT_THREADS: u32 = 4;

#[derive(Debug, Clone, PartialEq)]
pub struct LocalSettings {
    /// The GGUF file.
    pub model_path: PathBuf,
    /// The name used in logs and metrics.
    pub name: String,
    /// Inference threads; `None` means the available cores, at most [`MAX_DEFAULT_THREADS`].
    pub threads: Option<u32>,
    /// Context window in tokens; `None` means the one the GGUF was trained with.
    pub context_window: Option<u64>,
    /// Output budget per completion when the request names none.
    pub max_output_tokens: u32,
    /// Repetition penalty over the recent free text (1.0 = off).
    pub repeat_penalty: f32,
    /// Run Q4_1 weights as a Q8_0 copy made once beside the GGUF (on by
    /// default). llama.cpp's CPU backend evaluates prompts through Q4_1
    /// weights one dot product at a time but through Q8_0 weights with a
    /// tiled matrix kernel: for SmolLM2-135M on 2 cores the first token of
    /// a 300-token prompt comes 30–40% sooner (measured back to back),
    /// generation is no slower, and every weight stays within a fraction of
    /// a Q4_1 step of the original. Costs, for SmolLM2-135M: a 145 MB file
    /// beside the 98 MB GGUF, ~0.6 s once to write it, +46 MiB peak RSS.
    /// See `crate::weights` (private) for the conversion.
    pub requantize_q4_1: bool,
}

impl LocalSettings {
    pub fn new(model_path: impl Into<PathBuf>, name: impl Into<String>) -> Self {
        Self {
            model_path: model_path.into(),
            name: name.into(),
            threads: None,
            context_window: None,
            max_output_tokens: DEFAULT_MAX_OUTPUT_TOKENS,
            repeat_penalty: 1.15,
            requantize_q4_1: true,
        }
    }

    /// The thread count actually used.
    pub fn effective_threads(&self) -> u32 {
        self.threads.filter(|t| *t > 0).unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| u32::try_from(n.get()).unwrap_or(1))
                .min(MAX_DEFAULT_THREADS)
        })
    }
}
