//! Turns the `[tools]` configuration into ready tools.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use keel_config::ToolsConfig;
use keel_protocol::{Tool, ToolSpec};
use tokio::sync::watch;

use crate::ToolsError;
use crate::http::HttpTool;
use crate::mcp::McpServer;
use crate::trust::{RiskSource, TrustOrigin, apply_overrides};

/// Tools built from configuration, plus the servers behind the MCP ones;
/// keep `servers` alive as long as the tools are used, and shut them down
/// on exit.
pub struct LoadedTools {
    /// The tools at start. MCP servers may change theirs later: see
    /// [`LoadedTools::changes`] and [`LoadedTools::current_tools`].
    pub tools: Vec<Arc<dyn Tool>>,
    /// Where the risk and approval of each of `tools` came from, by name.
    /// Kept here rather than in `ToolSpec`, which is keel's wire format
    /// and says what a tool is, not which layer of configuration decided it.
    pub origins: BTreeMap<String, TrustOrigin>,
    pub servers: Vec<Arc<McpServer>>,
    http: Vec<Arc<dyn Tool>>,
    http_origins: BTreeMap<String, TrustOrigin>,
    /// For `[tools.overrides]`, applied again to every re-listed tool.
    config: ToolsConfig,
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
        self.current_tools_with_origins().0
    }

    /// [`LoadedTools::current_tools`], with where each tool's risk and
    /// approval came from (as [`LoadedTools::origins`] is for the start).
    pub fn current_tools_with_origins(
        &self,
    ) -> (Vec<Arc<dyn Tool>>, BTreeMap<String, TrustOrigin>) {
        let mut names: BTreeSet<String> = self.http.iter().map(|t| t.spec().name.clone()).collect();
        let mut tools = self.http.clone();
        let mut origins = self.http_origins.clone();
        for server in &self.servers {
            for mut tool in server.mcp_tools() {
                let (spec, origin) = tool.trust_mut();
                if !names.insert(spec.name.clone()) {
                    tracing::warn!(tool = %spec.name, "mcp tool left out: name already taken");
                    continue;
                }
                apply_overrides(spec, origin, &self.config);
                origins.insert(spec.name.clone(), origin.clone());
                tools.push(Arc::new(tool));
            }
        }
        (tools, origins)
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

/// Builds every HTTP tool and starts every MCP server (whose tools get the
/// server-wide `risk` / `requires_approval` over their annotations), then
/// applies every `[tools.overrides]` key matching a tool, exact names and
/// globs, least specific first. Overrides matching no tool here are left
/// for the caller (they may target built-in tools).
pub async fn load_tools(
    cfg: &ToolsConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Result<LoadedTools, ToolsError> {
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let mut origins = BTreeMap::new();
    let mut servers: Vec<Arc<McpServer>> = Vec::new();

    let result = async {
        for http in &cfg.http {
            let mut tool = HttpTool::from_config(http, &env)?;
            let mut origin = TrustOrigin::both(RiskSource::HttpTool);
            overridden(tool.spec_mut(), &mut origin, cfg, &mut origins)?;
            tools.push(Arc::new(tool));
        }
        for server_cfg in &cfg.mcp {
            let server = McpServer::start(server_cfg, &env).await?;
            servers.push(Arc::clone(&server));
            for mut tool in server.mcp_tools() {
                let (spec, origin) = tool.trust_mut();
                overridden(spec, origin, cfg, &mut origins)?;
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
    let http = tools[..cfg.http.len()].to_vec();
    let http_origins = http
        .iter()
        .filter_map(|t| {
            let name = &t.spec().name;
            origins.get(name).map(|o| (name.clone(), o.clone()))
        })
        .collect();
    Ok(LoadedTools {
        http,
        http_origins,
        tools,
        origins,
        servers,
        config: cfg.clone(),
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

/// Applies the overrides and records the tool's origin; a name seen before
/// is an error, since two tools must never answer to one name.
fn overridden(
    spec: &mut ToolSpec,
    origin: &mut TrustOrigin,
    cfg: &ToolsConfig,
    origins: &mut BTreeMap<String, TrustOrigin>,
) -> Result<(), ToolsError> {
    if origins.contains_key(&spec.name) {
        return Err(ToolsError::DuplicateTool(spec.name.clone()));
    }
    apply_overrides(spec, origin, cfg);
    origins.insert(spec.name.clone(), origin.clone());
    Ok(())
}
