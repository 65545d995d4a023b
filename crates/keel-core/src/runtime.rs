//! The runtime: creates runs, owns one actor task per live run, routes
//! commands to it, and resumes unfinished runs after a restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use keel_protocol::{
    ApprovalRecord, ApprovalStatus, Event, Message, NewRun, Principal, RunFilter, RunPage,
    RunRecord, RunStatus, Store, ToolSpec,
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
}

/// Settings of the runtime as a whole.
#[derive(Clone)]
pub struct RuntimeOptions {
    /// Roles allowed to decide approvals; empty = any principal of the tenant.
    pub approver_roles: Vec<String>,
    /// Undecided approvals expire (a denial) after this long.
    pub approval_timeout: std::time::Duration,
    pub guards: crate::guards::Guards,
}

struct Handle {
    commands: mpsc::UnboundedSender<Command>,
    cancel: CancellationToken,
    cancelled_by: Arc<Mutex<Option<String>>>,
}

pub(crate) struct Shared {
    pub store: Arc<dyn Store>,
    pub bus: EventBus,
    pub tools: Arc<ToolSet>,
    pub options: RuntimeOptions,
    pub guards: crate::guards::Guards,
    agents: HashMap<String, AgentRuntime>,
    default_agent: String,
    active: Mutex<HashMap<String, Handle>>,
}

impl Shared {
    pub(crate) fn actor_finished(&self, run_id: &str) {
        self.lock_active().remove(run_id);
    }

    fn lock_active(&self) -> std::sync::MutexGuard<'_, HashMap<String, Handle>> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
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
}

#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
}

impl Runtime {
    /// `default_agent` must name one of `agents`.
    pub fn new(
        store: Arc<dyn Store>,
        tools: ToolSet,
        agents: Vec<AgentRuntime>,
        default_agent: &str,
        options: RuntimeOptions,
    ) -> Result<Self, CoreError> {
        let agents: HashMap<String, AgentRuntime> = agents
            .into_iter()
            .map(|a| (a.config.id.clone(), a))
            .collect();
        if !agents.contains_key(default_agent) {
            return Err(CoreError::Config(format!(
                "default agent `{default_agent}` is not configured"
            )));
        }
        Ok(Self {
            shared: Arc::new(Shared {
                store,
                bus: EventBus::new(),
                tools: Arc::new(tools),
                guards: options.guards.clone(),
                options,
                agents,
                default_agent: default_agent.to_owned(),
                active: Mutex::new(HashMap::new()),
            }),
        })
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    pub fn tools(&self) -> &ToolSet {
        &self.shared.tools
    }

    pub fn agent_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.shared.agents.keys().cloned().collect();
        ids.sort();
        ids
    }

    pub fn default_agent(&self) -> &str {
        &self.shared.default_agent
    }

    pub async fn start_run(
        &self,
        principal: &Principal,
        req: StartRun,
    ) -> Result<RunRecord, CoreError> {
        if req.input.trim().is_empty() {
            return Err(CoreError::BadRequest("input: must not be empty".into()));
        }
        if req.input.len() > MAX_INPUT_BYTES {
            return Err(CoreError::BadRequest(format!(
                "input: {} bytes exceeds the {MAX_INPUT_BYTES}-byte limit",
                req.input.len()
            )));
        }
        let agent_id = req
            .agent
            .unwrap_or_else(|| self.shared.default_agent.clone());
        let Some(agent) = self.shared.agents.get(&agent_id).cloned() else {
            return Err(CoreError::BadRequest(format!(
                "agent: no agent named `{agent_id}` (known: {})",
                self.agent_ids().join(", ")
            )));
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
        let (record, created) = self.shared.store.create_run(new).await?;
        if created {
            self.spawn(record.clone(), agent);
        }
        Ok(record)
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

    /// Answers a pending clarification.
    pub async fn input(&self, tenant: &str, id: &str, text: String) -> Result<(), CoreError> {
        let run = self.get_run(tenant, id).await?;
        if run.status != RunStatus::WaitingInput {
            return Err(CoreError::Conflict(format!(
                "run {id} is {}, not waiting_input",
                run.status.as_str()
            )));
        }
        self.send(&run, Command::Input(text))
    }

    pub async fn steer(&self, tenant: &str, id: &str, text: String) -> Result<(), CoreError> {
        let run = self.live_run(tenant, id).await?;
        self.send(&run, Command::Steer(text))
    }

    pub async fn follow_up(&self, tenant: &str, id: &str, text: String) -> Result<(), CoreError> {
        let run = self.live_run(tenant, id).await?;
        self.send(&run, Command::FollowUp(text))
    }

    /// Cancels the run: its model stream and running tool are dropped at once.
    pub async fn cancel(&self, tenant: &str, id: &str, by: &str) -> Result<(), CoreError> {
        let run = self.live_run(tenant, id).await?;
        self.ensure_actor(&run)?;
        let active = self.shared.lock_active();
        if let Some(h) = active.get(&run.id) {
            if let Ok(mut b) = h.cancelled_by.lock() {
                b.get_or_insert_with(|| by.to_owned());
            }
            h.cancel.cancel();
        }
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
            let _ = self.send(&run, Command::ApprovalDecided);
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
            .tools
            .visible(&agent.config.tools, principal, &self.shared.guards.policy)
            .map(|t| t.spec.clone())
            .collect())
    }

    /// Restarts an actor for every run that was not finished when the
    /// process stopped. Returns how many were resumed.
    pub async fn resume_unfinished(&self) -> Result<usize, CoreError> {
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

    fn send(&self, run: &RunRecord, cmd: Command) -> Result<(), CoreError> {
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

    fn ensure_actor(&self, run: &RunRecord) -> Result<(), CoreError> {
        if self.shared.lock_active().contains_key(&run.id) {
            return Ok(());
        }
        let agent = self.shared.agents.get(&run.agent).cloned().ok_or_else(|| {
            CoreError::Config(format!(
                "run {} uses agent `{}`, which is no longer configured",
                run.id, run.agent
            ))
        })?;
        self.spawn(run.clone(), agent);
        Ok(())
    }

    fn spawn(&self, record: RunRecord, agent: AgentRuntime) {
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let cancelled_by = Arc::new(Mutex::new(None));
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
                },
            );
        }
        let actor = RunActor::new(ActorInit {
            shared: self.shared.clone(),
            record,
            agent,
            commands: rx,
            cancel,
            cancelled_by,
        });
        tokio::spawn(actor.run());
    }
}
