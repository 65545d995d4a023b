//! A channel's secrets, read from the environment variables its
//! configuration names. They stay wrapped in [`SecretString`] so that no
//! `Debug` output or error message can show them.

use keel_config::{ChannelConfig, ChannelKind, Env, secret_from_env};
use secrecy::SecretString;

/// The secrets one channel needs.
#[derive(Debug, Clone)]
pub struct ChannelSecrets {
    /// Telegram, Slack: the bot token answers are sent with.
    pub bot_token: Option<SecretString>,
    /// What inbound requests are checked with: Telegram's secret token,
    /// Slack's or the webhook's signing secret. A webhook channel also
    /// signs its answers with it.
    pub inbound: SecretString,
}

/// A secret the channel needs is not configured or not set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("channel {channel:?} names no {key}")]
    NotConfigured { channel: String, key: &'static str },
    #[error("channel {channel:?}: environment variable {var} ({key}) is not set")]
    Unset {
        channel: String,
        key: &'static str,
        var: String,
    },
}

impl ChannelSecrets {
    /// Reads the channel's secrets; an empty variable counts as unset.
    pub fn from_env(channel: &ChannelConfig, env: &dyn Env) -> Result<Self, SecretError> {
        let read = |key: &'static str, var: Option<&String>| -> Result<SecretString, SecretError> {
            let var = var.ok_or_else(|| SecretError::NotConfigured {
                channel: channel.id.clone(),
                key,
            })?;
            secret_from_env(env, var).ok_or_else(|| SecretError::Unset {
                channel: channel.id.clone(),
                key,
                var: var.clone(),
            })
        };
        let (inbound_key, inbound_var) = match channel.kind {
            ChannelKind::Telegram => ("secret_token_env", channel.secret_token_env.as_ref()),
            ChannelKind::Slack | ChannelKind::Webhook => {
                ("signing_secret_env", channel.signing_secret_env.as_ref())
            }
        };
        let bot_token = match channel.kind {
            ChannelKind::Telegram | ChannelKind::Slack => {
                Some(read("bot_token_env", channel.bot_token_env.as_ref())?)
            }
            ChannelKind::Webhook => None,
        };
        Ok(Self {
            bot_token,
            inbound: read(inbound_key, inbound_var)?,
        })
    }
}
