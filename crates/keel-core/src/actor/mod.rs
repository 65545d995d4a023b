//! One task per live run: it owns the run's state, receives commands, and
//! drives the dual loop (inner: model → guarded tool calls; outer: follow-ups).
//!
//! Every change is committed to the store before its events are published,
//! and every tool call gets exactly one result in the history, whatever
//! happens to it (executed, refused, skipped by steering, cancelled).
//!
//! Every call, from every path, is judged by `pipeline::evaluate` and
//! carried out by `apply` (in `apply.rs`), the only code that executes a
//! tool or hands a call to the client.

mod apply;
mod approval;
mod ask;
mod behind;
mod client;
mod compact;
mod course;
mod deliver;
mod finish;
mod model_call;
mod observe;
mod recover;
mod route;
mod scrub;
mod turn;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use keel_protocol::{
    Budget, Commit, CompletionReason, ErrorBody, EventKind, Message, Principal, RunPatch,
    RunRecord, RunStatus, StoreError, ToolCall, Usage, shared_messages,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::agent::AgentRuntime;
use crate::outbound::Outgoing;
use crate::pipeline::{RunView, ToolSnapshot};
use crate::runtime::{Command, Shared};
use crate::state::LoopState;
use crate::toolset::ToolSet;

/// Why the loop stopped early.
#[derive(Debug)]
pub(crate) enum Exit {
    Cancelled,
    Failed(ErrorBody),
    Budget(Budget),
    Store(StoreError),
    /// The runtime dropped the command channel (shutdown): leave the run as stored.
    Detached,
}

impl From<StoreError> for Exit {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// What ended a wait for the user.
enum Waited {
    Reply(String),
    Restore(String),
}

/// A final answer, not yet committed: the outer loop decides whether it
/// completes the run or a queued follow-up starts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    pub text: String,
    pub reason: CompletionReason,
}

/// What one pass of the inner loop leaves to do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Flow {
    Continue,
    Answered(Answer),
}

/// Room left past the loop state's last length when it is serialized
/// again: a call adds a counter or two (an outcome's takes about 30 bytes).
const STATE_SLACK: usize = 512;

/// A commit under way (see `RunActor::commit`).
type Committing<'a> = futures::future::BoxFuture<'a, Result<(), Exit>>;

pub(crate) struct RunActor {
    shared: Arc<Shared>,
    run_id: String,
    status: RunStatus,
    input: String,
    session: String,
    principal: Principal,
    agent: AgentRuntime,
    /// Shared with the requests built from it (see `ModelRequest::messages`).
    history: Vec<Arc<Message>>,
    state: LoopState,
    steps: u32,
    usage: Usage,
    commands: mpsc::UnboundedReceiver<Command>,
    cancel: CancellationToken,
    cancelled_by: Arc<std::sync::Mutex<Option<String>>>,
    /// How long this node still surely holds the run (nodes sharing a store).
    lease: Arc<crate::lease::LeaseClock>,
    steers: VecDeque<String>,
    /// Notes for the model, committed after the current turn's tool results.
    notes: Vec<String>,
    /// Work held back until the next commit (see `hold`).
    held: (Vec<EventKind>, Vec<Message>),
    started: Instant,
    /// A checkpoint restore asked for while the run was busy; applied before the next step.
    pending_restore: Option<String>,
    /// Tool calls per run of this agent's recent completed runs, once looked up.
    baseline_calls: Option<Option<f32>>,
    /// The run's client tools, compiled once.
    client_tools: Arc<ToolSet>,
    /// The chat channel the run came from (`metadata.channel`), where its
    /// answer and questions go.
    origin: Option<serde_json::Value>,
    /// The run's metadata, announced with `run_started`.
    metadata: serde_json::Value,
    /// The system message of every step: the agent's system prompt, then
    /// the context a `before_prompt_build` hook gave this run
    /// (`metadata.prompt_context`), then keel's standing instructions.
    /// Each step's request shares it; without hook context it is the
    /// agent's, shared with the agent's other runs.
    system_message: Arc<Message>,
    /// The loop state as last stored, as JSON text: a commit that leaves
    /// it unchanged does not write it again.
    written_state: String,
    /// The provider's encoding of the history it was last sent: each model
    /// call of the run encodes only what is new.
    wire_cache: keel_protocol::WireCache,
    /// Commits still being written while the run goes on (see
    /// `commit_behind`); every later write waits for them first.
    writing: Option<behind::Behind>,
    /// The timer after which a running tool call is announced, made at the
    /// run's first tool call and moved, not made anew, for each later one
    /// (see `run_tool`).
    announce: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

pub(crate) struct ActorInit {
    pub shared: Arc<Shared>,
    pub record: RunRecord,
    /// The loop state of a run created just now, whose record holds none
    /// yet; it saves turning the state into JSON and back before the first
    /// step.
    pub fresh: Option<LoopState>,
    pub agent: AgentRuntime,
    pub commands: mpsc::UnboundedReceiver<Command>,
    pub cancel: CancellationToken,
    pub cancelled_by: Arc<std::sync::Mutex<Option<String>>>,
    pub lease: Arc<crate::lease::LeaseClock>,
}

impl RunActor {
    pub(crate) fn new(init: ActorInit) -> Self {
        let r = init.record;
        let state = init
            .fresh
            .unwrap_or_else(|| LoopState::from_value(&r.state));
        // What the store holds, so that the first commit writes the state
        // whenever it differs.
        let written_state = r.state.to_string();
        let client_tools = match crate::pipeline::client_tools(&state.client_tools) {
            Ok(set) => set,
            Err(e) => {
                // Checked when the run was created; a stored run from an
                // older version may still carry one that does not compile.
                tracing::warn!(run = %r.id, error = %e, "client tools left out");
                ToolSet::default()
            }
        };
        // Wall time counts from creation, minus time spent waiting for people.
        let age = (keel_protocol::now() - r.created_at)
            .to_std()
            .unwrap_or_default();
        let counted = age.saturating_sub(Duration::from_secs_f64(state.waited_s.max(0.0)));
        let started = Instant::now()
            .checked_sub(counted)
            .unwrap_or_else(Instant::now);
        let origin = r.metadata.get("channel").filter(|c| c.is_object()).cloned();
        let system_message =
            match r.metadata.get("prompt_context").and_then(|c| c.as_str()) {
                Some(context) if !context.trim().is_empty() => crate::prompt::system_message(
                    &format!("{}\n\n{}", init.agent.config.system_prompt, context.trim()),
                ),
                _ => Arc::clone(&init.agent.system_message),
            };
        Self {
            shared: init.shared,
            origin,
            metadata: r.metadata,
            system_message,
            written_state,
            wire_cache: keel_protocol::WireCache::default(),
            writing: None,
            announce: None,
            run_id: r.id,
            status: r.status,
            input: r.input,
            session: r.session,
            principal: r.principal.unwrap_or_else(Principal::local_default),
            agent: init.agent,
            history: Vec::new(),
            state,
            steps: r.steps,
            usage: r.usage,
            commands: init.commands,
            cancel: init.cancel,
            cancelled_by: init.cancelled_by,
            lease: init.lease,
            steers: VecDeque::new(),
            notes: Vec::new(),
            held: (Vec::new(), Vec::new()),
            started,
            pending_restore: None,
            baseline_calls: None,
            client_tools: Arc::new(client_tools),
        }
    }

    /// The run's task. Not an async fn: an async fn's future holds its
    /// by-value arguments twice (as passed, and as bound in its body), and
    /// the actor is almost 2 KB; an async block captures it once.
    pub(crate) fn run(mut self) -> impl std::future::Future<Output = ()> + Send {
        let span = crate::otel::invoke_agent(
            &self.run_id,
            &self.principal.tenant,
            &self.session,
            &self.agent.config.id,
        );
        let work = async move {
            let end = match self.drive().await {
                Ok(()) => Ok(()),
                // Boxed, as the rare path it is (see `inner_loop`).
                Err(exit) => Box::pin(self.end_early(exit)).await,
            };
            match end {
                Ok(()) | Err(Exit::Detached) => {}
                Err(Exit::Store(e)) if self.shared.coord.is_shared() => {
                    tracing::error!(run = %self.run_id, error = %e, "run stopped: the store failed; the node that claims it once its lease expires resumes it");
                }
                Err(Exit::Store(e)) => {
                    tracing::error!(run = %self.run_id, error = %e, "run stopped: the store failed; it resumes on restart");
                }
                Err(e) => {
                    tracing::error!(run = %self.run_id, error = ?e, "run could not be finished cleanly");
                }
            }
            // A run that stopped between two writes (lease lost, store
            // failed) may still have one under way: it lands, or fails,
            // before another actor of this node can take the run up.
            if let Err(exit) = self.written_behind().await {
                tracing::debug!(run = %self.run_id, ?exit, "the last commit under way failed");
            }
            self.shared.actor_finished(&self.run_id);
        };
        tracing::Instrument::instrument(work, span)
    }

    /// Puts back loop detection's records, which the store keeps beside
    /// the run's state, and the outcome counters counted from them. One
    /// that does not read back (a damaged store) is reported and the run
    /// goes on without them: the count of calls, and so the breaker on
    /// it, is in the state itself.
    async fn load_call_records(&mut self) -> Result<(), Exit> {
        let wanted = self.state.calls.records_to_restore();
        let stored = self.shared.store.call_records(&self.run_id, wanted).await?;
        // A failed restore leaves the history as loaded: counters only.
        if let Err(e) = self.state.calls.restore(stored) {
            tracing::warn!(run = %self.run_id, error = %e, "loop detection resumes without the run's earlier calls");
        }
        Ok(())
    }

    /// Records why the loop stopped early: cancelled, failed or out of
    /// budget. Other exits leave the run as stored.
    async fn end_early(&mut self, exit: Exit) -> Result<(), Exit> {
        match exit {
            Exit::Cancelled => self.finish_cancelled().await,
            Exit::Failed(err) => self.finish_failed(err).await,
            Exit::Budget(which) => match self.finish_budget(which).await {
                Err(Exit::Cancelled) => self.finish_cancelled().await,
                Err(Exit::Failed(err)) => self.finish_failed(err).await,
                other => other,
            },
            other => Err(other),
        }
    }

    async fn drive(&mut self) -> Result<(), Exit> {
        self.history = shared_messages(self.shared.store.history(&self.run_id).await?);
        if self.state.calls.awaits_records() {
            self.load_call_records().await?;
        }
        let mut ready = None;
        match self.status {
            RunStatus::Queued => {
                self.status = RunStatus::Running;
                let started = EventKind::RunStarted {
                    input: self.input.clone(),
                    session: self.session.clone(),
                    agent: self.agent.config.id.clone(),
                    metadata: self.metadata.clone(),
                };
                let input = Message::user(self.input.clone());
                self.state.course.goals = vec![self.input.clone()];
                self.commit_status(vec![started], vec![input], RunStatus::Running, None)
                    .await?;
            }
            RunStatus::Running => ready = Box::pin(self.recover()).await?,
            _ => {}
        }
        ready = match (ready, self.state.canned_answer.take()) {
            (Some(answer), _) => Some(answer),
            (None, Some(text)) => Some(Answer {
                text,
                reason: CompletionReason::Answered,
            }),
            (None, None)
                if self.agent.config.routing == keel_config::Routing::PreRoute
                    && !self.state.course.routed
                    && self.steps == 0 =>
            {
                Box::pin(self.pre_route()).await?
            }
            (None, None) => None,
        };
        // The dual loop. Inner: model turns, and the tool calls they
        // propose, until the model answers. Outer: the follow-ups queued
        // meanwhile, each answered by the same run.
        loop {
            let answer = match ready.take() {
                Some(answer) => answer,
                None => self.inner_loop().await?,
            };
            if !self.conclude(answer).await? {
                return Ok(());
            }
        }
    }

    /// Model turns (and waits for people or clients) until an answer.
    async fn inner_loop(&mut self) -> Result<Answer, Exit> {
        loop {
            let waits = !self.state.client_waiting.is_empty()
                || self.state.awaiting_approval.is_some()
                || self.state.waiting.is_some();
            // A wait is boxed: it is rare, and inline it would size every
            // run's task for its deepest path.
            let flow = if waits {
                Box::pin(self.wait_and_resume()).await?
            } else {
                self.step().await?
            };
            if let Flow::Answered(answer) = flow {
                return Ok(answer);
            }
        }
    }

    /// Waits for the client's tool outputs, an approval or the user's
    /// answer, whichever the run is waiting for, and goes on with it.
    async fn wait_and_resume(&mut self) -> Result<Flow, Exit> {
        if !self.state.client_waiting.is_empty() {
            let outputs = self.wait_for_tool_outputs().await?;
            self.resolve_tool_outputs(outputs).await
        } else if let Some(a) = self.state.awaiting_approval.clone() {
            let record = self.wait_for_approval(&a).await?;
            self.resolve_approval(a, record).await
        } else {
            match self.wait_for_input().await? {
                Waited::Reply(reply) => self.resolve_input(reply).await,
                Waited::Restore(id) => self.restore_while_waiting(&id).await,
            }
        }
    }

    /// The answer is final. The next queued follow-up starts (true), or
    /// the run completes (false).
    pub(super) async fn conclude(&mut self, answer: Answer) -> Result<bool, Exit> {
        self.drain_commands();
        let message = Message::Assistant {
            content: answer.text.clone(),
            tool_calls: Vec::new(),
        };
        if let Some(next) = self.state.follow_ups.pop_front() {
            self.state.course.goals.push(next.clone());
            let mut events = self.deliver(Outgoing::Answer(answer.text.clone())).await;
            events.insert(
                0,
                EventKind::Final {
                    answer: answer.text,
                },
            );
            events.push(EventKind::FollowUpStarted { text: next.clone() });
            self.commit(events, vec![message, Message::user(next)])
                .await?;
            return Ok(true);
        }
        // Sent before the run completes, so the attempts are events of the
        // run itself; a failed delivery does not change how the run ended.
        let mut events = self.deliver(Outgoing::Answer(answer.text.clone())).await;
        events.insert(
            0,
            EventKind::Final {
                answer: answer.text.clone(),
            },
        );
        events.push(EventKind::RunCompleted {
            reason: answer.reason,
            usage: self.usage,
        });
        self.status = RunStatus::Completed;
        let patch = RunPatch {
            status: Some(RunStatus::Completed),
            output: Some(answer.text),
            pending: Some(None),
            ..RunPatch::default()
        };
        self.commit_patch(events, vec![message], patch).await?;
        Ok(false)
    }

    /// The tool set this step works on: taken once, passed down.
    fn snapshot(&self) -> ToolSnapshot {
        ToolSnapshot {
            server: self.shared.tools(),
            client: self.client_tools.clone(),
        }
    }

    /// The run as the guard pipeline sees it.
    fn view<'a>(&'a self, stated: &'a keel_protocol::Understanding) -> RunView<'a> {
        RunView {
            principal: &self.principal,
            agent: &self.agent.config,
            guards: &self.shared.guards,
            state: &self.state,
            usage: self.usage,
            run_id: &self.run_id,
            stated,
            history: &self.history,
        }
    }

    /// Applies queued steering and follow-up commands without waiting.
    fn drain_commands(&mut self) {
        while let Ok(cmd) = self.commands.try_recv() {
            self.accept(cmd);
        }
    }

    fn accept(&mut self, cmd: Command) {
        match cmd {
            Command::Steer(t) => self.steers.push_back(t),
            Command::FollowUp(t) => self.state.follow_ups.push_back(t),
            Command::Restore(id) => self.pending_restore = Some(id),
            // Input is only forwarded while waiting; an early one is dropped by the runtime.
            Command::Input(_) | Command::ApprovalDecided | Command::ToolOutputs(_) => {}
        }
    }

    async fn wait_for_input(&mut self) -> Result<Waited, Exit> {
        let since = Instant::now();
        let reply = loop {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(Exit::Cancelled),
                cmd = self.commands.recv() => match cmd {
                    Some(Command::Input(text)) => break Waited::Reply(text),
                    Some(Command::Restore(id)) => break Waited::Restore(id),
                    Some(other) => self.accept(other),
                    None => return Err(Exit::Detached),
                },
            }
        };
        let waited = since.elapsed();
        self.state.waited_s += waited.as_secs_f64();
        self.started += waited;
        Ok(reply)
    }

    /// Abandons the pending question and returns the run to a checkpoint.
    async fn restore_while_waiting(&mut self, id: &str) -> Result<Flow, Exit> {
        if let Some(w) = self.state.waiting.take() {
            let result = synthetic_result(
                &w.call(),
                "not executed: the run was restored to a checkpoint",
            );
            self.commit_status(Vec::new(), vec![result], RunStatus::Running, None)
                .await?;
        }
        self.restore(id, "a restore request").await?;
        Ok(Flow::Continue)
    }

    /// Commits events and messages with the loop's current counters and state.
    // The commit family returns its future boxed. Commits are awaited from
    // nearly every step of the loop, and an awaited async fn is laid out
    // inside its caller's future: inline, each commit's arguments and its
    // `Commit` would be copied into every caller's state, and a run's task
    // would be sized by its deepest such chain (13 KB at rest per run, all
    // of it resident at 2,000 concurrent runs). Boxed, a commit costs one
    // allocation while it is written.
    fn commit(&mut self, events: Vec<EventKind>, messages: Vec<Message>) -> Committing<'_> {
        self.commit_with(events, messages, RunPatch::default(), Vec::new())
    }

    fn commit_status(
        &mut self,
        events: Vec<EventKind>,
        messages: Vec<Message>,
        status: RunStatus,
        pending: Option<keel_protocol::Pending>,
    ) -> Committing<'_> {
        self.status = status;
        let patch = RunPatch {
            status: Some(status),
            pending: Some(pending),
            ..RunPatch::default()
        };
        self.commit_with(events, messages, patch, Vec::new())
    }

    fn commit_patch(
        &mut self,
        events: Vec<EventKind>,
        messages: Vec<Message>,
        patch: RunPatch,
    ) -> Committing<'_> {
        self.commit_with(events, messages, patch, Vec::new())
    }

    fn commit_with(
        &mut self,
        events: Vec<EventKind>,
        messages: Vec<Message>,
        patch: RunPatch,
        approvals: Vec<keel_protocol::ApprovalRecord>,
    ) -> Committing<'_> {
        Box::pin(self.store_commit(events, messages, patch, approvals))
    }

    /// The one place a run writes: held-back work first, then this change,
    /// with the loop's counters and state, in one transaction; events are
    /// published only once stored.
    async fn store_commit(
        &mut self,
        events: Vec<EventKind>,
        messages: Vec<Message>,
        patch: RunPatch,
        approvals: Vec<keel_protocol::ApprovalRecord>,
    ) -> Result<(), Exit> {
        let (commit, state) = self.prepare_commit(events, messages, patch, approvals)?;
        let published = self.write(commit).await?;
        if let Some(state) = state {
            self.written_state = state;
        }
        publish(&self.shared, &self.agent.config.id, published);
        Ok(())
    }

    /// Like `commit`, but the run goes on while the commit is written: the
    /// next model call need not wait for the store. Only for a turn whose
    /// every part is in this one commit (plan, decision, call and result of
    /// an idempotent call): until it is stored, a node that dies redoes the
    /// turn from the model's question, as it would have before the commit
    /// began. A turn made while an earlier one is still being written waits
    /// behind it, merged with the others waiting, as long as at most
    /// [`behind::MAX_UNSTORED_TURNS`] are unstored; past that the run waits
    /// for the store. A node that dies loses those turns, which the resumed
    /// run makes again.
    /// Events are published once stored, and every other write waits for
    /// these, so the run's commits keep their order and a failure (a lost
    /// lease) stops the run at its next write. A stalled node's next tool
    /// call is still checked against its lease (`hold_lease`).
    async fn commit_behind(
        &mut self,
        events: Vec<EventKind>,
        messages: Vec<Message>,
    ) -> Result<(), Exit> {
        self.check_behind().await?;
        let (commit, state) =
            self.prepare_commit(events, messages, RunPatch::default(), Vec::new())?;
        if let Some(state) = state {
            self.written_state = state;
        }
        let commit = match &self.writing {
            Some(writing) => match writing.queue(commit) {
                None => return Ok(()),
                Some(commit) => commit,
            },
            None => commit,
        };
        self.written_behind().await?;
        self.writing = Some(behind::Behind::start(
            self.shared.clone(),
            self.run_id.clone(),
            self.agent.config.id.clone(),
            commit,
        ));
        // The write starts now, not whenever the run next waits: on a busy
        // worker, the new task would otherwise queue behind the model call's
        // own tasks, and its round trip to the store would overlap nothing.
        tokio::task::yield_now().await;
        Ok(())
    }

    /// What a commit writes: the held-back work, then this change, with the
    /// loop's counters, and the loop state when it changed (returned, to be
    /// remembered as written once it is).
    fn prepare_commit(
        &mut self,
        mut events: Vec<EventKind>,
        mut messages: Vec<Message>,
        mut patch: RunPatch,
        mut approvals: Vec<keel_protocol::ApprovalRecord>,
    ) -> Result<(Commit, Option<String>), Exit> {
        self.scrub_events(&mut events);
        self.scrub_messages(&mut messages);
        self.scrub_patch(&mut patch);
        self.scrub_approvals(&mut approvals);
        patch.steps = Some(self.steps);
        patch.usage = Some(self.usage);
        // Between two commits the state grows by a few counters at most,
        // so the last one's length sizes the buffer: the text is written
        // without the buffer growing, and being copied, on the way.
        let capacity = self.written_state.len() + STATE_SLACK;
        let serialize = |state: &LoopState| {
            let failed = |e: &dyn std::fmt::Display| {
                StoreError::Backend(format!("serializing the loop state: {e}"))
            };
            let mut text = Vec::with_capacity(capacity);
            serde_json::to_writer(&mut text, state).map_err(|e| failed(&e))?;
            String::from_utf8(text).map_err(|e| failed(&e))
        };
        let mut state = serialize(&self.state)?;
        if self.scrub_state(&state) {
            state = serialize(&self.state)?;
        }
        let changed = (state != self.written_state).then_some(state);
        if let Some(state) = &changed {
            patch.state = Some(state.clone());
        }
        self.history.extend(messages.iter().cloned().map(Arc::new));
        let (mut all_events, mut all_messages) = std::mem::take(&mut self.held);
        all_events.extend(events);
        all_messages.extend(messages);
        let commit = Commit {
            events: all_events,
            messages: all_messages,
            patch: Some(patch),
            approvals,
            // With the state that counts them, in the same transaction.
            calls: self.state.calls.take_unstored(),
        };
        Ok((commit, changed))
    }

    /// Stores a commit through the coordination, after the one still being
    /// written, if any: a node that lost the run writes nothing, and its
    /// actor stops.
    async fn write(&mut self, commit: Commit) -> Result<Vec<keel_protocol::Event>, Exit> {
        self.written_behind().await?;
        self.shared
            .coord
            .commit(&self.run_id, commit)
            .await
            .map_err(|e| self.write_failed(e))
    }

    /// Commits written behind the run that have already failed stop the
    /// run now, before its next model or tool call; ones still being
    /// written are not waited for.
    async fn check_behind(&mut self) -> Result<(), Exit> {
        if self
            .writing
            .as_ref()
            .is_some_and(behind::Behind::is_finished)
        {
            self.written_behind().await?;
        }
        Ok(())
    }

    /// Waits for the commits being written behind the run, if any.
    async fn written_behind(&mut self) -> Result<(), Exit> {
        let Some(writing) = self.writing.take() else {
            return Ok(());
        };
        writing.written().await.map_err(|e| self.write_failed(e))
    }

    fn write_failed(&self, e: StoreError) -> Exit {
        match e {
            StoreError::LeaseLost(why) => {
                tracing::warn!(run = %self.run_id, %why, "run taken over by another node; this actor stops");
                Exit::Detached
            }
            e => e.into(),
        }
    }

    /// Before a side effect outside the store (a tool call): on a node that
    /// shares the store, makes sure this node still holds the run. A commit
    /// that just succeeded does not prove it: the node may have been paused
    /// or cut off since, and another node may have taken the run over. When
    /// the lease as last renewed has less than a third left (renewals run
    /// every third, so only a stalled node gets here), the store is asked;
    /// a run that is no longer ours stops here, having started nothing.
    pub(super) async fn hold_lease(&self) -> Result<(), Exit> {
        let coord = &self.shared.coord;
        if !coord.is_shared() {
            return Ok(());
        }
        let lease = coord.lease();
        if self.lease.remaining() > lease / 3 {
            return Ok(());
        }
        let sent = std::time::Instant::now();
        let kept = coord.renew(std::slice::from_ref(&self.run_id)).await?;
        if kept.contains(&self.run_id) {
            self.lease.renewed(sent, lease);
            return Ok(());
        }
        tracing::warn!(
            run = %self.run_id,
            node = coord.node_id(),
            "this node lost the run's lease while it was stalled; its next tool call is not started and the actor stops"
        );
        Err(Exit::Detached)
    }

    /// Streamed text: events only. Deltas change neither the run's record
    /// nor its loop state, so nothing but the events is written, unless
    /// held-back work must go first.
    fn commit_events(&mut self, events: Vec<EventKind>) -> Committing<'_> {
        Box::pin(self.store_events(events))
    }

    async fn store_events(&mut self, mut events: Vec<EventKind>) -> Result<(), Exit> {
        if !self.held.0.is_empty() || !self.held.1.is_empty() {
            return self.commit(events, Vec::new()).await;
        }
        self.scrub_events(&mut events);
        let commit = Commit {
            events,
            messages: Vec::new(),
            patch: None,
            approvals: Vec::new(),
            calls: Vec::new(),
        };
        let published = self.write(commit).await?;
        self.shared.bus.publish(published);
        Ok(())
    }

    /// Holds events and messages back until the next commit, which always
    /// follows before the run waits or calls the model again. Saves a
    /// transaction per tool turn; a crash in between loses only the model's
    /// latest answer, which the resumed run asks for again.
    fn hold(&mut self, mut events: Vec<EventKind>, mut messages: Vec<Message>) {
        self.scrub_events(&mut events);
        self.scrub_messages(&mut messages);
        self.history.extend(messages.iter().cloned().map(Arc::new));
        self.held.0.extend(events);
        self.held.1.extend(messages);
    }

    /// Nothing of the current model turn is stored yet: its plan is still
    /// held. A crash now redoes the whole turn from the model's question, so
    /// an idempotent call made now needs no record that it started; its
    /// decision, call and result join the plan in the turn's first commit.
    /// Once the plan is stored, each later call of the turn is recorded as
    /// started before it runs, as a non-idempotent call always is: a node
    /// killed while it runs resumes the turn with that call on record.
    fn turn_is_held(&self) -> bool {
        !self.held.0.is_empty()
    }

    /// Tool calls of the last assistant turn that have no result yet.
    fn unanswered_calls(&self) -> Vec<ToolCall> {
        unanswered(&self.history)
    }

    fn deadline(&self) -> Instant {
        self.started + Duration::from_secs(self.agent.config.limits.max_wall_time_s.max(1))
    }
}

/// Stored events go out: metrics, traces, then the run's followers.
fn publish(shared: &Shared, agent_id: &str, published: Vec<keel_protocol::Event>) {
    crate::telemetry::record(agent_id, &published);
    for e in &published {
        crate::otel::guard_event(&e.kind);
        if e.is_terminal() {
            crate::otel::record_end(&tracing::Span::current(), &e.kind);
        }
    }
    shared.bus.publish(published);
}

/// Calls of the last assistant message with tool calls that no tool message answers.
pub(crate) fn unanswered(history: &[Arc<Message>]) -> Vec<ToolCall> {
    let Some(pos) = history.iter().rposition(
        |m| matches!(&**m, Message::Assistant { tool_calls, .. } if !tool_calls.is_empty()),
    ) else {
        return Vec::new();
    };
    let Message::Assistant { tool_calls, .. } = &*history[pos] else {
        return Vec::new();
    };
    let answered: std::collections::HashSet<&str> = history[pos + 1..]
        .iter()
        .filter_map(|m| match &**m {
            Message::Tool { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    tool_calls
        .iter()
        .filter(|c| !answered.contains(c.id.as_str()))
        .cloned()
        .collect()
}

/// A synthesized error result for a call that did not run.
pub(crate) fn synthetic_result(call: &ToolCall, text: impl Into<String>) -> Message {
    Message::Tool {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content: text.into(),
        is_error: true,
    }
}
