#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The `[memory]` section: defaults, accepted values, and the checks that
//! need more than a type.

use keel_config::{ConfigErrors, EmbedderKind, Loaded, MapEnv, load_str};

const PROVIDER: &str = r#"
[[providers]]
name = "main"
kind = "openai"
model = "m"
"#;

fn load(text: &str) -> Result<Loaded, ConfigErrors> {
    load_str(&format!("{PROVIDER}{text}"), "keel.toml", &MapEnv::new())
}

fn error_keys(result: &Result<Loaded, ConfigErrors>) -> Vec<String> {
    match result {
        Ok(_) => Vec::new(),
        Err(e) => e.0.iter().map(|p| p.key.clone()).collect(),
    }
}

#[test]
fn defaults_are_local_embedder_and_documented_numbers() {
    let loaded = load("").unwrap();
    let m = &loaded.config.memory;
    assert_eq!(m.embedder, EmbedderKind::Local);
    assert_eq!((m.chunk_tokens, m.chunk_overlap), (256, 32));
    assert!((m.mmr_lambda - 0.7).abs() < 1e-9);
    assert_eq!(m.time_decay_half_life_days, 0.0);
    assert_eq!(m.summary_fallback_messages, 20);
}

#[test]
fn a_full_section_loads() {
    let loaded = load(
        r#"
[memory]
embedder = "openai"
embeddings_base_url = "http://127.0.0.1:9000/v1"
embeddings_model = "text-embedding-3-small"
chunk_tokens = 128
chunk_overlap = 16
text_weight = 0.5
vector_weight = 0.5
mmr_lambda = 1
time_decay_half_life_days = 30
summary_fallback_messages = 10
"#,
    )
    .unwrap();
    let m = &loaded.config.memory;
    assert_eq!(m.embedder, EmbedderKind::Openai);
    assert_eq!(
        m.embeddings_model.as_deref(),
        Some("text-embedding-3-small")
    );
    assert_eq!(m.chunk_tokens, 128);
    assert_eq!(m.time_decay_half_life_days, 30.0);
}

#[test]
fn impossible_values_are_errors_naming_the_key() {
    let r = load(
        r#"
[memory]
embedder = "openai"
chunk_tokens = 10
chunk_overlap = 10
mmr_lambda = 1.5
text_weight = -1
"#,
    );
    let keys = error_keys(&r);
    for key in [
        "memory.chunk_overlap",
        "memory.mmr_lambda",
        "memory.text_weight",
        "memory.embeddings_base_url",
        "memory.embeddings_model",
    ] {
        assert!(keys.iter().any(|k| k == key), "{key} missing from {keys:?}");
    }
    let r = load("[memory]\nembedder = \"sentencepiece\"\n");
    assert_eq!(error_keys(&r), ["memory.embedder"]);
    let r = load("[memory]\nembeder = \"none\"\n");
    assert!(r.unwrap_err().to_string().contains("embedder"));
}
