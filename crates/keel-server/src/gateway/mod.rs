//! The chat gateway's running half: the channels of the configuration with
//! their secrets and senders, the router, and the webhook handler that
//! turns a channel message into a run, an answer to a waiting run, a
//! session command or an approval decision (docs/gateway.md). The adapters,
//! routing and request formats are `keel_gateway`'s; this module joins them
//! to the runtime and the store.

mod deliver;
mod hooks;

pub use hooks::HttpAdmission;
pub(crate) mod webhook;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use keel_config::{ChannelConfig, Config, Env};
use keel_gateway::{ChannelSecrets, Outbound, RetryPolicy, Router, Sender};

/// How long one send to a channel's API may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the gateway cannot start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Secret(#[from] keel_gateway::SecretError),
    #[error(transparent)]
    Outbound(#[from] keel_gateway::OutboundError),
    #[error("building the HTTP client for channel sends: {0}")]
    Client(#[from] reqwest::Error),
    #[error(transparent)]
    Hook(#[from] hooks::HookSetupError),
}

/// One configured channel, ready to check requests and send answers.
struct Channel {
    config: ChannelConfig,
    secrets: ChannelSecrets,
    outbound: Outbound,
}

/// Every channel of the configuration, and how messages find their agent.
pub struct Gateway {
    channels: HashMap<String, Channel>,
    /// Swapped whole when the configuration is reloaded: a message is
    /// routed by the bindings it found, never a mix of old and new.
    router: std::sync::RwLock<Arc<Router>>,
    sender: Sender,
    retry: RetryPolicy,
    hooks: std::sync::Arc<Vec<hooks::Hook>>,
    /// For the hooks: no redirects, each call with its hook's timeout.
    http: reqwest::Client,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("channels", &self.channels.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// The gateway of `config`, or `None` when it has no channels. Every
    /// channel's secrets must be set: a channel that could not check its
    /// requests would have to refuse them all.
    pub fn from_config(config: &Config, env: &dyn Env) -> Result<Option<Self>, GatewayError> {
        if config.channels.is_empty() {
            return Ok(None);
        }
        let mut channels = HashMap::new();
        for c in &config.channels {
            let secrets = ChannelSecrets::from_env(c, env)?;
            let outbound = Outbound::new(c, &secrets)?;
            channels.insert(
                c.id.clone(),
                Channel {
                    config: c.clone(),
                    secrets,
                    outbound,
                },
            );
        }
        Ok(Some(Self {
            channels,
            router: std::sync::RwLock::new(Arc::new(Router::new(config))),
            sender: Sender::new(SEND_TIMEOUT)?,
            retry: RetryPolicy::default(),
            hooks: std::sync::Arc::new(hooks::load(&config.routing.hooks, env)?),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
        }))
    }

    /// Sends are retried after `policy` instead of the default.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The router of the current configuration.
    fn router(&self) -> Arc<Router> {
        self.router
            .read()
            .map(|r| r.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Routes by `config` from now on: its bindings, `dm_scope`, default
    /// agent and identity links. Channels (their secrets and APIs) stay as
    /// they were started; a channel added needs a restart.
    pub fn reload_routing(&self, config: &Config) {
        let router = Arc::new(Router::new(config));
        match self.router.write() {
            Ok(mut r) => *r = router,
            Err(p) => *p.into_inner() = router,
        }
    }

    /// The ids of the configured channels.
    pub fn channel_ids(&self) -> Vec<&str> {
        self.channels.keys().map(String::as_str).collect()
    }
}
