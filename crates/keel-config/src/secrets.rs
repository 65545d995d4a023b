//! Every secret value the configuration makes keel read, so that one
//! redactor can keep all of them out of events, logs, model requests and
//! memory: the variables named by `*_env` keys, the variables referenced
//! as `${VAR}` in tool headers and MCP server environments, and the
//! password of `server.database_url`.

use crate::env::{Env, referenced_vars};
use crate::model::Config;

/// One secret value and where the configuration asks for it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue {
    /// The configuration key, e.g. `providers[0].api_key_env`.
    pub key: String,
    /// The environment variable it was read from (empty for a value of
    /// the configuration itself).
    pub var: String,
    pub value: String,
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the value.
        f.debug_struct("SecretValue")
            .field("key", &self.key)
            .field("var", &self.var)
            .finish_non_exhaustive()
    }
}

/// The secret values `config` refers to that are set in `env` (unset and
/// empty variables are left out: there is nothing to hide).
pub fn secret_values(config: &Config, env: &dyn Env) -> Vec<SecretValue> {
    let mut out = Vec::new();
    let mut named = |key: String, var: Option<&String>| {
        if let Some(var) = var
            && let Some(value) = env.var(var).filter(|v| !v.is_empty())
        {
            out.push(SecretValue {
                key,
                var: var.clone(),
                value,
            });
        }
    };
    for (i, p) in config.providers.iter().enumerate() {
        named(
            format!("providers[{i}].api_key_env"),
            p.api_key_env.as_ref(),
        );
    }
    named(
        "memory.api_key_env".into(),
        config.memory.api_key_env.as_ref(),
    );
    for (i, k) in config.auth.keys.iter().enumerate() {
        named(format!("auth.keys[{i}].key_env"), Some(&k.key_env));
    }
    for (i, c) in config.channels.iter().enumerate() {
        named(
            format!("channels[{i}].bot_token_env"),
            c.bot_token_env.as_ref(),
        );
        named(
            format!("channels[{i}].secret_token_env"),
            c.secret_token_env.as_ref(),
        );
        named(
            format!("channels[{i}].signing_secret_env"),
            c.signing_secret_env.as_ref(),
        );
    }
    for (i, h) in config.routing.hooks.iter().enumerate() {
        named(
            format!("routing.hooks[{i}].secret_env"),
            h.secret_env.as_ref(),
        );
    }
    for (i, t) in config.tools.http.iter().enumerate() {
        for (name, template) in &t.headers {
            for var in referenced_vars(template).unwrap_or_default() {
                named(
                    format!("tools.http[{i}].headers.{name}"),
                    Some(&var.to_owned()),
                );
            }
        }
    }
    for (i, m) in config.tools.mcp.iter().enumerate() {
        for (name, template) in &m.env {
            for var in referenced_vars(template).unwrap_or_default() {
                named(format!("tools.mcp[{i}].env.{name}"), Some(&var.to_owned()));
            }
        }
    }
    if let Some(password) = config.server.database_url.as_deref().and_then(url_password) {
        out.push(SecretValue {
            key: "server.database_url".into(),
            var: String::new(),
            value: password.to_owned(),
        });
    }
    out
}

/// The password of `scheme://user:password@host/...`, when there is one.
fn url_password(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    let (_, password) = userinfo.split_once(':')?;
    Some(password).filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::MapEnv;

    const CONFIG: &str = r#"
[server]
database_url = "postgres://keel:db-password-1@127.0.0.1:5432/keel"

[[providers]]
name = "main"
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "PROVIDER_KEY"
model = "m"

[[agents]]
id = "default"
provider = "main"

[[tools.http]]
name = "status"
description = "d"
url = "http://127.0.0.1:9/status"
headers = { Authorization = "Bearer ${TOOL_TOKEN}", X-Plain = "literal" }

[[tools.mcp]]
name = "plant"
command = "plant-server"
env = { PLANT_TOKEN = "${MCP_TOKEN}", MODE = "test" }

[[auth.keys]]
key_env = "HTTP_KEY"
tenant = "acme"
principal = "alice"

[[channels]]
id = "tg"
kind = "telegram"
bot_token_env = "TG_BOT"
secret_token_env = "TG_SECRET"

[[channels]]
id = "hook"
kind = "webhook"
signing_secret_env = "HOOK_SECRET"
reply_url = "http://127.0.0.1:9/reply"

[[routing.hooks]]
point = "before_prompt_build"
url = "http://127.0.0.1:9/hook"
secret_env = "DISPATCH_SECRET"

[memory]
embedder = "openai"
embeddings_base_url = "http://127.0.0.1:9/v1"
embeddings_model = "e"
api_key_env = "EMBED_KEY"
"#;

    #[test]
    fn every_secret_the_configuration_names() {
        let env: MapEnv = [
            ("PROVIDER_KEY", "v-provider"),
            ("TOOL_TOKEN", "v-tool"),
            ("MCP_TOKEN", "v-mcp"),
            ("HTTP_KEY", "v-http"),
            ("TG_BOT", "v-tg-bot"),
            ("TG_SECRET", "v-tg-secret"),
            ("HOOK_SECRET", "v-hook"),
            ("DISPATCH_SECRET", "v-dispatch"),
            ("EMBED_KEY", "v-embed"),
            ("UNRELATED", "v-unrelated"),
        ]
        .into_iter()
        .collect();
        let config = crate::load_str(CONFIG, "test", &env).unwrap().config;
        let found = secret_values(&config, &env);
        let mut values: Vec<&str> = found.iter().map(|s| s.value.as_str()).collect();
        values.sort_unstable();
        assert_eq!(
            values,
            [
                "db-password-1",
                "v-dispatch",
                "v-embed",
                "v-hook",
                "v-http",
                "v-mcp",
                "v-provider",
                "v-tg-bot",
                "v-tg-secret",
                "v-tool",
            ]
        );
        let tool = found.iter().find(|s| s.value == "v-tool").unwrap();
        assert_eq!(tool.key, "tools.http[0].headers.Authorization");
        assert_eq!(tool.var, "TOOL_TOKEN");
        assert!(!format!("{found:?}").contains("v-provider"));
    }

    #[test]
    fn unset_and_empty_variables_are_left_out() {
        let env: MapEnv = [("PROVIDER_KEY", "")].into_iter().collect();
        let config = crate::load_str(CONFIG, "test", &env).unwrap().config;
        let found = secret_values(&config, &env);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].key, "server.database_url");
    }

    #[test]
    fn url_passwords() {
        assert_eq!(url_password("postgres://u:p@h/db"), Some("p"));
        assert_eq!(url_password("postgres://u:p:q@h"), Some("p:q"));
        assert_eq!(url_password("postgres://u@h/db"), None);
        assert_eq!(url_password("postgres://h/db?x=a:b@c"), None);
        assert_eq!(url_password("sqlite://data/keel.db"), None);
    }
}
