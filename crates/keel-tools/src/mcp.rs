//! MCP servers over stdio (SPEC §5). Each configured server runs as a
//! child process with a scrubbed environment, its tools appear as
//! `<server>.<tool>`, and a supervisor restarts it when it dies so one
//! crash does not take its tools away for good.

mod connection;
mod supervisor;
mod tool;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use keel_config::McpServerConfig;
use keel_protocol::{Tool, ToolError};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::ToolsError;
use crate::env::expand;
use connection::{Connection, Launch};
pub(crate) use tool::McpTool;

/// Variables of keel's own environment a server still gets: enough to find
/// programs and behave like a normal process, none of keel's secrets.
const INHERITED_ENV: &[&str] = &["PATH", "HOME", "LANG"];

/// A running MCP server and the tools it offered at start.
///
/// Dropping it (or calling [`McpServer::shutdown`]) stops the process; its
/// tools then fail with `ToolError::Unavailable`.
pub struct McpServer {
    name: String,
    command: String,
    shared: Arc<Shared>,
    tools: Vec<tool::RemoteTool>,
    supervisor: Mutex<Option<JoinHandle<()>>>,
}

/// What the server's tools and its supervisor both see.
pub(crate) struct Shared {
    name: String,
    state: Mutex<State>,
    shutdown: CancellationToken,
}

enum State {
    Up(Connection),
    Restarting,
    Stopped,
}

impl Shared {
    fn set(&self, state: State) {
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
}

impl McpServer {
    /// Spawns the server, initializes the session and lists its tools.
    pub async fn start(
        cfg: &McpServerConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Arc<McpServer>, ToolsError> {
        let Some(command) = cfg.command.clone() else {
            return Err(ToolsError::McpConfig {
                server: cfg.name.clone(),
                reason: if cfg.url.is_some() {
                    "MCP over streamable HTTP (`url`) is not supported yet; use `command`".into()
                } else {
                    "no `command` configured".into()
                },
            });
        };
        if cfg.name.is_empty() || cfg.name.contains('.') {
            return Err(ToolsError::McpConfig {
                server: cfg.name.clone(),
                reason: "server name must be non-empty and contain no '.'".into(),
            });
        }

        let mut vars: Vec<(String, String)> = INHERITED_ENV
            .iter()
            .filter_map(|k| env(k).map(|v| ((*k).to_owned(), v)))
            .collect();
        for (key, template) in &cfg.env {
            let value = expand(template, &env).map_err(|var| ToolsError::McpEnv {
                server: cfg.name.clone(),
                key: key.clone(),
                var,
            })?;
            vars.retain(|(k, _)| k != key);
            vars.push((key.clone(), value));
        }

        let timeout = Duration::from_secs(cfg.timeout_s.max(1));
        let launch = Launch {
            server: cfg.name.clone(),
            command: command.clone(),
            args: cfg.args.clone(),
            env: vars,
            startup_timeout: timeout,
        };
        let fail = |reason: String| ToolsError::McpStart {
            server: cfg.name.clone(),
            command: command.clone(),
            reason,
        };

        let running = launch.connect().await.map_err(&fail)?;
        let listed = match tokio::time::timeout(timeout, running.peer().list_all_tools()).await {
            Ok(Ok(tools)) => tools,
            Ok(Err(e)) => return Err(fail(format!("tools/list failed: {e}"))),
            Err(_) => return Err(fail(format!("tools/list took longer than {timeout:?}"))),
        };
        let tools = listed
            .into_iter()
            .filter_map(|t| tool::RemoteTool::from_mcp(&cfg.name, t, timeout))
            .collect::<Vec<_>>();
        tracing::info!(server = %cfg.name, tools = tools.len(), "mcp server started");

        let shared = Arc::new(Shared {
            name: cfg.name.clone(),
            state: Mutex::new(State::Restarting),
            shutdown: CancellationToken::new(),
        });
        let handle = supervisor::spawn(Arc::clone(&shared), launch, running);
        Ok(Arc::new(McpServer {
            name: cfg.name.clone(),
            command,
            shared,
            tools,
            supervisor: Mutex::new(Some(handle)),
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn command(&self) -> &str {
        &self.command
    }

    /// The server's tools, named `<server>.<tool>`.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.mcp_tools()
            .into_iter()
            .map(|t| Arc::new(t) as Arc<dyn Tool>)
            .collect()
    }

    pub(crate) fn mcp_tools(&self) -> Vec<McpTool> {
        self.tools
            .iter()
            .map(|remote| McpTool::new(remote.clone(), Arc::clone(&self.shared)))
            .collect()
    }

    /// Stops the server process and its supervisor and waits for both.
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
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.name)
            .field("command", &self.command)
            .field("tools", &self.tools.len())
            .finish_non_exhaustive()
    }
}
