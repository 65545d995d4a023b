//! The first run with no configuration file: SQLite under the data dir, the
//! embedded local model, every available tool, one demo agent.

use keel_config::{Config, Env, ProviderKind};

/// The default configuration when keel runs without a file, or `None` when
/// the OpenAI-compatible default applies (`OPENAI_BASE_URL` is set, or this
/// build has no local model).
pub fn local_default_text(env: &dyn Env) -> Option<String> {
    if !cfg!(feature = "local") || env.var("OPENAI_BASE_URL").is_some_and(|v| !v.is_empty()) {
        return None;
    }
    let model = env
        .var("KEEL_MODEL")
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| DEFAULT_LOCAL_MODEL.into());
    Some(format!(
        r#"[[providers]]
name = "default"
kind = "local"
model = {model}

[[agents]]
id = "default"
provider = "default"
system_prompt = "You are keel's demo assistant. Answer briefly. Use a tool only when the question needs one."
tools = ["*"]

# A small local model cannot judge its own course: reflections would only
# add calls. Loop detection and budgets still bound every run.
[agents.drift]
enabled = false
"#,
        model = toml_quote(&model),
    ))
}

#[cfg(feature = "local")]
const DEFAULT_LOCAL_MODEL: &str = keel_local::DEFAULT_MODEL;
#[cfg(not(feature = "local"))]
const DEFAULT_LOCAL_MODEL: &str = "smollm2-135m";

fn toml_quote(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// One log line saying what the built-in defaults are and how to point keel
/// at a real provider.
pub fn announce(config: &Config) {
    let provider = config.providers.first();
    let model = provider.map_or("none", |p| p.model.as_str());
    let kind = match provider.map(|p| p.kind) {
        Some(ProviderKind::Local) => "local model",
        Some(ProviderKind::Openai) => "OpenAI-compatible model",
        Some(ProviderKind::Anthropic) => "Anthropic model",
        None => "no model",
    };
    tracing::info!(
        "no keel.toml — defaults: {kind} `{model}`, SQLite under {}, all tools, agent `default`. \
         For a real provider set OPENAI_BASE_URL (+ OPENAI_API_KEY, KEEL_MODEL) or pass --config keel.toml.",
        config.server.data_dir
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    struct MapEnv(BTreeMap<String, String>);
    impl Env for MapEnv {
        fn var(&self, key: &str) -> Option<String> {
            self.0.get(key).cloned()
        }
        fn vars(&self) -> Vec<(String, String)> {
            self.0.clone().into_iter().collect()
        }
    }

    #[test]
    fn local_default_unless_an_openai_endpoint_is_named() {
        let empty = MapEnv(BTreeMap::new());
        let text = local_default_text(&empty);
        if cfg!(feature = "local") {
            let text = text.unwrap();
            let loaded = keel_config::load_str(&text, "defaults", &empty).unwrap();
            assert_eq!(loaded.config.providers[0].kind, ProviderKind::Local);
            assert_eq!(loaded.config.providers[0].model, "smollm2-135m");
        } else {
            assert!(text.is_none());
        }
        let openai = MapEnv(BTreeMap::from([(
            "OPENAI_BASE_URL".to_string(),
            "http://127.0.0.1:1/v1".to_string(),
        )]));
        assert!(local_default_text(&openai).is_none());
    }
}
