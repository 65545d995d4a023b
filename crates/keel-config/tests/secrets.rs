#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_config::{MapEnv, expand_env_refs, load_str, secret_from_env};
use secrecy::ExposeSecret;

const TEXT: &str = r#"
[[providers]]
name = "main"
kind = "openai"
model = "m"
api_key_env = "MAIN_KEY"

[[tools.http]]
name = "t"
description = "d"
url = "http://127.0.0.1:1/"
headers = { Authorization = "Bearer ${TOOL_TOKEN}", X-Literal = "$${NOT_EXPANDED}" }

[[auth.keys]]
key_env = "KEEL_KEY_ACME"
tenant = "acme"
principal = "alice"
"#;

#[test]
fn secrets_are_read_through_the_references_the_config_names() {
    let env = MapEnv::new()
        .with("MAIN_KEY", "sk-main")
        .with("TOOL_TOKEN", "tok")
        .with("KEEL_KEY_ACME", "acme-key");
    let loaded = load_str(TEXT, "keel.toml", &env).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = &loaded.config;

    let var = c.providers[0].api_key_env.as_deref().unwrap();
    assert_eq!(
        secret_from_env(&env, var).unwrap().expose_secret(),
        "sk-main"
    );
    assert_eq!(
        secret_from_env(&env, &c.auth.keys[0].key_env)
            .unwrap()
            .expose_secret(),
        "acme-key"
    );
    // The config itself holds only the names, never the values.
    assert!(!format!("{c:?}").contains("sk-main"));

    let headers = &c.tools.http[0].headers;
    assert_eq!(
        expand_env_refs(&headers["Authorization"], &env).unwrap(),
        "Bearer tok"
    );
    assert_eq!(
        expand_env_refs(&headers["X-Literal"], &env).unwrap(),
        "${NOT_EXPANDED}"
    );
}

#[test]
fn missing_secrets_are_warnings_and_expansion_errors_name_the_variable() {
    let env = MapEnv::new();
    let loaded = load_str(TEXT, "keel.toml", &env).unwrap();
    let keys: Vec<_> = loaded.warnings.iter().map(|w| w.key.as_str()).collect();
    assert_eq!(
        keys,
        vec![
            "providers[0].api_key_env",
            "tools.http[0].headers.Authorization",
            "auth.keys[0].key_env"
        ]
    );
    assert!(secret_from_env(&env, "MAIN_KEY").is_none());
    let err =
        expand_env_refs(&loaded.config.tools.http[0].headers["Authorization"], &env).unwrap_err();
    assert!(err.contains("TOOL_TOKEN"), "{err}");
}
