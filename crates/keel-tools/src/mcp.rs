//! MCP servers (SPEC §5), over stdio or streamable HTTP. A stdio server
//! runs as a child process with a scrubbed environment; either kind has its
//! tools appear as `<server>.<tool>`, re-listed when the server announces a
//! change, and a supervisor that reconnects (restarting the process) when
//! the session dies, so one crash does not take its tools away for good.

mod connection;
#[doc(hidden)]
pub mod fuzzing;
mod http_client;
mod supervisor;
mod tool;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use keel_config::McpServerConfig;
use keel_protocol::{Tool, ToolError};
use rmcp::service::{Peer, RoleClient};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::ToolsError;
use crate::env::expand;
use connection::{Connection, Endpoint, Launch};
pub(crate) use tool::McpTool;

/// Variables of keel's own environment a stdio server still gets: enough to
/// find programs and behave like a normal process, none of keel's secrets.
const INHERITED_ENV: &[&str] = &["PATH", "HOME", "LANG"];

/// A connected MCP server and the tools it currently offers.
///
/// Dropping it (or calling [`McpServer::shutdown`]) ends the session and
/// stops the process of a stdio server; its tools then fail with
/// `ToolError::Unavailable`.
pub struct McpServer {
    name: String,
    endpoint: String,
    shared: Arc<Shared>,
    supervisor: Mutex<Option<JoinHandle<()>>>,
}

/// What the server's tools and its supervisor both see.
pub(crate) struct Shared {
    name: String,
    state: Mutex<State>,
    shutdown: CancellationToken,
    /// The last successful `tools/list`, already converted.
    tools: Mutex<Vec<tool::RemoteTool>>,
    /// Bumped after every successful re-list; dropped at shutdown so
    /// watchers learn no change will come.
    changes: Mutex<Option<watch::Sender<u64>>>,
    call_timeout: Duration,
    protocol: Mutex<String>,
    /// The server-wide `risk` / `requires_approval` of its `[[tools.mcp]]`.
    defaults: tool::ServerDefaults,
}

enum State {
    Up(Connection),
    Restarting,
    Stopped,
}

impl Shared {
    fn set(&self, state: State) {
        if let State::Up(conn) = &state
            && let Some(v) = connection::protocol_of(&conn.peer)
        {
            *self.protocol.lock().unwrap_or_else(PoisonError::into_inner) = v.to_string();
        }
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = state;
    }

    /// The live connection, or the reason there is none; never waits, so a
    /// call during a restart fails at once instead of piling up.
    fn connection(&self) -> Result<Connection, ToolError> {
        match &*self.state.lock().unwrap_or_else(PoisonError::into_inner) {
            State::Up(conn) => Ok(conn.clone()),
            State::Restarting => Err(ToolError::Unavailable(format!(
                "mcp server {} is restarting",
                self.name
            ))),
            State::Stopped => Err(ToolError::Unavailable(format!(
                "mcp server {} is shut down",
                self.name
            ))),
        }
    }

    /// Lists every page of tools and keeps what can be called.
    async fn list(&self, peer: &Peer<RoleClient>) -> Result<Vec<tool::RemoteTool>, String> {
        let listed = match tokio::time::timeout(self.call_timeout, peer.list_all_tools()).await {
            Ok(Ok(tools)) => tools,
            Ok(Err(e)) => return Err(format!("tools/list failed: {e}")),
            Err(_) => {
                return Err(format!(
                    "tools/list took longer than {:?}",
                    self.call_timeout
                ));
            }
        };
        Ok(listed
            .into_iter()
            .filter_map(|t| {
                tool::RemoteTool::from_mcp(&self.name, t, self.call_timeout, self.defaults)
            })
            .collect())
    }

    /// Lists again and tells whoever watches [`McpServer::changes`].
    async fn relist(&self, peer: &Peer<RoleClient>) -> Result<(), String> {
        let tools = self.list(peer).await?;
        tracing::info!(server = %self.name, tools = tools.len(), "mcp tools listed");
        *self.tools.lock().unwrap_or_else(PoisonError::into_inner) = tools;
        if let Some(changes) = &*self.changes.lock().unwrap_or_else(PoisonError::into_inner) {
            changes.send_modify(|n| *n += 1);
        }
        Ok(())
    }
}

impl McpServer {
    /// Connects (spawning a stdio server), agrees on a protocol generation
    /// and lists the tools; fails when any of that does not work within the
    /// server's timeout.
    pub async fn start(
        cfg: &McpServerConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Arc<McpServer>, ToolsError> {
        let config_error = |reason: &str| ToolsError::McpConfig {
            server: cfg.name.clone(),
            reason: reason.to_owned(),
        };
        if cfg.name.is_empty() || cfg.name.contains('.') {
            return Err(config_error(
                "server name must be non-empty and contain no '.'",
            ));
        }
        let timeout = Duration::from_secs(cfg.timeout_s.max(1));
        let (endpoint, shown) = match (&cfg.command, &cfg.url) {
            (Some(command), None) => (
                Endpoint::Stdio {
                    command: command.clone(),
                    args: cfg.args.clone(),
                    env: stdio_env(cfg, &env)?,
                },
                command.clone(),
            ),
            (None, Some(url)) => {
                if !cfg.env.is_empty() || !cfg.args.is_empty() {
                    return Err(config_error(
                        "`env` and `args` apply to `command` servers, not to `url` ones",
                    ));
                }
                (http_endpoint(cfg, url, timeout)?, url.clone())
            }
            (Some(_), Some(_)) => {
                return Err(config_error("set either `command` or `url`, not both"));
            }
            (None, None) => return Err(config_error("needs a `command` or a `url`")),
        };

        let list_changed = Arc::new(Notify::new());
        let launch = Launch {
            server: cfg.name.clone(),
            endpoint,
            startup_timeout: timeout,
            list_changed: Arc::clone(&list_changed),
        };
        let fail = |reason: String| match cfg.url {
            Some(_) => ToolsError::McpConnect {
                server: cfg.name.clone(),
                url: shown.clone(),
                reason,
            },
            None => ToolsError::McpStart {
                server: cfg.name.clone(),
                command: shown.clone(),
                reason,
            },
        };

        let (running, generation) = launch.connect(None).await.map_err(&fail)?;
        let shared = Arc::new(Shared {
            name: cfg.name.clone(),
            state: Mutex::new(State::Restarting),
            shutdown: CancellationToken::new(),
            tools: Mutex::new(Vec::new()),
            changes: Mutex::new(Some(watch::Sender::new(0))),
            call_timeout: timeout,
            protocol: Mutex::new(String::new()),
            defaults: tool::ServerDefaults {
                risk: cfg.risk,
                requires_approval: cfg.requires_approval,
                output_trust: cfg.output_trust,
            },
        });
        let gone = CancellationToken::new();
        connection::listen_for_changes(&running, Arc::clone(&list_changed), gone.clone(), timeout)
            .await;
        let tools = match shared.list(running.peer()).await {
            Ok(tools) => tools,
            Err(e) => {
                gone.cancel();
                return Err(fail(e));
            }
        };
        tracing::info!(
            server = %cfg.name,
            tools = tools.len(),
            protocol = ?connection::protocol_of(running.peer()),
            "mcp server started"
        );
        *shared.tools.lock().unwrap_or_else(PoisonError::into_inner) = tools;
        // Any change announced while listing is still pending in
        // `list_changed` and the supervisor re-lists for it.
        let handle = supervisor::spawn(Arc::clone(&shared), launch, running, gone, generation);
        Ok(Arc::new(McpServer {
            name: cfg.name.clone(),
            endpoint: shown,
            shared,
            supervisor: Mutex::new(Some(handle)),
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The command of a stdio server or the URL of an HTTP one.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The protocol version of the current session: `2026-07-28` when the
    /// server answered `server/discover`, else what `initialize` agreed on.
    pub fn protocol_version(&self) -> String {
        self.shared
            .protocol
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The server's current tools, named `<server>.<tool>`, with the
    /// server-wide `risk` / `requires_approval` applied (`[tools.overrides]`
    /// are applied by [`crate::load_tools`]). Tools handed out earlier keep
    /// working; after a change, call this again.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.mcp_tools()
            .into_iter()
            .map(|t| Arc::new(t) as Arc<dyn Tool>)
            .collect()
    }

    /// A counter bumped after every successful re-list (on
    /// `notifications/tools/list_changed` and after each reconnect); wait
    /// on it, then call [`McpServer::tools`].
    pub fn changes(&self) -> watch::Receiver<u64> {
        match &*self
            .shared
            .changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            Some(changes) => changes.subscribe(),
            // Shut down: a receiver whose sender is gone says so at once.
            None => watch::channel(0).1,
        }
    }

    pub(crate) fn mcp_tools(&self) -> Vec<McpTool> {
        self.shared
            .tools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|remote| McpTool::new(remote.clone(), Arc::clone(&self.shared)))
            .collect()
    }

    /// Ends the session (stopping a stdio server's process) and the
    /// supervisor, and waits for both.
    pub async fn shutdown(&self) {
        self.shared.shutdown.cancel();
        let handle = self
            .supervisor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(handle) = handle
            && let Err(e) = handle.await
        {
            tracing::warn!(server = %self.name, error = %e, "mcp supervisor ended abnormally");
        }
        self.shared
            .changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// The complete environment of a stdio server: a few harmless variables of
/// keel's own, then the configured entries with `${VAR}` expanded. Nothing
/// else of keel's environment (API keys, database URLs) reaches the server.
fn stdio_env(
    cfg: &McpServerConfig,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, ToolsError> {
    let mut vars: Vec<(String, String)> = INHERITED_ENV
        .iter()
        .filter_map(|k| env(k).map(|v| ((*k).to_owned(), v)))
        .collect();
    for (key, template) in &cfg.env {
        let value = expand(template, env).map_err(|var| ToolsError::McpEnv {
            server: cfg.name.clone(),
            key: key.clone(),
            var,
        })?;
        vars.retain(|(k, _)| k != key);
        vars.push((key.clone(), value));
    }
    Ok(vars)
}

fn http_endpoint(
    cfg: &McpServerConfig,
    url: &str,
    timeout: Duration,
) -> Result<Endpoint, ToolsError> {
    let config_error = |reason: String| ToolsError::McpConfig {
        server: cfg.name.clone(),
        reason,
    };
    let parsed = reqwest::Url::parse(url).map_err(|e| config_error(format!("url {url:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(config_error(format!("url {url:?} must be http or https")));
    }
    // No overall request timeout: a POST may answer with an SSE stream that
    // lives as long as the call, which the per-call timeout already bounds.
    // Redirects are refused: following one would replay the session id to
    // wherever the server points.
    let client = reqwest::Client::builder()
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| config_error(format!("http client: {e}")))?;
    Ok(Endpoint::Http {
        url: url.to_owned(),
        client,
    })
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
        self.shared
            .changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}
