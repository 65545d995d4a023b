#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use keel_config::{ConfigErrors, MapEnv, Severity, ToolMode, load_file, load_str};

fn spec() -> String {
    std::fs::read_to_string(Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/spec_example.toml"
    )))
    .unwrap()
}

fn base_env() -> MapEnv {
    MapEnv::new()
        .with("OPENAI_API_KEY", "sk-test")
        .with("KEEL_KEY_ACME", "acme-secret")
}

fn load_spec(env: &MapEnv) -> Result<keel_config::Loaded, ConfigErrors> {
    load_str(&spec(), "keel.toml", env)
}

#[test]
fn nested_overrides_select_elements_by_name() {
    let env = base_env()
        .with("KEEL_PROVIDERS__MAIN__BASE_URL", "http://127.0.0.1:9999/v1")
        .with("KEEL_PROVIDERS__MAIN__CONTEXT_WINDOW", "8192")
        .with("KEEL_PROVIDERS__MAIN__TOOL_MODE", "json")
        .with("KEEL_AGENTS__DEFAULT__LIMITS__MAX_STEPS", "7")
        .with("KEEL_AGENTS__DEFAULT__LOOP_DETECTION__ENABLED", "false")
        .with(
            "KEEL_AGENTS__DEFAULT__TOOLS",
            r#"["plant.*", "furnace_status"]"#,
        )
        .with("KEEL_TOOLS__HTTP__FURNACE_STATUS__TIMEOUT_S", "9")
        .with("KEEL_VERIFY__TENANT_FIELD", "org");
    let c = load_spec(&env).unwrap().config;
    assert_eq!(
        c.providers[0].base_url.as_deref(),
        Some("http://127.0.0.1:9999/v1")
    );
    assert_eq!(c.providers[0].context_window, Some(8192));
    assert_eq!(c.providers[0].tool_mode, ToolMode::Json);
    assert_eq!(c.agents[0].limits.max_steps, 7);
    assert_eq!(
        c.agents[0].limits.max_tool_calls, 20,
        "siblings stay as written"
    );
    assert!(!c.agents[0].loop_detection.enabled);
    assert_eq!(c.agents[0].tools, vec!["plant.*", "furnace_status"]);
    assert_eq!(c.tools.http[0].timeout_s, Some(9));
    assert_eq!(c.verify.tenant_field, "org");
}

#[test]
fn overrides_select_elements_by_index_and_create_missing_tables() {
    let text = r#"
[[providers]]
name = "main"
kind = "local"
model = "m"

[[agents]]
id = "a"
provider = "main"
"#;
    let env = MapEnv::new()
        .with("KEEL_AGENTS__0__LIMITS__MAX_STEPS", "4")
        .with("KEEL_AGENTS__0__DRIFT__REFLECTION_INTERVAL", "0")
        .with("keel_providers__0__model", "lowercase-works");
    let c = load_str(text, "keel.toml", &env).unwrap().config;
    assert_eq!(c.agents[0].limits.max_steps, 4);
    assert_eq!(c.agents[0].drift.reflection_interval, 0);
    assert_eq!(c.providers[0].model, "lowercase-works");
}

#[test]
fn short_aliases_set_server_keys() {
    let env = base_env()
        .with("KEEL_BIND", "0.0.0.0:9000")
        .with("KEEL_DATA_DIR", "/var/lib/keel")
        .with("KEEL_DATABASE_URL", "postgres://keel@db/keel")
        .with("KEEL_CONFIG", "/etc/keel.toml")
        .with("KEEL_LOG", "debug");
    let loaded = load_spec(&env).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let s = &loaded.config.server;
    assert_eq!(s.bind, "0.0.0.0:9000");
    assert_eq!(s.data_dir, "/var/lib/keel");
    assert_eq!(s.database_url.as_deref(), Some("postgres://keel@db/keel"));
}

#[test]
fn string_fields_take_the_value_verbatim() {
    // "12" parses as a TOML integer, but the model name is a string.
    let env = base_env()
        .with("KEEL_PROVIDERS__MAIN__MODEL", "12")
        .with("KEEL_AGENTS__DEFAULT__SYSTEM_PROMPT", "\"quoted\"");
    let c = load_spec(&env).unwrap().config;
    assert_eq!(c.providers[0].model, "12");
    assert_eq!(c.agents[0].system_prompt, "quoted");
}

#[test]
fn variables_without_double_underscore_are_not_overrides() {
    let env = base_env()
        .with("KEEL_SOMETHING_SECRET", "x")
        .with("KEEL_KEY_OTHER", "y")
        .with("OTHER__THING", "z");
    let loaded = load_spec(&env).unwrap();
    assert!(loaded.warnings.is_empty());
}

#[test]
fn bad_override_paths_and_values_name_the_variable() {
    let env = base_env()
        .with("KEEL_SERVER__BINDD", "x")
        .with("KEEL_PROVIDERS__NOPE__MODEL", "m")
        .with("KEEL_AGENTS__DEFAULT__LIMITS__MAX_STEPS", "lots")
        .with("KEEL_AGENTS__DEFAULT__PROVIDER", "ghost")
        .with("KEEL_PROVIDERS__MAIN__API_KEY", "sk-oops")
        .with("KEEL_SERVER__BIND__X", "1");
    let err = load_spec(&env).unwrap_err();
    let got: Vec<_> = err
        .0
        .iter()
        .map(|p| (p.key.as_str(), p.location.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "agents[0].limits.max_steps",
                "env KEEL_AGENTS__DEFAULT__LIMITS__MAX_STEPS"
            ),
            ("agents[0].provider", "env KEEL_AGENTS__DEFAULT__PROVIDER"),
            ("providers[0].api_key", "env KEEL_PROVIDERS__MAIN__API_KEY"),
            ("providers", "env KEEL_PROVIDERS__NOPE__MODEL"),
            ("server.bindd", "env KEEL_SERVER__BINDD"),
            ("server.bind", "env KEEL_SERVER__BIND__X"),
        ],
        "{err}"
    );
    assert!(err.0.iter().all(|p| p.severity == Severity::Error));
    let text = err.to_string();
    assert!(
        text.contains("no element \"nope\" to override (known: main)"),
        "{text}"
    );
    assert!(
        text.contains("no provider named \"ghost\" (known: main)"),
        "{text}"
    );
    assert!(text.contains("found string \"lots\""), "{text}");
    assert!(text.contains("did you mean \"bind\"?"), "{text}");
    assert!(text.contains("use api_key_env"), "{text}");
    assert!(!text.contains("sk-oops"), "{text}");
    assert!(
        text.contains("server.bind: is a string, so an override cannot name a key inside it"),
        "{text}"
    );
}

#[test]
fn override_into_a_wrongly_typed_file_value_says_why_it_cannot_apply() {
    let text = "[[providers]]\nname = \"p\"\nkind = \"local\"\nmodel = \"m\"\n[[agents]]\nid = \"a\"\nprovider = \"p\"\nlimits = 5\n";
    let env = MapEnv::new().with("KEEL_AGENTS__A__LIMITS__MAX_STEPS", "3");
    let err = load_str(text, "keel.toml", &env).unwrap_err();
    let shown: Vec<_> = err.0.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        vec![
            "keel.toml:8:1: agents[0].limits: expected a table, found integer 5",
            "env KEEL_AGENTS__A__LIMITS__MAX_STEPS: agents[0].limits: cannot override inside it: the file sets it to integer 5",
        ]
    );
}

#[test]
fn override_can_fix_what_the_file_gets_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.toml");
    std::fs::write(&path, "[server]\nbind = \"nowhere\"\n").unwrap();
    let err = load_file(&path, &MapEnv::new()).unwrap_err();
    assert_eq!(err.0[0].key, "server.bind");
    let env = MapEnv::new().with("KEEL_SERVER__BIND", "127.0.0.1:0");
    let loaded = load_file(&path, &env).unwrap();
    assert_eq!(loaded.config.server.bind, "127.0.0.1:0");
}

#[test]
fn override_map_keys_and_inline_tables() {
    let env = base_env()
        .with("KEEL_TOOLS__OVERRIDES__FURNACE_STATUS__RISK", "write")
        .with(
            "KEEL_AGENTS__DEFAULT__LIMITS",
            "{ max_steps = 3, max_tokens = 1000 }",
        );
    let c = load_spec(&env).unwrap().config;
    assert_eq!(
        c.tools.overrides["furnace_status"].risk,
        Some(keel_protocol::Risk::Write)
    );
    assert_eq!(c.tools.overrides.len(), 2);
    assert_eq!(c.agents[0].limits.max_steps, 3);
    assert_eq!(c.agents[0].limits.max_tokens, 1000);
    // An inline table replaces the table: unset limits are defaults again.
    assert_eq!(c.agents[0].limits.max_tool_calls, 20);

    let bad = base_env().with("KEEL_AGENTS__DEFAULT__LIMITS", "{ max_stepz = 3 }");
    let err = load_spec(&bad).unwrap_err();
    assert_eq!(err.0.len(), 1, "{err}");
    assert_eq!(err.0[0].key, "agents[0].limits.max_stepz");
    assert_eq!(
        err.0[0].location.as_deref(),
        Some("env KEEL_AGENTS__DEFAULT__LIMITS")
    );
}
