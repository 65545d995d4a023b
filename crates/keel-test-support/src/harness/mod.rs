//! An in-process keel runtime for tests of the run loop and its guardrails:
//! the real `keel_core::Runtime` over a SQLite store in a temp dir, a
//! [`ScriptedModel`], closure tools, and guards compiled from configuration
//! text exactly as `keel serve` compiles them.
//!
//! Waits poll the store and are bounded: a run that does not get where a
//! test expects fails the test with the run's events, never hangs it.

// Helpers here fail the test by panicking, with a message saying what the
// run did instead; that is how a test helper reports.
#![allow(clippy::panic)]

mod tool;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use keel_config::{AgentConfig, Config, MapEnv};
use keel_core::{AgentRuntime, Guards, Runtime, RuntimeOptions, StartRun, ToolSet};
use keel_guard::hooks::{BeforeToolCall, ConfigHook};
use keel_guard::policy::Policy;
use keel_guard::verify::Verifier;
use keel_protocol::{
    ApprovalRecord, ApprovalStatus, Coordination, Event, Message, Principal, RunRecord, RunStatus,
    SingleNode, Store, Tool,
};
use serde_json::Value;

use crate::scripted::ScriptedModel;

pub use tool::{IntoToolError, IntoToolResult, TestTool, async_tool, tool};

/// The agent every run uses.
pub const AGENT_ID: &str = "default";

/// How long a wait lasts before it fails the test. Generous: it only
/// matters when something is wrong, and test machines can be slow.
const DEFAULT_WAIT: Duration = Duration::from_secs(20);

/// How often waits look at the store.
const POLL: Duration = Duration::from_millis(5);

/// A change to the agent's configuration, applied after the TOML loads.
type AgentEdit = Box<dyn FnOnce(&mut AgentConfig)>;

/// Makes the node's coordination over the test's store.
type CoordinationOf = Box<dyn FnOnce(Arc<dyn Store>) -> Arc<dyn Coordination>>;

/// Builds a [`TestRuntime`].
pub struct TestRuntimeBuilder {
    model: ScriptedModel,
    tools: Vec<TestTool>,
    agent_toml: String,
    config_toml: String,
    agent_edits: Vec<AgentEdit>,
    hooks: Vec<Arc<dyn BeforeToolCall>>,
    principal: Principal,
    wait: Duration,
    coordination: Option<CoordinationOf>,
    secrets: Vec<String>,
}

impl TestRuntimeBuilder {
    pub fn tool(mut self, tool: TestTool) -> Self {
        self.tools.push(tool);
        self
    }

    /// TOML added to the agent's `[[agents]]` table: keys first, then
    /// sub-tables, e.g. `"[agents.limits]\nmax_steps = 3"`. Drift and
    /// reflection are off (they would consume scripted replies) unless
    /// this text has its own `[agents.drift]` table.
    pub fn agent_toml(mut self, toml: &str) -> Self {
        self.agent_toml.push_str(toml);
        self.agent_toml.push('\n');
        self
    }

    /// Top-level configuration TOML: `[policy]`, `[[policy.rules]]`,
    /// `[[hooks]]`, `[verify]`, `[auth]` (for `approver_roles`).
    pub fn config_toml(mut self, toml: &str) -> Self {
        self.config_toml.push_str(toml);
        self.config_toml.push('\n');
        self
    }

    /// Edits the agent's configuration after the TOML is loaded.
    pub fn agent(mut self, edit: impl FnOnce(&mut AgentConfig) + 'static) -> Self {
        self.agent_edits.push(Box::new(edit));
        self
    }

    /// A hook run after the configured ones.
    pub fn hook(mut self, hook: Arc<dyn BeforeToolCall>) -> Self {
        self.hooks.push(hook);
        self
    }

    /// Who starts runs with [`TestRuntime::start`] (default: tenant `acme`,
    /// principal `alice`, no roles).
    pub fn principal(mut self, principal: Principal) -> Self {
        self.principal = principal;
        self
    }

    /// Secret values the runtime redacts, as `keel serve` redacts the
    /// ones it reads from its environment (default: none).
    pub fn redact(mut self, secrets: &[&str]) -> Self {
        self.secrets.extend(secrets.iter().map(|s| (*s).to_owned()));
        self
    }

    /// How long each wait may take before failing the test.
    pub fn wait_timeout(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Runs the runtime as a node with this coordination over the test's
    /// store (default: the single node that owns every run), e.g. one that
    /// loses its leases on cue.
    pub fn coordination(
        mut self,
        coordination: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Coordination> + 'static,
    ) -> Self {
        self.coordination = Some(Box::new(coordination));
        self
    }

    /// The configuration text the agent and guards are loaded from.
    fn config_text(&self) -> String {
        let drift = if self.agent_toml.contains("[agents.drift]") {
            ""
        } else {
            "[agents.drift]\nenabled = false\n"
        };
        format!(
            "[[providers]]\nname = \"scripted\"\nkind = \"openai\"\nmodel = \"scripted\"\n\n\
             [[agents]]\nid = \"{AGENT_ID}\"\nprovider = \"scripted\"\n{agent}{drift}\n{config}",
            agent = self.agent_toml,
            config = self.config_toml,
        )
    }

    /// Builds the runtime; configuration problems are errors.
    pub async fn try_build(self) -> anyhow::Result<TestRuntime> {
        let text = self.config_text();
        // No `KEEL_*` variable of the test process may change the configuration.
        let loaded = keel_config::load_str(&text, "test.toml", &MapEnv::new()).map_err(|e| {
            anyhow!("the test configuration does not load:\n{e}\n--- configuration ---\n{text}")
        })?;
        let config = loaded.config;
        let Some(mut agent) = config.agents.first().cloned() else {
            bail!("the test configuration has no agent");
        };
        for edit in self.agent_edits {
            edit(&mut agent);
        }
        let provider = config.providers.first().cloned();
        let guards = guards(&config, self.hooks)?;
        let dir = tempfile::tempdir().context("creating the store's temp dir")?;
        let url = format!("sqlite://{}", dir.path().join("keel.db").display());
        let store = keel_store::open(&url)
            .await
            .map_err(|e| anyhow!("opening the SQLite store: {e}"))?;
        let mut log = HashMap::new();
        let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
        for t in self.tools {
            if log.insert(t.name().to_owned(), t.clone()).is_some() {
                bail!("two test tools are named `{}`", t.name());
            }
            tools.push(Arc::new(t));
        }
        let tool_set = ToolSet::new(tools).map_err(|e| anyhow!("registering the tools: {e}"))?;
        let options = RuntimeOptions {
            approver_roles: config.auth.approver_roles.clone(),
            approval_timeout: Duration::from_secs(config.policy.approval_timeout_s.max(1)),
            guards,
            memory: None,
            summary_fallback_messages: 20,
            similarity: None,
            outbound: None,
            admission: None,
            redactor: keel_protocol::Redactor::new(&self.secrets)
                .map_err(|e| anyhow!("the test secrets: {e}"))?,
            quotas: keel_core::Quotas::new(&config.tenants),
        };
        let coordination: Arc<dyn Coordination> = match self.coordination {
            Some(make) => make(store.clone()),
            None => Arc::new(SingleNode::new(store.clone())),
        };
        let runtime = Runtime::with_coordination(
            store,
            coordination,
            tool_set,
            vec![AgentRuntime::new(
                agent,
                Arc::new(self.model.clone()),
                provider.as_ref(),
            )],
            AGENT_ID,
            options,
        )
        .map_err(|e| anyhow!("starting the runtime: {e}"))?;
        Ok(TestRuntime {
            runtime,
            model: self.model,
            principal: self.principal,
            tools: log,
            tenants: Mutex::new(HashMap::new()),
            wait: self.wait,
            _dir: dir,
        })
    }

    /// Builds the runtime; a configuration problem fails the test.
    pub async fn build(self) -> TestRuntime {
        match self.try_build().await {
            Ok(rt) => rt,
            Err(e) => panic!("{e:#}"),
        }
    }
}

/// Hooks, policy and verifier from `[[hooks]]`, `[policy]` and `[verify]`,
/// as `keel serve` builds them.
fn guards(config: &Config, extra: Vec<Arc<dyn BeforeToolCall>>) -> anyhow::Result<Guards> {
    let policy = Policy::compile(&config.policy).map_err(|e| anyhow!("policy: {e}"))?;
    let mut hooks: Vec<Arc<dyn BeforeToolCall>> = Vec::new();
    for (i, h) in config.hooks.iter().enumerate() {
        let hook = ConfigHook::compile(h).map_err(|e| anyhow!("hooks[{i}]: {e}"))?;
        hooks.push(Arc::new(hook));
    }
    hooks.extend(extra);
    Ok(Guards {
        policy,
        hooks,
        verifier: Verifier::new(&config.verify),
    })
}

/// A keel runtime in this process, driven by a [`ScriptedModel`].
pub struct TestRuntime {
    runtime: Runtime,
    model: ScriptedModel,
    principal: Principal,
    tools: HashMap<String, TestTool>,
    /// The tenant of each run started here, to read it back.
    tenants: Mutex<HashMap<String, String>>,
    wait: Duration,
    _dir: tempfile::TempDir,
}

impl TestRuntime {
    pub fn builder(model: ScriptedModel) -> TestRuntimeBuilder {
        TestRuntimeBuilder {
            model,
            tools: Vec::new(),
            agent_toml: String::new(),
            config_toml: String::new(),
            agent_edits: Vec::new(),
            hooks: Vec::new(),
            principal: Principal {
                tenant: "acme".into(),
                id: "alice".into(),
                roles: Vec::new(),
            },
            wait: DEFAULT_WAIT,
            coordination: None,
            secrets: Vec::new(),
        }
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    pub fn model(&self) -> &ScriptedModel {
        &self.model
    }

    /// The principal [`TestRuntime::start`] runs as.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// Starts a run as the test's principal; returns its id.
    pub async fn start(&self, input: &str) -> String {
        let principal = self.principal.clone();
        self.start_as(
            &principal,
            StartRun {
                input: input.to_owned(),
                ..StartRun::default()
            },
        )
        .await
    }

    /// Starts a run as anyone, with any request fields; returns its id.
    pub async fn start_as(&self, principal: &Principal, request: StartRun) -> String {
        let run = match self.runtime.start_run(principal, request).await {
            Ok(run) => run,
            Err(e) => panic!("start_run failed: {e}"),
        };
        self.lock_tenants()
            .insert(run.id.clone(), principal.tenant.clone());
        run.id
    }

    fn lock_tenants(&self) -> MutexGuard<'_, HashMap<String, String>> {
        self.tenants.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tenant_of(&self, run_id: &str) -> String {
        self.lock_tenants()
            .get(run_id)
            .cloned()
            .unwrap_or_else(|| self.principal.tenant.clone())
    }

    /// The run as stored now.
    pub async fn run(&self, run_id: &str) -> RunRecord {
        match self.runtime.get_run(&self.tenant_of(run_id), run_id).await {
            Ok(run) => run,
            Err(e) => panic!("run {run_id} cannot be read: {e}"),
        }
    }

    /// Waits until the run has `status`. Meant for states a run rests in
    /// (waiting or ended): a passing state may be missed between polls.
    pub async fn wait_status(&self, run_id: &str, status: RunStatus) -> RunRecord {
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            let run = self.run(run_id).await;
            if run.status == status {
                return run;
            }
            if run.status.is_terminal() {
                panic!(
                    "run {run_id} ended {} (error: {:?}) while the test waited for {}; events: {:?}",
                    run.status.as_str(),
                    run.error,
                    status.as_str(),
                    self.event_types(run_id).await
                );
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "run {run_id} is still {} after {:?}; the test waited for {}; events: {:?}",
                    run.status.as_str(),
                    self.wait,
                    status.as_str(),
                    self.event_types(run_id).await
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until the run has ended, however it ended.
    pub async fn wait_terminal(&self, run_id: &str) -> RunRecord {
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            let run = self.run(run_id).await;
            if run.status.is_terminal() {
                return run;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "run {run_id} has not ended after {:?} (still {}); events: {:?}",
                    self.wait,
                    run.status.as_str(),
                    self.event_types(run_id).await
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits for the run's first event of this type (e.g. `"tool_call"`).
    pub async fn wait_event(&self, run_id: &str, event_type: &str) -> Event {
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            let events = self.events(run_id).await;
            if let Some(e) = events.iter().find(|e| e.type_name() == event_type) {
                return e.clone();
            }
            if events.last().is_some_and(Event::is_terminal) {
                panic!(
                    "run {run_id} ended without a `{event_type}` event; events: {:?}",
                    types(&events)
                );
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "no `{event_type}` event in run {run_id} after {:?}; events: {:?}",
                    self.wait,
                    types(&events)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until `done()` holds; `what` says what was awaited when it
    /// never does.
    pub async fn wait_until(&self, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + self.wait;
        while !done() {
            if tokio::time::Instant::now() >= deadline {
                panic!("timed out after {:?} waiting until {what}", self.wait);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Every stored event of the run, in order.
    pub async fn events(&self, run_id: &str) -> Vec<Event> {
        const PAGE: u32 = 1000;
        let mut all: Vec<Event> = Vec::new();
        loop {
            let after = all.last().map_or(0, |e| e.seq);
            let page = match self.runtime.store().events_after(run_id, after, PAGE).await {
                Ok(page) => page,
                Err(e) => panic!("events of run {run_id} cannot be read: {e}"),
            };
            let full = page.len() == PAGE as usize;
            all.extend(page);
            if !full {
                return all;
            }
        }
    }

    /// The run's event types, in order.
    pub async fn event_types(&self, run_id: &str) -> Vec<&'static str> {
        types(&self.events(run_id).await)
    }

    /// The payloads (as JSON, SPEC §3 field names) of the run's events of
    /// this type, in order.
    pub async fn events_of(&self, run_id: &str, event_type: &str) -> Vec<Value> {
        self.events(run_id)
            .await
            .iter()
            .filter(|e| e.type_name() == event_type)
            .map(|e| match serde_json::to_value(e) {
                Ok(v) => v,
                Err(err) => panic!("event {} does not serialize: {err}", e.seq),
            })
            .collect()
    }

    /// The messages of the run's session, as the store keeps them.
    pub async fn session_messages(&self, run_id: &str) -> Vec<Message> {
        let run = self.run(run_id).await;
        match self.runtime.session(&run.tenant, &run.session).await {
            Ok(messages) => messages.into_iter().map(|(_, m)| m).collect(),
            Err(e) => panic!("session of run {run_id} cannot be read: {e}"),
        }
    }

    /// Waits for the run to wait for an approval; returns that approval.
    pub async fn pending_approval(&self, run_id: &str) -> ApprovalRecord {
        self.wait_status(run_id, RunStatus::WaitingApproval).await;
        let tenant = self.tenant_of(run_id);
        let pending = match self
            .runtime
            .list_approvals(&tenant, Some(ApprovalStatus::Pending), 100)
            .await
        {
            Ok(list) => list,
            Err(e) => panic!("approvals cannot be listed: {e}"),
        };
        let mut of_run: Vec<ApprovalRecord> =
            pending.into_iter().filter(|a| a.run_id == run_id).collect();
        match of_run.len() {
            1 => of_run.remove(0),
            n => panic!("run {run_id} waits for an approval but has {n} pending: {of_run:?}"),
        }
    }

    /// Decides an approval as the test's principal.
    pub async fn decide(
        &self,
        approval_id: &str,
        approve: bool,
        reason: &str,
    ) -> Result<ApprovalRecord, keel_core::CoreError> {
        self.runtime
            .decide_approval(&self.principal, approval_id, approve, reason)
            .await
    }

    /// How many times the test tool has been executed.
    pub fn tool_calls_executed(&self, tool: &str) -> usize {
        self.tool_arguments(tool).len()
    }

    /// The arguments of each execution of the test tool, in order.
    pub fn tool_arguments(&self, tool: &str) -> Vec<Value> {
        match self.tools.get(tool) {
            Some(t) => t.calls(),
            None => panic!(
                "no test tool is named `{tool}` (known: {:?})",
                self.tools.keys().collect::<Vec<_>>()
            ),
        }
    }

    /// Ends the test's use of the runtime: fails when any model request
    /// broke the pairing rules or found no scripted reply.
    pub fn finish(self) {
        self.model.assert_clean();
    }
}

/// The types of these events, in order.
pub fn types(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(Event::type_name).collect()
}

/// Whether `wanted` appears in `seen` in order, other items in between.
pub fn is_subsequence(seen: &[&str], wanted: &[&str]) -> bool {
    let mut it = seen.iter();
    wanted.iter().all(|w| it.any(|s| s == w))
}
