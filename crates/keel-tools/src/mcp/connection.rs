//! One session with one server: open the transport (a child process or
//! streamable HTTP), agree on a protocol generation, and the handle calls
//! go through.
//!
//! Two generations are in use: `2026-07-28` (stateless, `server/discover`)
//! and the `initialize` handshake of `2025-11-25` and before, which the
//! reference servers speak. keel asks with `server/discover` first; rmcp
//! falls back to `initialize` on the same connection when the server
//! answers like a legacy one. Servers that answer `server/discover` with
//! something rmcp cannot classify (an empty result, a dropped request) get
//! a second, fresh connection with `initialize` only.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ClientHandler;
use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, ProtocolVersion, ServerNotification,
    SubscriptionFilter,
};
use rmcp::service::{
    ClientInitializeError, ClientLifecycleMode, ClientServiceExt, NotificationContext, Peer,
    RoleClient, RunningService,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStderr;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::http_client::HttpClient;

pub(crate) type Running = RunningService<RoleClient, Handler>;

/// What a call needs: the session, and a token cancelled when the session
/// behind it is gone, so a call in flight does not wait for a dead server.
#[derive(Clone)]
pub(crate) struct Connection {
    pub(crate) peer: Peer<RoleClient>,
    pub(crate) gone: CancellationToken,
}

/// keel's side of the session: it names itself and turns
/// `notifications/tools/list_changed` into a wake-up for the supervisor.
#[derive(Clone)]
pub(crate) struct Handler {
    list_changed: Arc<Notify>,
    protocol: ProtocolVersion,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("keel", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(self.protocol.clone())
    }
}

/// Which lifecycle a server accepted; remembered so a restart does not
/// probe again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Generation {
    /// `server/discover`, per-request metadata (`2026-07-28`).
    Discover,
    /// `initialize` / `notifications/initialized` (`2025-11-25` and before).
    Initialize,
}

/// Where the server is.
#[derive(Debug, Clone)]
pub(crate) enum Endpoint {
    Stdio {
        command: String,
        args: Vec<String>,
        /// The complete environment of the process.
        env: Vec<(String, String)>,
    },
    Http {
        url: String,
        client: reqwest::Client,
    },
}

/// How to (re)connect to one server.
#[derive(Clone)]
pub(crate) struct Launch {
    pub(crate) server: String,
    pub(crate) endpoint: Endpoint,
    pub(crate) startup_timeout: Duration,
    pub(crate) list_changed: Arc<Notify>,
}

impl Launch {
    /// Opens a session, trying `hint` first when a previous session told
    /// us which generation the server speaks.
    pub(crate) async fn connect(
        &self,
        hint: Option<Generation>,
    ) -> Result<(Running, Generation), String> {
        if hint == Some(Generation::Initialize) {
            return match self.open(Generation::Initialize).await {
                Ok(running) => Ok((running, Generation::Initialize)),
                Err(Failure::Fatal(e) | Failure::Protocol(e)) => Err(e),
            };
        }
        match self.open(Generation::Discover).await {
            Ok(running) => {
                let generation = match protocol_of(running.peer()) {
                    Some(v) if !v.has_initialize() => Generation::Discover,
                    _ => Generation::Initialize,
                };
                Ok((running, generation))
            }
            Err(Failure::Fatal(e)) => Err(e),
            Err(Failure::Protocol(discover)) => {
                tracing::debug!(server = %self.server, error = %discover,
                    "server/discover failed; retrying with initialize");
                match self.open(Generation::Initialize).await {
                    Ok(running) => Ok((running, Generation::Initialize)),
                    Err(Failure::Fatal(e) | Failure::Protocol(e)) => Err(format!(
                        "server/discover failed ({discover}), then initialize failed ({e})"
                    )),
                }
            }
        }
    }

    async fn open(&self, generation: Generation) -> Result<Running, Failure> {
        let (lifecycle, protocol) = match generation {
            Generation::Discover => (
                ClientLifecycleMode::Auto {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                    legacy_version: Some(ProtocolVersion::V_2025_11_25),
                },
                ProtocolVersion::V_2026_07_28,
            ),
            Generation::Initialize => (
                ClientLifecycleMode::Initialize,
                ProtocolVersion::V_2025_11_25,
            ),
        };
        let handler = Handler {
            list_changed: Arc::clone(&self.list_changed),
            protocol,
        };
        let serving = match &self.endpoint {
            Endpoint::Stdio { command, args, env } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args)
                    .env_clear()
                    .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                    .kill_on_drop(true);
                let (transport, stderr) = TokioChildProcess::builder(cmd)
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|e| Failure::Fatal(format!("cannot spawn: {e}")))?;
                if let Some(stderr) = stderr {
                    tokio::spawn(forward_stderr(self.server.clone(), stderr));
                }
                self.handshake(handler.serve_with_lifecycle(transport, lifecycle))
                    .await
            }
            Endpoint::Http { url, client } => {
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                config.reinit_on_expired_session = true;
                let client = HttpClient::new(client.clone(), Arc::clone(&self.list_changed));
                let transport = StreamableHttpClientTransport::with_client(client, config);
                self.handshake(handler.serve_with_lifecycle(transport, lifecycle))
                    .await
            }
        }?;
        Ok(serving)
    }

    async fn handshake(
        &self,
        serving: impl Future<Output = Result<Running, ClientInitializeError>>,
    ) -> Result<Running, Failure> {
        match tokio::time::timeout(self.startup_timeout, serving).await {
            Ok(Ok(running)) => Ok(running),
            // Another lifecycle will not get past a 401 either.
            Ok(Err(e)) if e.is_authorization_required() => Err(Failure::Fatal(format!(
                "the server requires authorization, which keel does not support for MCP: {e}"
            ))),
            Ok(Err(e)) => Err(Failure::Protocol(format!("handshake failed: {e}"))),
            Err(_) => Err(Failure::Protocol(format!(
                "handshake took longer than {:?}",
                self.startup_timeout
            ))),
        }
    }
}

/// Why a session could not be opened: `Fatal` when trying again with
/// another lifecycle cannot help (the program does not exist).
enum Failure {
    Fatal(String),
    Protocol(String),
}

/// On a `2026-07-28` session, notifications arrive only on a
/// `subscriptions/listen` stream the client opens; open it (waiting for
/// the server's acknowledgment, so no change after this call is missed) and
/// forward its `tools/list_changed` to the same wake-up the legacy path
/// uses. Legacy sessions get them unsolicited and need nothing here.
pub(crate) async fn listen_for_changes(
    running: &Running,
    list_changed: Arc<Notify>,
    gone: CancellationToken,
    timeout: Duration,
) {
    let peer = running.peer().clone();
    let modern = protocol_of(&peer).is_some_and(|v| !v.has_initialize());
    let announces = peer
        .peer_info()
        .and_then(|info| info.capabilities.tools.as_ref()?.list_changed)
        .unwrap_or(false);
    if !modern || !announces {
        return;
    }
    let filter = SubscriptionFilter::builder().tools_list_changed().build();
    let mut subscription = match tokio::time::timeout(timeout, peer.listen(filter)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "mcp subscriptions/listen failed; tool changes will not be seen");
            return;
        }
        Err(_) => {
            tracing::warn!(
                "mcp subscriptions/listen was not acknowledged in time; tool changes will not be seen"
            );
            return;
        }
    };
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                n = subscription.next() => n,
                () = gone.cancelled() => return,
            };
            match next {
                Ok(Some(ServerNotification::ToolListChangedNotification(_))) => {
                    list_changed.notify_one();
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    });
}

/// The protocol version the session agreed on.
pub(crate) fn protocol_of(peer: &Peer<RoleClient>) -> Option<ProtocolVersion> {
    peer.peer_info().map(|info| info.protocol_version.clone())
}

/// A server's stderr is its log; keep it in keel's log, tagged with the server.
async fn forward_stderr(server: String, stderr: ChildStderr) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::info!(target: "keel_tools::mcp::stderr", server = %server, "{line}");
    }
}
