//! Turns the `[tools]` configuration into ready tools.

use std::collections::BTreeSet;
use std::sync::Arc;

use keel_config::ToolsConfig;
use keel_protocol::{Tool, ToolSpec};

use crate::http::HttpTool;
use crate::mcp::McpServer;
use crate::{ToolsError, apply_override};

/// Tools built from configuration, plus the servers behind the MCP ones;
/// keep `servers` alive as long as the tools are used, and shut them down
/// on exit.
pub struct LoadedTools {
    pub tools: Vec<Arc<dyn Tool>>,
    pub servers: Vec<Arc<McpServer>>,
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
    Ok(LoadedTools { tools, servers })
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
