//! The `ModelClient` face of the worker.

use std::sync::mpsc;

use futures::channel::mpsc::UnboundedSender;
use futures::channel::oneshot;
use keel_protocol::{ModelClient, ModelError, ModelRequest, ModelResponse, RequestGate};

use crate::engine::{self, Job};
use crate::error::LocalError;
use crate::settings::LocalSettings;

/// A GGUF model run in this process. Requests queue for one worker thread
/// that owns the inference context; dropping a request's future cancels it
/// (before it starts, or within one token once it has).
///
/// With tools offered, every reply is a valid action by construction: the
/// decoder is constrained to a JSON schema with one branch per tool (that
/// tool's own argument schema), `clarify` and `respond`. Without tools the
/// reply is plain text, streamed.
pub struct LocalModel {
    name: String,
    context_window: u64,
    jobs: mpsc::Sender<Job>,
}

impl std::fmt::Debug for LocalModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalModel")
            .field("name", &self.name)
            .field("context_window", &self.context_window)
            .finish()
    }
}

impl LocalModel {
    /// Loads the model on a new worker thread and waits until it is ready.
    /// Blocking: loading reads the whole file.
    pub fn load(settings: LocalSettings) -> Result<Self, LocalError> {
        if !settings.model_path.is_file() {
            return Err(LocalError::MissingFile(settings.model_path));
        }
        let name = settings.name.clone();
        let (jobs, queue) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name(format!("keel-local-{name}"))
            .spawn(move || engine::run(settings, queue, ready_tx))
            .map_err(|e| LocalError::Backend(format!("cannot start the worker thread: {e}")))?;
        let loaded = ready_rx.recv().map_err(|_| LocalError::WorkerGone)??;
        Ok(Self {
            name,
            context_window: loaded.context_window,
            jobs,
        })
    }

    /// Drops the cached prompt, so the next request is evaluated cold.
    pub fn clear_cache(&self) -> Result<(), LocalError> {
        self.jobs
            .send(Job::ClearCache)
            .map_err(|_| LocalError::WorkerGone)
    }
}

#[async_trait::async_trait]
impl ModelClient for LocalModel {
    fn model_name(&self) -> &str {
        &self.name
    }

    fn context_window(&self) -> Option<u64> {
        Some(self.context_window)
    }

    /// Small models' vocabularies split identifiers and JSON finely.
    fn chars_per_token(&self) -> f64 {
        3.0
    }

    /// One decoding per call, in this process: nothing to retry or bill.
    async fn complete_gated(
        &self,
        request: &ModelRequest,
        deltas: Option<UnboundedSender<String>>,
        _gate: &dyn RequestGate,
    ) -> Result<ModelResponse, ModelError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job::Complete {
                request: request.clone(),
                deltas,
                reply,
            })
            .map_err(|_| LocalError::WorkerGone)?;
        answer.await.map_err(|_| LocalError::WorkerGone)?
    }
}
