//! One session with one server process: spawn, initialize, and the handle
//! calls go through.

use std::process::Stdio;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::service::{Peer, RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStderr;
use tokio_util::sync::CancellationToken;

pub(crate) type Running = RunningService<RoleClient, ()>;

/// What a call needs: the session, and a token cancelled when the process
/// behind it is gone, so a call in flight does not wait for a dead server.
#[derive(Clone)]
pub(crate) struct Connection {
    pub(crate) peer: Peer<RoleClient>,
    pub(crate) gone: CancellationToken,
}

/// How to (re)start one server.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub(crate) server: String,
    pub(crate) command: String,
    pub(crate) args: Vec<String>,
    /// The complete environment of the process.
    pub(crate) env: Vec<(String, String)>,
    pub(crate) startup_timeout: Duration,
}

impl Launch {
    /// Spawns the process and completes the MCP handshake.
    pub(crate) async fn connect(&self) -> Result<Running, String> {
        let mut cmd = tokio::process::Command::new(&self.command);
        cmd.args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .kill_on_drop(true);
        let (transport, stderr) = TokioChildProcess::builder(cmd)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot spawn: {e}"))?;
        if let Some(stderr) = stderr {
            tokio::spawn(forward_stderr(self.server.clone(), stderr));
        }
        match tokio::time::timeout(self.startup_timeout, ().serve(transport)).await {
            Ok(Ok(running)) => Ok(running),
            Ok(Err(e)) => Err(format!("initialize failed: {e}")),
            Err(_) => Err(format!(
                "initialize took longer than {:?}",
                self.startup_timeout
            )),
        }
    }
}

/// A server's stderr is its log; keep it in keel's log, tagged with the server.
async fn forward_stderr(server: String, stderr: ChildStderr) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::info!(target: "keel_tools::mcp::stderr", server = %server, "{line}");
    }
}
