//! Assembles a runtime from configuration: store, providers, tools, agents, auth.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use keel_config::{Config, Env, ProcessEnv, ProviderKind, ToolMode};
use keel_core::{AgentRuntime, Guards, Runtime, RuntimeOptions, ToolSet};
use keel_guard::hooks::{BeforeToolCall, ConfigHook};
use keel_guard::policy::Policy;
use keel_guard::verify::Verifier;
use keel_protocol::{ModelClient, Principal, Store};
use keel_providers::anthropic::{AnthropicClient, AnthropicSettings};
use keel_providers::json_mode::JsonToolMode;
use keel_providers::openai::{OpenAiClient, OpenAiSettings};
use keel_tools::LoadedTools;

pub struct App {
    pub config: Config,
    pub runtime: Runtime,
    pub tools: Arc<LoadedTools>,
    /// Long-term memory: the `memory_*` tools, `/ai/memory/*`, session summaries.
    pub memory: Arc<dyn keel_memory::Memory>,
    /// API keys resolved from the environment.
    pub keys: Vec<(String, Principal)>,
    /// The chat channels, when the configuration has any.
    pub gateway: Option<Arc<keel_server::gateway::Gateway>>,
}

/// Where the configuration comes from, for messages.
pub enum Source {
    File(PathBuf),
    Defaults,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => write!(f, "{}", p.display()),
            Self::Defaults => write!(f, "built-in defaults"),
        }
    }
}

/// Finds the configuration: `--config`/`KEEL_CONFIG`, else `./keel.toml`, else defaults.
pub fn resolve_source(flag: Option<&Path>) -> Source {
    match flag {
        Some(p) => Source::File(p.to_path_buf()),
        None if Path::new("keel.toml").exists() => Source::File(PathBuf::from("keel.toml")),
        None => Source::Defaults,
    }
}

pub fn load_config(source: &Source) -> anyhow::Result<Config> {
    let env = ProcessEnv;
    let loaded = match source {
        Source::File(path) => keel_config::load_file(path, &env),
        Source::Defaults => {
            keel_config::load_str(&default_config_text(&env), "built-in defaults", &env)
        }
    }
    .map_err(|e| anyhow::anyhow!("invalid configuration:\n{e}"))?;
    // Before any line reaches its destination: the secrets it must not show.
    crate::logging::redact_secrets(&crate::secrets::redactor(&loaded.config, &env)?);
    // From here on a terminal command's log has its file.
    crate::logging::to_file(&Path::new(&loaded.config.server.data_dir).join("keel.log"));
    crate::secrets::warn_unredactable(&loaded.config, &env);
    if let Source::Defaults = source {
        crate::zero_config::announce(&loaded.config);
    }
    for w in &loaded.warnings {
        tracing::warn!(target: crate::logging::NOTICE, "warning: {w}");
    }
    Ok(loaded.config)
}

/// With no file, keel talks to any OpenAI-compatible endpoint named by the
/// usual variables, with one agent that may use every tool.
fn default_config_text(env: &dyn Env) -> String {
    if let Some(local) = crate::zero_config::local_default_text(env) {
        return local;
    }
    let base = env
        .var("OPENAI_BASE_URL")
        .unwrap_or_else(|| "https://api.openai.com/v1".into());
    let model = env
        .var("KEEL_MODEL")
        .unwrap_or_else(|| "gpt-4o-mini".into());
    let quote = |s: &str| toml_string(s);
    format!(
        r#"[[providers]]
name = "default"
kind = "openai"
base_url = {base}
api_key_env = "OPENAI_API_KEY"
model = {model}

[[agents]]
id = "default"
provider = "default"
system_prompt = "You are a helpful operations assistant. Use tools when they are needed."
tools = ["*"]
"#,
        base = quote(&base),
        model = quote(&model),
    )
}

fn toml_string(s: &str) -> String {
    let escaped: String = s
        .chars()
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c if c.is_control() => Vec::new(),
            c => vec![c],
        })
        .collect();
    format!("\"{escaped}\"")
}

/// The store as this node sees it: with PostgreSQL, one node among the
/// several that may share the database (SPEC §10).
pub async fn open_node(
    config: &Config,
) -> anyhow::Result<(Arc<dyn Store>, Arc<dyn keel_protocol::Coordination>)> {
    let url = database_url(config);
    let node = keel_store::NodeSettings {
        node_id: node_id(config),
        lease: Duration::from_secs(config.server.lease_s.max(1)),
    };
    keel_store::open_node(&url, node)
        .await
        .with_context(|| format!("opening the store ({})", scheme_of(&url)))
}

/// `server.node_id`, else `<hostname>-<pid>-<random>`: unique per process,
/// so a restarted node never mistakes its predecessor's leases for its own.
fn node_id(config: &Config) -> String {
    if let Some(id) = &config.server.node_id {
        return id.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().replace(char::is_whitespace, "_"))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "keel".into());
    let unique = keel_protocol::new_id("n");
    let random = &unique[unique.len().saturating_sub(6)..];
    format!("{host}-{}-{random}", std::process::id())
}

pub fn database_url(config: &Config) -> String {
    config.server.database_url.clone().unwrap_or_else(|| {
        format!(
            "sqlite://{}/keel.db",
            config.server.data_dir.trim_end_matches('/')
        )
    })
}

/// The URL without credentials, for messages.
pub fn scheme_of(url: &str) -> String {
    match url.split_once("://") {
        Some(("sqlite", rest)) => format!("sqlite://{rest}"),
        Some((scheme, _)) => format!("{scheme}://…"),
        None => "invalid URL".into(),
    }
}

fn api_key(p: &keel_config::ProviderConfig, env: &dyn Env) -> Option<String> {
    let var = p.api_key_env.as_ref()?;
    let key = keel_config::secret_from_env(env, var);
    if key.is_none() {
        tracing::warn!(provider = %p.name, "environment variable {var} is not set; calling the provider without a key");
    }
    key.map(|k| secrecy::ExposeSecret::expose_secret(&k).to_owned())
}

fn model_client(
    p: &keel_config::ProviderConfig,
    env: &dyn Env,
    data_dir: &Path,
) -> anyhow::Result<Arc<dyn ModelClient>> {
    let timeout = Duration::from_secs(p.timeout_s.max(1));
    let backoff = Duration::from_millis(p.backoff_ms);
    let client: Arc<dyn ModelClient> = match p.kind {
        ProviderKind::Openai => {
            let settings = OpenAiSettings {
                base_url: p
                    .base_url
                    .clone()
                    .unwrap_or_else(|| "https://api.openai.com/v1".into()),
                api_key: api_key(p, env),
                model: p.model.clone(),
                stream: p.stream,
                timeout,
                max_retries: p.max_retries,
                backoff_base: backoff,
                context_window: p.context_window,
                max_concurrent_requests: usize::try_from(p.max_concurrent_requests)
                    .unwrap_or(usize::MAX),
            };
            Arc::new(OpenAiClient::new(settings).with_context(|| format!("provider `{}`", p.name))?)
        }
        ProviderKind::Anthropic => {
            let mut settings = AnthropicSettings::new(
                p.base_url
                    .clone()
                    .unwrap_or_else(|| AnthropicSettings::DEFAULT_BASE_URL.into()),
                p.model.clone(),
            );
            settings.api_key = api_key(p, env);
            settings.stream = p.stream;
            settings.timeout = timeout;
            settings.max_retries = p.max_retries;
            settings.backoff_base = backoff;
            settings.context_window = p.context_window;
            settings.max_concurrent_requests =
                usize::try_from(p.max_concurrent_requests).unwrap_or(usize::MAX);
            Arc::new(
                AnthropicClient::new(settings).with_context(|| format!("provider `{}`", p.name))?,
            )
        }
        #[cfg(feature = "local")]
        ProviderKind::Local => crate::local_provider::client(p, data_dir)?,
        #[cfg(not(feature = "local"))]
        ProviderKind::Local => {
            let _ = data_dir;
            bail!(
                "provider `{}`: this keel was built without the `local` feature",
                p.name
            )
        }
    };
    Ok(match p.tool_mode {
        ToolMode::Native => client,
        ToolMode::Json => Arc::new(JsonToolMode::new(client)),
    })
}

pub async fn build(config: Config) -> anyhow::Result<App> {
    let env = ProcessEnv;
    let redactor = crate::secrets::redactor(&config, &env)?;
    let (store, coord) = open_node(&config).await?;
    #[cfg(feature = "local")]
    crate::local_provider::ensure_models(&config).await?;
    let mut agents = Vec::new();
    for a in &config.agents {
        let provider = config
            .providers
            .iter()
            .find(|p| p.name == a.provider)
            .with_context(|| {
                format!("agent `{}` names a missing provider `{}`", a.id, a.provider)
            })?;
        agents.push(AgentRuntime::new(
            a.clone(),
            model_client(provider, &env, Path::new(&config.server.data_dir))?,
            Some(provider),
        ));
    }
    if agents.is_empty() {
        bail!("no agent is configured: add an [[agents]] section");
    }
    let default_agent = if config.agents.iter().any(|a| a.id == "default") {
        "default".to_owned()
    } else {
        config.agents[0].id.clone()
    };
    let tools = keel_tools::load_tools(&config.tools, |k| env.var(k))
        .await
        .context("loading tools")?;
    let tools = Arc::new(tools);
    let data_dir = PathBuf::from(&config.server.data_dir);
    let (embedder, notice) = keel_memory::build_embedder(&config.memory, &data_dir).await;
    let memory = keel_memory::open_with(
        config.server.database_url.as_deref().unwrap_or_default(),
        &data_dir,
        embedder.clone(),
        keel_memory::settings_of(&config.memory),
        notice,
    )
    .await
    .context("opening long-term memory")?;
    let memory = keel_memory::RedactedMemory::wrap(memory, &redactor);
    let status = memory.status();
    match (&status.embedder, &status.notice) {
        (_, Some(notice)) => {
            tracing::warn!("memory: {notice}");
            let remedy = match config.memory.embedder {
                keel_config::EmbedderKind::Local => {
                    "install one with `bash scripts/setup-embedder.sh`"
                }
                _ => "see keel.log",
            };
            tracing::info!(
                target: crate::logging::NOTICE,
                "memory: no embedding model, keyword search only ({remedy})"
            );
        }
        (Some(model), None) => {
            tracing::info!("memory: hybrid search with the embedding model {model}")
        }
        (None, None) => {}
    }
    let all_tools = with_builtins(
        tools.tools.clone(),
        &memory,
        &config.tools.web_fetch,
        &config.tools.exec,
    );
    log_trust(&keel_tools::TrustSummary::of(
        &all_tools,
        &tools.origins,
        config.policy.approval_risk,
    ));
    let toolset = ToolSet::new(all_tools).context("registering tools")?;
    // Before the runtime: runs started from a channel answer through it.
    let gateway = keel_server::gateway::Gateway::from_config(&config, &env)
        .context("setting up the chat channels")?
        .map(Arc::new);
    let options = RuntimeOptions {
        approver_roles: config.auth.approver_roles.clone(),
        approval_timeout: Duration::from_secs(config.policy.approval_timeout_s.max(1)),
        guards: guards(&config)?,
        memory: Some(Arc::new(SessionSummaries {
            memory: memory.clone(),
            dir: PathBuf::from(&config.server.data_dir)
                .join("memory")
                .join("sessions"),
        })),
        summary_fallback_messages: 20,
        similarity: embedder.map(|embedder| {
            Arc::new(crate::similarity::EmbedderSimilarity::new(embedder))
                as Arc<dyn keel_core::Similarity>
        }),
        outbound: gateway.clone().map(|g| g as Arc<dyn keel_core::Outbound>),
        admission: keel_server::gateway::HttpAdmission::from_config(&config, &env)
            .context("setting up the before_tool_call hooks")?
            .map(|a| Arc::new(a) as Arc<dyn keel_core::Admission>),
        redactor,
        quotas: keel_core::Quotas::new(&config.tenants),
    };
    let runtime =
        Runtime::with_coordination(store, coord, toolset, agents, &default_agent, options)?;
    let mut keys = Vec::new();
    for (i, k) in config.auth.keys.iter().enumerate() {
        let Some(value) = env.var(&k.key_env).filter(|v| !v.is_empty()) else {
            bail!(
                "auth.keys[{i}].key_env: environment variable {} is not set",
                k.key_env
            );
        };
        keys.push((
            value,
            Principal {
                tenant: k.tenant.clone(),
                id: k.principal.clone(),
                roles: k.roles.clone(),
            },
        ));
    }
    Ok(App {
        memory,
        config,
        runtime,
        tools,
        keys,
        gateway,
    })
}

/// Hooks, policy and verifier from `[[hooks]]`, `[policy]` and `[verify]`.
fn guards(config: &Config) -> anyhow::Result<Guards> {
    let policy = Policy::compile(&config.policy).context("policy")?;
    let mut hooks: Vec<Arc<dyn BeforeToolCall>> = Vec::new();
    for (i, h) in config.hooks.iter().enumerate() {
        let hook = ConfigHook::compile(h).with_context(|| format!("hooks[{i}]"))?;
        hooks.push(Arc::new(hook));
    }
    Ok(Guards {
        policy,
        hooks,
        verifier: Verifier::new(&config.verify),
    })
}

/// The configured tools plus keel's built-in ones.
fn with_builtins(
    mut tools: Vec<Arc<dyn keel_protocol::Tool>>,
    memory: &Arc<dyn keel_memory::Memory>,
    web_fetch: &keel_config::WebFetchConfig,
    exec: &keel_config::ExecConfig,
) -> Vec<Arc<dyn keel_protocol::Tool>> {
    tools.push(Arc::new(keel_memory::MemorySearchTool::new(memory.clone())));
    tools.push(Arc::new(keel_memory::MemoryGetTool::new(memory.clone())));
    if web_fetch.enabled {
        tools.push(Arc::new(keel_tools::web_fetch::WebFetch::new(
            keel_tools::web_fetch::WebFetchSettings {
                allow_hosts: web_fetch.allow_hosts.clone(),
                allow_private: web_fetch.allow_private,
                max_bytes: web_fetch.max_bytes,
                timeout: std::time::Duration::from_secs(web_fetch.timeout_s.max(1)),
                max_redirects: web_fetch.max_redirects,
            },
        )));
    }
    if exec.enabled {
        match exec_tool(exec) {
            Ok(tool) => tools.push(Arc::new(tool)),
            Err(e) => tracing::error!(error = %e, "exec tool left out"),
        }
    }
    tools
}

/// The `exec` tool; its sandbox helper is this very binary (`keel __exec-sandbox`).
fn exec_tool(cfg: &keel_config::ExecConfig) -> anyhow::Result<keel_tools::exec::Exec> {
    let programs = cfg
        .programs
        .iter()
        .map(|p| {
            let args = p
                .args
                .iter()
                .map(|a| regex::Regex::new(a))
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("tools.exec: arguments of {}", p.path))?;
            Ok(keel_tools::exec::Program {
                path: PathBuf::from(&p.path),
                args,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(keel_tools::exec::Exec::new(
        keel_tools::exec::ExecSettings {
            programs,
            read_paths: cfg.read_paths.iter().map(PathBuf::from).collect(),
            write_paths: cfg.write_paths.iter().map(PathBuf::from).collect(),
            cwd: None,
            timeout: std::time::Duration::from_secs(cfg.timeout_s.max(1)),
            max_output_bytes: cfg.max_output_bytes,
            requires_approval: cfg.requires_approval,
            helper: std::env::current_exe()
                .context("locating keel's own binary for the exec sandbox")?,
            helper_args: vec!["__exec-sandbox".into()],
        },
    ))
}

/// Session summaries go to long-term memory (indexed, so `memory_search`
/// finds them) and to a readable Markdown file per session under the data dir.
struct SessionSummaries {
    memory: Arc<dyn keel_memory::Memory>,
    dir: PathBuf,
}

#[async_trait::async_trait]
impl keel_core::SessionMemory for SessionSummaries {
    async fn remember_session(
        &self,
        tenant: &str,
        agent: &str,
        session: &str,
        archived_as: &str,
        markdown: &str,
    ) -> Result<String, String> {
        let safe = |s: &str| -> String {
            s.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                        c
                    } else {
                        '_'
                    }
                })
                .collect()
        };
        let dir = self.dir.join(safe(tenant)).join(safe(agent));
        let file = dir.join(format!("{}.md", safe(archived_as)));
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        tokio::fs::write(&file, markdown)
            .await
            .map_err(|e| format!("writing {}: {e}", file.display()))?;
        self.memory
            .add_document(keel_memory::MemoryDocument {
                tenant: tenant.to_owned(),
                agent: agent.to_owned(),
                source: format!("session:{archived_as}"),
                title: format!("Session {session}"),
                text: markdown.to_owned(),
                created_at: keel_protocol::now(),
            })
            .await
            .map_err(|e| e.to_string())
    }
}

/// One line per list an operator checks after tools are (re)loaded: which
/// tools stop for approval, and which MCP tools run on the default for a
/// tool without annotations because nothing in the configuration decided.
fn log_trust(summary: &keel_tools::TrustSummary) {
    let list = |names: &[String]| {
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    };
    tracing::info!("tools needing approval: {}", list(&summary.needs_approval));
    tracing::info!(
        "tools with no MCP annotations (risk write by default): {}",
        list(&summary.unannotated)
    );
}

/// Keeps the runtime's tools in step with the MCP servers: when a server's
/// tool list changes, the whole set is rebuilt and swapped in.
pub fn follow_tool_changes(
    runtime: Runtime,
    tools: Arc<LoadedTools>,
    memory: Arc<dyn keel_memory::Memory>,
    approval_risk: keel_protocol::Risk,
    web_fetch: keel_config::WebFetchConfig,
    exec: keel_config::ExecConfig,
) {
    tokio::spawn(async move {
        let mut changes = tools.changes();
        while changes.changed().await {
            let (current, origins) = tools.current_tools_with_origins();
            let all_tools = with_builtins(current, &memory, &web_fetch, &exec);
            let summary = keel_tools::TrustSummary::of(&all_tools, &origins, approval_risk);
            match ToolSet::new(all_tools) {
                Ok(set) => {
                    tracing::info!(
                        tools = set.len(),
                        "tool list changed; runs use the new set from their next step"
                    );
                    log_trust(&summary);
                    runtime.replace_tools(set);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "tool list changed but the new set is invalid; keeping the old one")
                }
            }
        }
    });
}
