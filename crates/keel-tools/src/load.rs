//! Turns the `[tools]` configuration into ready tools.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use keel_config::{ToolOverride, ToolsConfig};
use keel_protocol::{Tool, ToolSpec};
use tokio::sync::watch;

use crate::http::HttpTool;
use crate::mcp::McpServer;
use crate::{ToolsError, apply_override};

/// Tools built from configuration, plus the servers behind the MCP ones;
/// keep `servers` alive as long as the tools are used, and shut them down
/// on exit.
pub struct LoadedTools {
    /// The tools at start. MCP servers may change theirs later: see
    /// [`LoadedTools::changes`] and [`LoadedTools::current_tools`].
    pub tools: Vec<Arc<dyn Tool>>,
    pub servers: Vec<Arc<McpServer>>,
    http: Vec<Arc<dyn Tool>>,
    overrides: BTreeMap<String, ToolOverride>,
}

impl std::fmt::Debug for LoadedTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.tools.iter().map(|t| t.spec().name.as_str()).collect();
        f.debug_struct("LoadedTools")
            .field("tools", &names)
            .field("servers", &self.servers)
            .finish()
    }
}

impl LoadedTools {
    /// The tools as they are now: the HTTP tools, then each server's
    /// current list, with the configured overrides applied again. A server
    /// tool whose name is already taken is left out (and logged), since a
    /// server renaming its tools must not replace another's.
    pub fn current_tools(&self) -> Vec<Arc<dyn Tool>> {
        let mut names: BTreeSet<String> = self.http.iter().map(|t| t.spec().name.clone()).collect();
        let mut tools = self.http.clone();
        for server in &self.servers {
            for mut tool in server.mcp_tools() {
                if !names.insert(tool.spec_mut().name.clone()) {
                    tracing::warn!(tool = %tool.spec_mut().name, "mcp tool left out: name already taken");
                    continue;
                }
                if let Some(o) = self.overrides.get(&tool.spec_mut().name) {
                    apply_override(tool.spec_mut(), o);
                }
                tools.push(Arc::new(tool));
            }
        }
        tools
    }

    /// Wakes when any server's tool list was re-listed; then call
    /// [`LoadedTools::current_tools`].
    pub fn changes(&self) -> ToolChanges {
        ToolChanges {
            receivers: self.servers.iter().map(|s| s.changes()).collect(),
        }
    }

    /// Shuts every server down.
    pub async fn shutdown(&self) {
        for server in &self.servers {
            server.shutdown().await;
        }
    }
}

/// Builds every HTTP tool, starts every MCP server and applies `overrides`
/// by full tool name. Overrides naming no tool here are left for the
/// caller (they may target built-in tools).
pub async fn load_tools(
    cfg: &ToolsConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Result<LoadedTools, ToolsError> {
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let mut names = BTreeSet::new();
    let mut servers: Vec<Arc<McpServer>> = Vec::new();

    let result = async {
        for http in &cfg.http {
            let mut tool = HttpTool::from_config(http, &env)?;
            overridden(tool.spec_mut(), cfg, &mut names)?;
            tools.push(Arc::new(tool));
        }
        for server_cfg in &cfg.mcp {
            let server = McpServer::start(server_cfg, &env).await?;
            servers.push(Arc::clone(&server));
            for mut tool in server.mcp_tools() {
                overridden(tool.spec_mut(), cfg, &mut names)?;
                tools.push(Arc::new(tool));
            }
        }
        Ok::<(), ToolsError>(())
    }
    .await;

    if let Err(e) = result {
        for server in &servers {
            server.shutdown().await;
        }
        return Err(e);
    }
    Ok(LoadedTools {
        http: tools[..cfg.http.len()].to_vec(),
        tools,
        servers,
        overrides: cfg.overrides.clone(),
    })
}

/// Change notifications of every MCP server of a [`LoadedTools`].
#[derive(Debug)]
pub struct ToolChanges {
    receivers: Vec<watch::Receiver<u64>>,
}

impl ToolChanges {
    /// Waits until some server's tools were re-listed since the last call;
    /// `false` once no server can report a change any more (all shut down,
    /// or there are none).
    pub async fn changed(&mut self) -> bool {
        loop {
            if self.receivers.is_empty() {
                return false;
            }
            let (result, index) = {
                let waits = self.receivers.iter_mut().map(|rx| Box::pin(rx.changed()));
                let (result, index, _rest) = futures::future::select_all(waits).await;
                (result, index)
            };
            match result {
                Ok(()) => {
                    self.receivers[index].borrow_and_update();
                    return true;
                }
                Err(_) => {
                    self.receivers.swap_remove(index);
                }
            }
        }
    }
}

fn overridden(
    spec: &mut ToolSpec,
    cfg: &ToolsConfig,
    names: &mut BTreeSet<String>,
) -> Result<(), ToolsError> {
    if !names.insert(spec.name.clone()) {
        return Err(ToolsError::DuplicateTool(spec.name.clone()));
    }
    if let Some(o) = cfg.overrides.get(&spec.name) {
        apply_override(spec, o);
    }
    Ok(())
}
