//! What can go wrong when loading or running a local model.

use std::path::PathBuf;

use keel_protocol::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("model file {0} does not exist; run `keel model pull` or set model_path")]
    MissingFile(PathBuf),
    #[error("cannot start the llama.cpp backend: {0}")]
    Backend(String),
    #[error("cannot load the model {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("cannot create an inference context: {0}")]
    Context(String),
    #[error("cannot render the chat template: {0}")]
    Template(String),
    #[error("cannot build the action grammar: {0}")]
    Grammar(String),
    #[error("inference failed: {0}")]
    Inference(String),
    #[error("the prompt needs {needed} tokens but the context window holds {window}")]
    PromptTooLong { needed: usize, window: usize },
    #[error("the local model worker has stopped")]
    WorkerGone,
}

impl From<LocalError> for ModelError {
    fn from(e: LocalError) -> Self {
        // None of these get better by retrying the same request.
        ModelError::Protocol(format!("local model: {e}"))
    }
}
