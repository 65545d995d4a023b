//! The secret values this keel read from its environment, as the one
//! redactor the runtime, memory and the log share.

use anyhow::Context;
use keel_config::{Config, Env};
use keel_protocol::Redactor;
use keel_protocol::redact::{MIN_SECRET_CHARS, is_redactable};

/// The redactor for every secret `config` makes keel read from `env`.
pub fn redactor(config: &Config, env: &dyn Env) -> anyhow::Result<Redactor> {
    let secrets = keel_config::secret_values(config, env);
    Redactor::new(secrets.iter().map(|s| s.value.as_str())).context("redacting secrets")
}

/// Says which secrets are too short to be redacted (by name, never value).
pub fn warn_unredactable(config: &Config, env: &dyn Env) {
    for s in keel_config::secret_values(config, env) {
        if !is_redactable(&s.value) {
            let var = if s.var.is_empty() {
                String::new()
            } else {
                format!(" ({})", s.var)
            };
            tracing::warn!(
                "the secret of {}{var} is shorter than {MIN_SECRET_CHARS} characters: it is not redacted from events, logs or model requests",
                s.key
            );
        }
    }
}
