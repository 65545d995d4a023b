//! A model that answers from a script, in-process: the real
//! [`ModelClient`] port, without HTTP, for fast tests of the run loop.
//!
//! Every request is recorded and checked against the tool-call pairing rules
//! the providers enforce (see [`pairing`]). A request that breaks them is
//! recorded as a violation and answered with [`ModelError::Protocol`], so
//! the run fails visibly; a request the script has no reply for is answered
//! the same way. [`ScriptedModel::assert_clean`] (called by
//! `TestRuntime::finish`) turns either into a test failure.

pub mod pairing;
mod reply;

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::channel::mpsc::UnboundedSender;
use keel_protocol::{ModelClient, ModelError, ModelRequest, ModelResponse, RequestGate};

pub use reply::{
    call_tool, call_tools, fail, hang, last_user_text, offers_tools, raw_call, reply_text, respond,
    system_texts, tool_messages, when_open,
};

/// Answers one request from what it contains.
pub type Responder = dyn Fn(&ModelRequest) -> ModelResponse + Send + Sync;

/// One scripted turn of the model.
pub enum Step {
    /// This reply, whatever the request.
    Reply(ModelResponse),
    /// The reply the closure builds from the request.
    Respond(Box<Responder>),
    /// This error, as a provider would return it.
    Fail(ModelError),
    /// Never answers; the run can only be cancelled (or time out).
    Hang,
    /// Waits until the gate is open, then takes the inner step.
    Gated(Gate, Box<Step>),
}

impl From<ModelResponse> for Step {
    fn from(response: ModelResponse) -> Self {
        Self::Reply(response)
    }
}

/// A door a test opens when it is ready: a scripted step or a test tool
/// waits on it, so the test can act (steer, follow up, cancel) at a known
/// point of the run instead of racing it.
#[derive(Clone)]
pub struct Gate {
    open: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Gate {
    pub fn new() -> Self {
        Self {
            open: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    pub fn open(&self) {
        self.open.send_replace(true);
    }

    pub fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// Returns once the gate is open (at once when it already is).
    pub async fn wait(&self) {
        let mut rx = self.open.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|open| *open).await;
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Default)]
struct State {
    steps: VecDeque<Step>,
    /// Steps given in all, to say how far the script got when it runs out.
    scripted: usize,
    otherwise: Option<Arc<Responder>>,
    requests: Vec<ModelRequest>,
    violations: Vec<String>,
    unscripted: Vec<String>,
    next_call: u64,
    stream: bool,
    context_window: Option<u64>,
}

struct Inner {
    name: String,
    state: Mutex<State>,
}

/// The scripted model. Clones share the script and the records, so a test
/// keeps one clone to inspect while the runtime uses another.
#[derive(Clone)]
pub struct ScriptedModel {
    inner: Arc<Inner>,
}

impl ScriptedModel {
    /// A model answering with `steps` in order; a request after the last
    /// one is an error (see [`ScriptedModel::unscripted`]).
    pub fn new<S: Into<Step>>(steps: impl IntoIterator<Item = S>) -> Self {
        let steps: VecDeque<Step> = steps.into_iter().map(Into::into).collect();
        Self::with_state(State {
            scripted: steps.len(),
            steps,
            ..State::default()
        })
    }

    /// A model answering every request with `responder`, for runs whose
    /// number of model calls the loop decides (budgets, loop detection).
    pub fn handler(
        responder: impl Fn(&ModelRequest) -> ModelResponse + Send + Sync + 'static,
    ) -> Self {
        Self::new(Vec::<Step>::new()).otherwise(responder)
    }

    fn with_state(state: State) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: "scripted".into(),
                state: Mutex::new(state),
            }),
        }
    }

    /// Adds a step after the ones already scripted.
    pub fn then(self, step: impl Into<Step>) -> Self {
        {
            let mut state = self.state();
            state.steps.push_back(step.into());
            state.scripted += 1;
        }
        self
    }

    /// Answers with `responder` once the scripted steps are used up,
    /// instead of failing.
    pub fn otherwise(
        self,
        responder: impl Fn(&ModelRequest) -> ModelResponse + Send + Sync + 'static,
    ) -> Self {
        self.state().otherwise = Some(Arc::new(responder));
        self
    }

    /// Sends each reply's text as one delta when the loop asks for deltas
    /// (off by default: the deltas channel is ignored).
    pub fn streaming(self, stream: bool) -> Self {
        self.state().stream = stream;
        self
    }

    /// The context window the model declares (default: none).
    pub fn context_window(self, tokens: u64) -> Self {
        self.state().context_window = Some(tokens);
        self
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A responder that panicked must not hide the records from the test.
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.state().requests.clone()
    }

    pub fn request_count(&self) -> usize {
        self.state().requests.len()
    }

    /// The request numbered `i` from 0, if it arrived.
    pub fn request(&self, i: usize) -> Option<ModelRequest> {
        self.state().requests.get(i).cloned()
    }

    /// Pairing rules broken by requests, each naming the request.
    pub fn violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    /// Requests that found no step left (or whose responder panicked).
    pub fn unscripted(&self) -> Vec<String> {
        self.state().unscripted.clone()
    }

    /// Scripted steps not used yet.
    pub fn remaining(&self) -> usize {
        self.state().steps.len()
    }

    /// Fails the test when any request broke the pairing rules or found
    /// no scripted reply.
    #[allow(clippy::panic)] // failing the test is the purpose
    pub fn assert_clean(&self) {
        let state = self.state();
        if state.violations.is_empty() && state.unscripted.is_empty() {
            return;
        }
        panic!(
            "the scripted model saw {} pairing violation(s) and {} unscripted request(s):\n{}",
            state.violations.len(),
            state.unscripted.len(),
            state
                .violations
                .iter()
                .chain(state.unscripted.iter())
                .map(|p| format!("  - {p}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// Records the request and picks its step; the step runs unlocked, so
    /// a responder may inspect the model.
    fn take(&self, request: &ModelRequest) -> Result<(usize, Step), ModelError> {
        let mut state = self.state();
        let n = state.requests.len();
        state.requests.push(request.clone());
        let problems = pairing::check(request);
        if !problems.is_empty() {
            for p in &problems {
                state.violations.push(format!("request #{n}: {p}"));
            }
            return Err(ModelError::Protocol(format!(
                "scripted model: request #{n} breaks the tool-call pairing rules: {}",
                problems.join("; ")
            )));
        }
        if let Some(step) = state.steps.pop_front() {
            return Ok((n, step));
        }
        if let Some(responder) = state.otherwise.clone() {
            return Ok((n, Step::Respond(Box::new(move |r| responder(r)))));
        }
        let why = format!(
            "request #{n} arrived after all {} scripted step(s) were used",
            state.scripted
        );
        state.unscripted.push(why.clone());
        Err(ModelError::Protocol(format!("scripted model: {why}")))
    }

    fn assign_ids(&self, response: &mut ModelResponse) {
        let mut state = self.state();
        for call in &mut response.tool_calls {
            if call.id.is_empty() {
                state.next_call += 1;
                call.id = format!("call_{}", state.next_call);
            }
        }
    }

    async fn answer(
        &self,
        n: usize,
        step: Step,
        request: &ModelRequest,
    ) -> Result<ModelResponse, ModelError> {
        let mut step = step;
        loop {
            match step {
                Step::Reply(response) => return Ok(response),
                Step::Fail(error) => return Err(error),
                Step::Hang => futures::future::pending::<()>().await,
                Step::Gated(gate, inner) => {
                    gate.wait().await;
                    step = *inner;
                }
                Step::Respond(responder) => {
                    // A panicking responder would take the run's task down
                    // with it and leave the run hanging; report it instead.
                    return std::panic::catch_unwind(AssertUnwindSafe(|| responder(request)))
                        .map_err(|panic| {
                            let why = format!(
                                "request #{n}: the responder panicked: {}",
                                panic_text(panic.as_ref())
                            );
                            self.state().unscripted.push(why.clone());
                            ModelError::Protocol(format!("scripted model: {why}"))
                        });
                }
            }
        }
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

#[async_trait::async_trait]
impl ModelClient for ScriptedModel {
    fn model_name(&self) -> &str {
        &self.inner.name
    }

    fn context_window(&self) -> Option<u64> {
        self.state().context_window
    }

    /// One scripted reply per call: no request is ever retried.
    async fn complete_gated(
        &self,
        request: &ModelRequest,
        deltas: Option<UnboundedSender<String>>,
        _gate: &dyn RequestGate,
    ) -> Result<ModelResponse, ModelError> {
        let (n, step) = self.take(request)?;
        let mut response = self.answer(n, step, request).await?;
        self.assign_ids(&mut response);
        if response.finish_reason.is_none() {
            response.finish_reason = Some(
                if response.tool_calls.is_empty() {
                    "stop"
                } else {
                    "tool_calls"
                }
                .to_owned(),
            );
        }
        let stream = self.state().stream;
        if stream
            && !response.text.is_empty()
            && let Some(tx) = deltas
        {
            // The loop may have stopped listening (cancelled); that is fine.
            let _ = tx.unbounded_send(response.text.clone());
        }
        Ok(response)
    }
}
