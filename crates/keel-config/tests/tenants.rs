//! `[[tenants]]` quotas: values that cannot work are errors naming their key.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use keel_config::{ConfigErrors, Loaded, MapEnv, Severity, load_str};

const PROVIDER: &str = r#"
[[providers]]
name = "main"
kind = "openai"
model = "m"
"#;

fn load(text: &str) -> Result<Loaded, ConfigErrors> {
    load_str(&format!("{PROVIDER}{text}"), "keel.toml", &MapEnv::new())
}

fn errors(result: &Result<Loaded, ConfigErrors>) -> Vec<(String, String)> {
    match result {
        Ok(l) => panic!("loaded, with warnings {:?}", l.warnings),
        Err(e) => {
            e.0.iter()
                .filter(|p| p.severity == Severity::Error)
                .map(|p| (p.key.clone(), p.to_string()))
                .collect()
        }
    }
}

#[test]
fn tenant_quotas_load() {
    let loaded = load(
        r#"
[[tenants]]
id = "acme"
max_concurrent_runs = 10
runs_per_minute = 60
tool_calls_per_day = 5000
tokens_per_day = 2000000

[[tenants]]
id = "globex"
runs_per_minute = 5
"#,
    )
    .unwrap();
    let tenants = &loaded.config.tenants;
    assert_eq!(tenants.len(), 2);
    assert_eq!(tenants[0].max_concurrent_runs, Some(10));
    assert_eq!(tenants[0].tokens_per_day, Some(2_000_000));
    assert_eq!(tenants[1].runs_per_minute, Some(5));
    assert_eq!(tenants[1].tool_calls_per_day, None);
}

#[test]
fn bad_tenant_quotas_are_errors_naming_the_key() {
    let r = load(
        r#"
[[tenants]]
id = "acme"
max_concurrent_runs = 0
runs_per_minute = -5
tool_calls_per_day = "many"
tokens_per_dya = 3

[[tenants]]
id = "acme"

[[tenants]]
runs_per_minute = 1
"#,
    );
    let found = errors(&r);
    let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
    // A negative value and a wrong type are reported by the schema walk.
    for key in [
        "tenants[0].max_concurrent_runs",
        "tenants[0].runs_per_minute",
        "tenants[0].tool_calls_per_day",
        "tenants[0].tokens_per_dya",
        "tenants[1].id",
        "tenants[2].id",
    ] {
        assert!(keys.contains(&key), "no error at {key}: {found:#?}");
    }
    let text: String = found.iter().map(|(_, m)| format!("{m}\n")).collect();
    assert!(
        text.contains("tenants[0].max_concurrent_runs: must be at least 1"),
        "{text}"
    );
    assert!(text.contains("unknown key \"tokens_per_dya\""), "{text}");
    assert!(text.contains("duplicate tenant id \"acme\""), "{text}");
}
