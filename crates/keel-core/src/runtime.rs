//! The runtime: creates runs, owns one actor task per live run, routes
//! commands to it, and resumes unfinished runs after a restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use keel_protocol::{
    ApprovalRecord, ApprovalStatus, Coordination, Event, Message, NewRun, Principal, RunFilter,
    RunPage, RunRecord, RunStatus, Store, ToolSpec,
};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::actor::{ActorInit, RunActor};
use crate::agent::AgentRuntime;
use crate::bus::EventBus;
use crate::error::CoreError;
use crate::toolset::ToolSet;

/// Largest accepted run input (SPEC §2).
pub const MAX_INPUT_BYTES: usize = 64 * 1024;

#[derive(Debug)]
pub(crate) enum Command {
    Input(String),
    Steer(String),
    FollowUp(String),
    /// An approval of this run was decided; the run re-reads it from the store.
    ApprovalDecided,
    ToolOutputs(Vec<ClientToolOutput>),
    /// Return the run's context to a checkpoint.
    Restore(String),
}

/// Settings of the runtime as a whole.
#[derive(Clone)]
pub struct RuntimeOptions {
    /// Roles allowed to decide approvals; empty = any principal of the tenant.
    pub approver_roles: Vec<String>,
    /// Undecided approvals expire (a denial) after this long.
    pub approval_timeout: std::time::Duration,
    pub guards: crate::guards::Guards,
    /// Where session summaries go on reset; none = summaries are not kept.
    pub memory: Option<crate::session_reset::SharedSessionMemory>,
    /// Messages kept verbatim when the summary cannot be written by the model.
    pub summary_fallback_messages: usize,
    /// Semantic similarity for drift scoring (an embedder); none = lexical.
    pub similarity: Option<Arc<dyn crate::course::Similarity>>,
    /// Sends answers, questions and approval requests back to the chat
    /// channel a run came from; none = runs started from channels are
    /// answered through the API only.
    pub outbound: Option<Arc<dyn crate::outbound::Outbound>>,
    /// Asked before every cleared server-side call runs; none = no one.
    pub admission: Option<Arc<dyn crate::admission::Admission>>,
    /// The secret values no run may store, publish or send on: user
    /// input, tool output and model output are redacted where they enter
    /// (see `redacting_model`, `observe`), and every commit is checked
    /// again. The default redacts nothing.
    pub redactor: keel_protocol::Redactor,
    /// Per-tenant quotas (`[[tenants]]`); empty = no tenant is limited.
    pub quotas: crate::quota::Quotas,
}

struct Handle {
    commands: mpsc::UnboundedSender<Command>,
    cancel: CancellationToken,
    cancelled_by: Arc<Mutex<Option<String>>>,
    lease: Arc<crate::lease::LeaseClock>,
}

pub(crate) struct Shared {
    pub store: Arc<dyn Store>,
    /// Who owns which run when nodes share the store; every actor commit
    /// goes through it.
    pub coord: Arc<dyn Coordination>,
    pub bus: EventBus,
    /// Swapped whole when a tool source changes (MCP `list_changed`); a step
    /// works on the snapshot it took.
    tools: std::sync::RwLock<Arc<ToolSet>>,
    pub options: RuntimeOptions,
    pub guards: crate::guards::Guards,
    agents: HashMap<String, AgentRuntime>,
    default_agent: String,
    active: Mutex<HashMap<String, Handle>>,
}

impl Shared {
    pub(crate) fn tools(&self) -> Arc<ToolSet> {
        self.tools
            .read()
            .map(|t| t.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    pub(crate) fn actor_finished(&self, run_id: &str) {
        self.lock_active().remove(run_id);
    }

    fn lock_active(&self) -> std::sync::MutexGuard<'_, HashMap<String, Handle>> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs with an actor in this process.
    pub(crate) fn active_ids(&self) -> Vec<String> {
        self.lock_active().keys().cloned().collect()
    }

    /// A lease renewal sent at `sent` kept these runs.
    pub(crate) fn leases_renewed(&self, kept: &[String], sent: std::time::Instant) {
        let lease = self.coord.lease();
        let active = self.lock_active();
        for id in kept {
            if let Some(h) = active.get(id) {
                h.lease.renewed(sent, lease);
            }
        }
    }

    pub(crate) fn has_actor(&self, run_id: &str) -> bool {
        self.lock_active().contains_key(run_id)
    }

    /// Hands a command to the run's actor in this process; gives it back
    /// when there is none.
    pub(crate) fn deliver_local(&self, run_id: &str, cmd: Command) -> Result<(), Command> {
        match self.lock_active().get(run_id) {
            Some(h) => h.commands.send(cmd).map_err(|e| e.0),
            None => Err(cmd),
        }
    }

    /// Cancels the run's actor in this process; false when there is none.
    /// `by` is recorded only if nobody cancelled it first.
    pub(crate) fn cancel_local(&self, run_id: &str, by: Option<&str>) -> bool {
        let active = self.lock_active();
        let Some(h) = active.get(run_id) else {
            return false;
        };
        if let Some(by) = by
            && let Ok(mut b) = h.cancelled_by.lock()
        {
            b.get_or_insert_with(|| by.to_owned());
        }
        h.cancel.cancel();
        true
    }
}

/// A request to start a run.
#[derive(Debug, Clone, Default)]
pub struct StartRun {
    pub input: String,
    pub session: Option<String>,
    pub agent: Option<String>,
    pub idempotency_key: Option<String>,
    pub metadata: Value,
    /// Functions the caller executes itself (Responses API): when the model
    /// calls one, the run pauses and hands the call back to the client.
    pub client_tools: Vec<keel_protocol::ToolSchema>,
}

/// The client's result for one call of a client tool.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClientToolOutput {
    pub call_id: String,
    pub output: String,
}

#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
}

impl Runtime {
    /// `default_agent` must name one of `agents`. The runtime is the only
    /// node: it owns every run of `store`.
    pub fn new(
        store: Arc<dyn Store>,
        tools: ToolSet,
        agents: Vec<AgentRuntime>,
        default_agent: &str,
        options: RuntimeOptions,
    ) -> Result<Self, CoreError> {
        let coord = Arc::new(keel_protocol::SingleNode::new(store.clone()));
        Self::with_coordination(store, coord, tools, agents, default_agent, options)
    }

    /// A runtime that is one node among several sharing `store` (SPEC §10):
    /// it runs only the runs it holds a lease on, and in the background
    /// renews its leases, takes over runs of dead nodes, and relays events
    /// and commands between nodes. Must be called inside a Tokio runtime.
    pub fn with_coordination(
        store: Arc<dyn Store>,
        coord: Arc<dyn Coordination>,
        tools: ToolSet,
        agents: Vec<AgentRuntime>,
        default_agent: &str,
        options: RuntimeOptions,
    ) -> Result<Self, CoreError> {
        let agents: HashMap<String, AgentRuntime> = agents
            .into_iter()
            .map(|mut a| {
                a.model = crate::redacting_model::RedactingModel::wrap(a.model, &options.redactor);
                (a.config.id.clone(), a)
            })
            .collect();
        if !agents.contains_key(default_agent) {
            return Err(CoreError::Config(format!(
                "default agent `{default_agent}` is not configured"
            )));
        }
        let runtime = Self {
            shared: Arc::new(Shared {
                store,
                coord,
                bus: EventBus::new(),
                tools: std::sync::RwLock::new(Arc::new(tools)),
                guards: options.guards.clone(),
                options,
                agents,
                default_agent: default_agent.to_owned(),
                active: Mutex::new(HashMap::new()),
            }),
        };
        if runtime.shared.coord.is_shared() {
            crate::cluster::start(&runtime.shared);
        }
        Ok(runtime)
    }

    pub(crate) fn from_shared(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// This node's id among the nodes sharing the store.
    pub fn node_id(&self) -> &str {
        self.shared.coord.node_id()
    }

    /// Runs this node owns: its live leases when nodes share the store,
    /// else the runs with an actor here.
    pub async fn owned_runs(&self) -> Result<u64, CoreError> {
        if self.shared.coord.is_shared() {
            Ok(self.shared.coord.owned_count().await?)
        } else {
            Ok(self.active_runs() as u64)
        }
    }

    /// Gives up this node's runs so that other nodes take them over at
    /// once rather than after the lease (graceful shutdown).
    pub async fn release_runs(&self) -> Result<(), CoreError> {
        Ok(self.shared.coord.release_all().await?)
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    pub fn tools(&self) -> Arc<ToolSet> {
        self.shared.tools()
    }

    /// Replaces the tool set (e.g. after an MCP server's tool list changed).
    /// Runs pick it up at their next step.
    pub fn replace_tools(&self, tools: ToolSet) {
        let mut slot = self.shared.tools.write().unwrap_or_else(|p| p.into_inner());
        *slot = Arc::new(tools);
    }

    pub fn agent_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.shared.agents.keys().cloned().collect();
        ids.sort();
        ids
    }

    pub fn default_agent(&self) -> &str {
        &self.shared.default_agent
    }

    pub fn agent(&self, id: &str) -> Option<AgentRuntime> {
        self.shared.agents.get(id).cloned()
    }

    pub fn options(&self) -> &RuntimeOptions {
        &self.shared.options
    }

    pub(crate) fn session_memory(&self) -> Option<crate::session_reset::SharedSessionMemory> {
        self.shared.options.memory.clone()
    }

    pub async fn start_run(
        &self,
        principal: &Principal,
        req: StartRun,
    ) -> Result<RunRecord, CoreError> {
        Ok(self.start(principal, req, false).await?.0)
    }

    /// [`Runtime::start_run`], with the run's events from its first, as
    /// [`crate::follow::follow`] gives them: of the run this call started,
    /// or of the run an idempotency key found.
    pub async fn start_run_followed(
        &self,
        principal: &Principal,
        req: StartRun,
    ) -> Result<(RunRecord, mpsc::Receiver<Arc<Event>>), CoreError> {
        let (record, live) = self.start(principal, req, true).await?;
        let events = crate::follow::follow_started(self.clone(), record.id.clone(), live);
        Ok((record, events))
    }

    /// Starts a run; with `follow`, the run's live events when this call
    /// started its actor, subscribed to before the actor could publish any.
    async fn start(
        &self,
        principal: &Principal,
        mut req: StartRun,
        follow: bool,
    ) -> Result<(RunRecord, Option<broadcast::Receiver<Arc<Event>>>), CoreError> {
        if req.input.trim().is_empty() {
            return Err(CoreError::BadRequest("input: must not be empty".into()));
        }
        if req.input.len() > MAX_INPUT_BYTES {
            return Err(CoreError::BadRequest(format!(
                "input: {} bytes exceeds the {MAX_INPUT_BYTES}-byte limit",
                req.input.len()
            )));
        }
        // Checked as the caller sent it, redacted before anything is
        // stored: the run record keeps its input and metadata, and every
        // event and message derives from them.
        self.redact(&mut req.input);
        self.shared.options.redactor.redact_json(&mut req.metadata);
        let agent_id = req
            .agent
            .unwrap_or_else(|| self.shared.default_agent.clone());
        let Some(agent) = self.shared.agents.get(&agent_id).cloned() else {
            return Err(CoreError::BadRequest(format!(
                "agent: no agent named `{agent_id}` (known: {})",
                self.agent_ids().join(", ")
            )));
        };
        let reset = match (
            &req.session,
            crate::session_reset::is_reset_command(&req.input),
        ) {
            (Some(session), true) => match self
                .reset_session(principal, session, Some(&agent_id))
                .await
            {
                Ok(r) => Some(format!(
                    "Started a new session. The previous conversation ({} messages) was archived as {} and its summary saved to memory{}.",
                    r.messages,
                    r.archived_as,
                    r.memory_id.map(|id| format!(" ({id})")).unwrap_or_default()
                )),
                Err(CoreError::NotFound) => Some("Started a new session.".to_owned()),
                Err(e) => return Err(e),
            },
            (None, true) => Some("Started a new session.".to_owned()),
            _ => None,
        };
        let new = NewRun {
            id: keel_protocol::new_id("run"),
            principal: principal.clone(),
            session: req.session.unwrap_or_else(|| keel_protocol::new_id("ses")),
            agent: agent_id,
            input: req.input,
            idempotency_key: req.idempotency_key,
            metadata: req.metadata,
        };
        let client_tools = req.client_tools;
        for t in &client_tools {
            if self.shared.tools().get(&t.name).is_some() || t.name == crate::clarify::CLARIFY_TOOL
            {
                return Err(CoreError::BadRequest(format!(
                    "tools: `{}` is already a server-side tool; client tools need their own names",
                    t.name
                )));
            }
        }
        // Compiled once here so that a schema that cannot work is a clear
        // error before the run starts, never a surprise mid-run.
        crate::pipeline::client_tools(&client_tools).map_err(|e| match e {
            CoreError::Config(m) => CoreError::BadRequest(format!("tools: {m}")),
            other => other,
        })?;
        let tenant = new.principal.tenant.clone();
        let run_id = new.id.clone();
        let store = self.shared.store.as_ref();
        let admitted = crate::quota::admit(&self.shared.options.quotas, store, &tenant, &run_id)
            .await?
            .map_err(CoreError::Quota)?;
        let (record, created) = match store.create_run(new).await {
            Ok((record, true)) => (record, true),
            Ok((record, false)) => {
                crate::quota::give_back(store, &run_id, admitted).await?;
                (record, false)
            }
            Err(e) => {
                if let Err(back) = crate::quota::give_back(store, &run_id, admitted).await {
                    tracing::warn!(run = %run_id, error = %back, "quota taken for a run not created was not given back");
                }
                return Err(e.into());
            }
        };
        let mut live = None;
        if created {
            // Persisted with the run's first commit (run_started). Handed
            // to the actor as it is: the stored run holds no state yet.
            let state = crate::state::LoopState {
                client_tools,
                canned_answer: reset,
                ..Default::default()
            };
            if self.shared.coord.acquire(&record.id).await? {
                live = follow.then(|| self.subscribe(&record.id));
                self.spawn(record.clone(), agent, Some(state));
            }
        }
        Ok((record, live))
    }

    pub async fn get_run(&self, tenant: &str, id: &str) -> Result<RunRecord, CoreError> {
        self.shared
            .store
            .get_run(tenant, id)
            .await?
            .ok_or(CoreError::NotFound)
    }

    pub async fn list_runs(&self, tenant: &str, filter: &RunFilter) -> Result<RunPage, CoreError> {
        Ok(self.shared.store.list_runs(tenant, filter).await?)
    }

    pub async fn session(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Vec<(String, Message)>, CoreError> {
        self.shared
            .store
            .session_messages(tenant, key)
            .await?
            .ok_or(CoreError::NotFound)
    }

    /// `text` with every secret replaced, for text that enters a run.
    fn redact(&self, text: &mut String) {
        self.shared.options.redactor.redact_string(text);
    }

    /// Answers a pending clarification.
    pub async fn input(&self, tenant: &str, id: &str, mut text: String) -> Result<(), CoreError> {
        self.redact(&mut text);
        let run = self.get_run(tenant, id).await?;
        if run.status != RunStatus::WaitingInput {
            return Err(CoreError::Conflict(format!(
                "run {id} is {}, not waiting_input",
                run.status.as_str()
            )));
        }
        if matches!(run.pending, Some(keel_protocol::Pending::ClientTool { .. })) {
            return Err(CoreError::Conflict(format!(
                "run {id} waits for client tool outputs, not for text input"
            )));
        }
        self.send(&run, Command::Input(text)).await
    }

    /// Results of client tool calls the run handed back; the run continues
    /// with them through the same verification as server-side tools.
    pub async fn submit_tool_outputs(
        &self,
        tenant: &str,
        id: &str,
        mut outputs: Vec<ClientToolOutput>,
    ) -> Result<(), CoreError> {
        // Redacted here already: with several nodes the outputs travel
        // through the store's mailbox.
        for o in &mut outputs {
            self.redact(&mut o.output);
        }
        let run = self.get_run(tenant, id).await?;
        let waiting_for_client = run.status == RunStatus::WaitingInput
            && matches!(run.pending, Some(keel_protocol::Pending::ClientTool { .. }));
        if !waiting_for_client {
            return Err(CoreError::Conflict(format!(
                "run {id} is not waiting for client tool outputs ({})",
                run.status.as_str()
            )));
        }
        self.send(&run, Command::ToolOutputs(outputs)).await
    }

    pub async fn steer(&self, tenant: &str, id: &str, mut text: String) -> Result<(), CoreError> {
        self.redact(&mut text);
        let run = self.live_run(tenant, id).await?;
        self.send(&run, Command::Steer(text)).await
    }

    pub async fn follow_up(
        &self,
        tenant: &str,
        id: &str,
        mut text: String,
    ) -> Result<(), CoreError> {
        self.redact(&mut text);
        let run = self.live_run(tenant, id).await?;
        self.send(&run, Command::FollowUp(text)).await
    }

    /// Returns a live run's context to one of its checkpoints (SPEC §4.12).
    /// A run waiting for input drops its question and resumes from the
    /// checkpoint; a running one restores before its next step.
    pub async fn restore(
        &self,
        tenant: &str,
        id: &str,
        checkpoint_id: &str,
    ) -> Result<(), CoreError> {
        let run = self.live_run(tenant, id).await?;
        let state = crate::state::LoopState::from_value(&run.state);
        if !state
            .course
            .checkpoints
            .iter()
            .any(|c| c.id == checkpoint_id)
        {
            let known: Vec<&str> = state
                .course
                .checkpoints
                .iter()
                .map(|c| c.id.as_str())
                .collect();
            return Err(CoreError::BadRequest(format!(
                "checkpoint_id: run {id} has no checkpoint {checkpoint_id:?} (it has: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )));
        }
        let waiting_other = match run.status {
            RunStatus::WaitingApproval => Some("an approval"),
            RunStatus::WaitingInput if !state.client_waiting.is_empty() => {
                Some("client tool outputs")
            }
            _ => None,
        };
        if let Some(what) = waiting_other {
            return Err(CoreError::Conflict(format!(
                "run {id} is waiting for {what}; restore it after that is resolved"
            )));
        }
        self.send(&run, Command::Restore(checkpoint_id.to_owned()))
            .await
    }

    /// Cancels the run: its model stream and running tool are dropped at once.
    pub async fn cancel(&self, tenant: &str, id: &str, by: &str) -> Result<(), CoreError> {
        let run = self.live_run(tenant, id).await?;
        if self.shared.coord.is_shared() {
            if !self.shared.cancel_local(&run.id, Some(by)) {
                crate::cluster::post(
                    &self.shared,
                    &run,
                    crate::cluster::Posted::Cancel(by.to_owned()),
                )
                .await?;
            }
            return Ok(());
        }
        self.ensure_actor(&run)?;
        self.shared.cancel_local(&run.id, Some(by));
        Ok(())
    }

    /// This tenant's approvals, optionally by status.
    pub async fn list_approvals(
        &self,
        tenant: &str,
        status: Option<ApprovalStatus>,
        limit: u32,
    ) -> Result<Vec<ApprovalRecord>, CoreError> {
        Ok(self
            .shared
            .store
            .list_approvals(tenant, status, limit)
            .await?)
    }

    /// Decides an approval. Only approver roles may; another tenant's is not found;
    /// a decided one is a conflict. The waiting run resumes wherever it lives.
    pub async fn decide_approval(
        &self,
        principal: &Principal,
        id: &str,
        approve: bool,
        reason: &str,
    ) -> Result<ApprovalRecord, CoreError> {
        let existing = self
            .shared
            .store
            .get_approval(&principal.tenant, id)
            .await?
            .ok_or(CoreError::NotFound)?;
        let roles = &self.shared.options.approver_roles;
        if !roles.is_empty() && !principal.has_any_role(roles) {
            return Err(CoreError::Forbidden(format!(
                "deciding approvals needs one of the roles {}",
                roles.join(", ")
            )));
        }
        let reason = self.shared.options.redactor.redact(reason);
        let reason = reason.as_ref();
        let decision = if approve {
            ApprovalStatus::Approved
        } else {
            ApprovalStatus::Denied
        };
        let record = self
            .shared
            .store
            .decide_approval(&principal.tenant, id, decision, &principal.id, reason)
            .await
            .map_err(|e| match e {
                keel_protocol::StoreError::Conflict(m) => CoreError::Conflict(m),
                keel_protocol::StoreError::NotFound => CoreError::NotFound,
                other => CoreError::Store(other),
            })?;
        if let Ok(run) = self.get_run(&principal.tenant, &existing.run_id).await
            && !run.status.is_terminal()
        {
            // The run may live in another process; it also polls the store.
            let _ = self.send(&run, Command::ApprovalDecided).await;
        }
        Ok(record)
    }

    /// Live events of a run. Subscribe before reading the stored backlog, so
    /// that nothing falls between the two.
    pub fn subscribe(&self, run_id: &str) -> broadcast::Receiver<Arc<Event>> {
        self.shared.bus.subscribe(run_id)
    }

    pub fn release(&self, run_id: &str) {
        self.shared.bus.release(run_id);
    }

    /// Tools this principal may see for an agent (SPEC §2 `GET /ai/tools`).
    pub fn visible_tools(
        &self,
        principal: &Principal,
        agent: Option<&str>,
    ) -> Result<Vec<ToolSpec>, CoreError> {
        let agent_id = agent.unwrap_or(&self.shared.default_agent);
        let agent =
            self.shared.agents.get(agent_id).ok_or_else(|| {
                CoreError::BadRequest(format!("agent: no agent named `{agent_id}`"))
            })?;
        Ok(self
            .shared
            .tools()
            .visible(&agent.config.tools, principal, &self.shared.guards.policy)
            .map(|t| t.spec.clone())
            .collect())
    }

    /// Whether every call of `tool` needs a person's approval (see
    /// [`keel_guard::policy::Policy::always_asks`]).
    pub fn always_asks(&self, tool: &ToolSpec) -> bool {
        self.shared.guards.policy.always_asks(tool)
    }

    /// Restarts an actor for every run that was not finished when the
    /// process stopped. Returns how many were resumed. With a shared store:
    /// takes over the runs no live node owns, and keeps doing so from then
    /// on (call once).
    pub async fn resume_unfinished(&self) -> Result<usize, CoreError> {
        if self.shared.coord.is_shared() {
            // Runs this node id held before a restart are free at once; the
            // rest is claimed like any other node's.
            self.shared.coord.release_all().await?;
            let taken = crate::cluster::claim_round(&self.shared).await?;
            crate::cluster::start_claiming(&self.shared);
            return Ok(taken);
        }
        let runs = self.shared.store.unfinished_runs().await?;
        let mut n = 0;
        for run in runs {
            if self.ensure_actor(&run).is_ok() {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Number of runs with a live actor in this process.
    pub fn active_runs(&self) -> usize {
        self.shared.lock_active().len()
    }

    async fn live_run(&self, tenant: &str, id: &str) -> Result<RunRecord, CoreError> {
        let run = self.get_run(tenant, id).await?;
        if run.status.is_terminal() {
            return Err(CoreError::Conflict(format!(
                "run {id} has already ended ({})",
                run.status.as_str()
            )));
        }
        Ok(run)
    }

    async fn send(&self, run: &RunRecord, cmd: Command) -> Result<(), CoreError> {
        if self.shared.coord.is_shared() {
            // Runs elsewhere (or nowhere yet): through its mailbox to the owner.
            return match self.shared.deliver_local(&run.id, cmd) {
                Ok(()) => Ok(()),
                Err(cmd) => {
                    crate::cluster::post(&self.shared, run, crate::cluster::Posted::Run(cmd)).await
                }
            };
        }
        self.ensure_actor(run)?;
        let active = self.shared.lock_active();
        match active.get(&run.id) {
            Some(h) => h
                .commands
                .send(cmd)
                .map_err(|_| CoreError::Conflict(format!("run {} has just ended", run.id))),
            None => Err(CoreError::Conflict(format!(
                "run {} has just ended",
                run.id
            ))),
        }
    }

    /// Single node only: with a shared store a run gets an actor only on
    /// the node that holds its lease (see `adopt`).
    fn ensure_actor(&self, run: &RunRecord) -> Result<(), CoreError> {
        if self.shared.coord.is_shared() {
            return Err(CoreError::Conflict(format!(
                "run {} is not owned by this node",
                run.id
            )));
        }
        self.adopt(run)
    }

    /// Starts an actor for a run this node owns, unless one runs already.
    pub(crate) fn adopt(&self, run: &RunRecord) -> Result<(), CoreError> {
        if self.shared.lock_active().contains_key(&run.id) {
            return Ok(());
        }
        let agent = self.shared.agents.get(&run.agent).cloned().ok_or_else(|| {
            CoreError::Config(format!(
                "run {} uses agent `{}`, which is no longer configured",
                run.id, run.agent
            ))
        })?;
        self.spawn(run.clone(), agent, None);
        Ok(())
    }

    /// Starts the actor of `record`. `fresh` is the loop state of a run
    /// created just now; any other run's state is read from its record.
    fn spawn(
        &self,
        record: RunRecord,
        agent: AgentRuntime,
        fresh: Option<crate::state::LoopState>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let cancelled_by = Arc::new(Mutex::new(None));
        // Called right after the run was acquired or claimed.
        let lease = Arc::new(crate::lease::LeaseClock::new(
            std::time::Instant::now(),
            self.shared.coord.lease(),
        ));
        {
            let mut active = self.shared.lock_active();
            if active.contains_key(&record.id) {
                return;
            }
            active.insert(
                record.id.clone(),
                Handle {
                    commands: tx,
                    cancel: cancel.clone(),
                    cancelled_by: cancelled_by.clone(),
                    lease: lease.clone(),
                },
            );
        }
        let actor = RunActor::new(ActorInit {
            shared: self.shared.clone(),
            record,
            fresh,
            agent,
            commands: rx,
            cancel,
            cancelled_by,
            lease,
        });
        tokio::spawn(actor.run());
    }
}
