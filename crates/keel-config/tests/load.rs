#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use keel_config::{
    ConfigErrors, Loaded, MapEnv, ProviderKind, Routing, Severity, load_file, load_str,
    render_report,
};
use keel_protocol::Risk;

fn fixture() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/spec_example.toml"
    ))
}

fn spec_env() -> MapEnv {
    MapEnv::new()
        .with("OPENAI_API_KEY", "sk-test")
        .with("KEEL_KEY_ACME", "acme-secret")
}

fn problems(result: &Result<Loaded, ConfigErrors>) -> Vec<String> {
    match result {
        Ok(l) => l.warnings.iter().map(ToString::to_string).collect(),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn spec_example_loads_as_written() {
    let loaded = load_file(fixture(), &spec_env()).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = &loaded.config;
    assert_eq!(c.server.bind, "127.0.0.1:8780");
    assert_eq!(
        c.server.database_url.as_deref(),
        Some("sqlite://./data/keel.db")
    );
    assert_eq!(c.providers.len(), 1);
    assert_eq!(c.providers[0].name, "main");
    assert_eq!(c.providers[0].kind, ProviderKind::Openai);
    assert_eq!(c.providers[0].context_window, Some(32768));
    assert_eq!(
        c.providers[0].api_key_env.as_deref(),
        Some("OPENAI_API_KEY")
    );
    let agent = &c.agents[0];
    assert_eq!(agent.provider, "main");
    assert_eq!(agent.routing, Routing::SingleLoop);
    assert_eq!(agent.tools.len(), 4);
    assert_eq!(agent.limits.max_steps, 12);
    assert_eq!(
        agent.limits.max_repairs, 2,
        "unset limits keep their defaults"
    );
    assert_eq!(agent.loop_detection.repeat_critical, 5);
    assert_eq!(agent.drift.checkpoint_interval, 5);
    assert_eq!(c.tools.mcp[0].command.as_deref(), Some("python3"));
    assert_eq!(c.tools.http[0].parameters["required"][0], "furnace_id");
    assert_eq!(c.tools.http[0].risk, Some(Risk::Read));
    let ov = &c.tools.overrides["plant.restart_furnace"];
    assert_eq!(ov.risk, Some(Risk::Dangerous));
    assert_eq!(ov.roles.as_deref(), Some(&["operator".to_string()][..]));
    assert_eq!(c.auth.keys[0].principal, "alice");
    assert_eq!(c.auth.approver_roles, vec!["approver"]);

    let report = render_report("keel.toml", &Ok(loaded));
    assert_eq!(
        report,
        "keel.toml: OK (1 provider, 1 agent, 1 mcp server, 1 http tool, 1 tool override, 1 api key)\n"
    );
}

#[test]
fn spec_example_without_secrets_warns_about_each_missing_variable() {
    let loaded = load_file(fixture(), &MapEnv::new()).unwrap();
    let keys: Vec<_> = loaded.warnings.iter().map(|w| w.key.as_str()).collect();
    assert_eq!(
        keys,
        vec!["providers[0].api_key_env", "auth.keys[0].key_env"]
    );
    let shown = problems(&Ok(loaded.clone()));
    assert!(shown[0].contains("OPENAI_API_KEY"), "{shown:?}");
    assert!(
        shown[0].contains(":10:"),
        "api_key_env is on line 10: {shown:?}"
    );
    assert!(shown[1].contains("KEEL_KEY_ACME"), "{shown:?}");
    let report = render_report("keel.toml", &Ok(loaded));
    assert!(report.ends_with(", 2 warnings\n"), "{report}");
}

const THREE_MISTAKES: &str = r#"[server]
bind = "127.0.0.1:8780"
colour = "blue"

[[providers]]
name = "main"
kind = "openai"
model = "m"

[[agents]]
id = "default"
provider = "mian"

[agents.limits]
max_steps = "twelve"
"#;

#[test]
fn unknown_key_wrong_type_and_dangling_reference_are_reported_together() {
    let result = load_str(THREE_MISTAKES, "keel.toml", &MapEnv::new());
    let err = result.as_ref().unwrap_err();
    let found: Vec<_> = err
        .0
        .iter()
        .map(|p| {
            (
                p.severity,
                p.key.as_str(),
                p.location.as_deref().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        found,
        vec![
            (Severity::Error, "server.colour", "keel.toml:3:1"),
            (Severity::Error, "agents[0].provider", "keel.toml:12:1"),
            (
                Severity::Error,
                "agents[0].limits.max_steps",
                "keel.toml:15:1"
            ),
        ]
    );
    let text = err.to_string();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[0].contains("unknown key \"colour\""), "{text}");
    assert_eq!(
        lines[1],
        "keel.toml:12:1: agents[0].provider: no provider named \"mian\" (known: main)"
    );
    assert!(lines[2].contains("found string \"twelve\""), "{text}");
    assert!(lines[2].contains("expected an integer"), "{text}");

    let report = render_report("keel.toml", &result);
    assert!(report.starts_with(&text), "{report}");
    assert!(report.ends_with("\nkeel.toml: 3 errors\n"), "{report}");
}

#[test]
fn problems_in_different_elements_do_not_hide_each_other() {
    let text = r#"
[[providers]]
name = "a"
kind = "openai"
model = "m"
temprature = 0.2

[[providers]]
name = "b"
kind = "gemini"
model = "m"

[[providers]]
kind = "local"
model = 5

[[agents]]
id = "x"
provider = "b"
tools = ["memory_search", 7]
[agents.loop_detection]
enabled = "yes"
"#;
    let err = load_str(text, "k.toml", &MapEnv::new()).unwrap_err();
    let keys: Vec<_> = err.0.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        vec![
            "providers[0].temprature",
            "providers[1].kind",
            "providers[2].name",
            "providers[2].model",
            "agents[0].tools[1]",
            "agents[0].loop_detection.enabled",
        ],
        "{err}"
    );
    // The reference to provider "b" resolves: its bad kind does not make
    // it disappear.
    assert!(!err.to_string().contains("no provider named"), "{err}");
    assert!(
        err.0[1]
            .message
            .contains("one of \"openai\", \"anthropic\", \"local\"")
    );
    assert!(err.0[2].message.contains("missing required key \"name\""));
    assert_eq!(err.0[2].location.as_deref(), Some("k.toml:13:1"));
}

#[test]
fn literal_secrets_are_unknown_keys_with_a_hint() {
    let text = r#"
[[providers]]
name = "main"
kind = "anthropic"
model = "claude"
api_key = "sk-live-123"

[[auth.keys]]
key = "abc"
tenant = "t"
principal = "p"
"#;
    let err = load_str(text, "keel.toml", &MapEnv::new()).unwrap_err();
    let shown = err.to_string();
    let lines: Vec<_> = shown.lines().collect();
    assert_eq!(lines.len(), 3, "{shown}");
    assert!(
        lines[0].starts_with("keel.toml:6:1: providers[0].api_key: unknown key \"api_key\"")
            && lines[0].contains("secrets are read from env: use api_key_env"),
        "{shown}"
    );
    // The element header (line 8) comes before the key inside it (line 9).
    assert!(
        lines[1].starts_with("keel.toml:8:1: auth.keys[0].key_env: missing required key"),
        "{shown}"
    );
    assert!(
        lines[2].starts_with("keel.toml:9:1: auth.keys[0].key:")
            && lines[2].contains("use key_env"),
        "{shown}"
    );
    assert!(
        !shown.contains("sk-live-123"),
        "a secret value must never be echoed"
    );
}

#[test]
fn toml_syntax_error_names_its_line() {
    let text = "[server]\nbind = \"127.0.0.1:1\"\ndata_dir = \n\n[[agents]]\n";
    let err = load_str(text, "keel.toml", &MapEnv::new()).unwrap_err();
    assert!(!err.0.is_empty());
    let first = &err.0[0];
    assert_eq!(first.severity, Severity::Error);
    let location = first.location.as_deref().unwrap();
    assert!(location.starts_with("keel.toml:3:"), "{err}");
    assert!(first.message.starts_with("TOML syntax error"), "{err}");
}

#[test]
fn unreadable_file_is_a_problem_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let result = load_file(&missing, &MapEnv::new());
    let report = render_report("nope.toml", &result);
    assert!(
        report.contains("cannot read the configuration file"),
        "{report}"
    );
    assert!(report.ends_with("nope.toml: 1 error\n"), "{report}");
}

#[test]
fn load_file_names_the_path_in_locations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.toml");
    std::fs::write(&path, "[server]\n\nbnd = \"x\"\n").unwrap();
    let err = load_file(&path, &MapEnv::new()).unwrap_err();
    assert_eq!(err.0.len(), 1, "{err}");
    assert_eq!(err.0[0].location, Some(format!("{}:3:1", path.display())));
    assert!(err.0[0].message.contains("did you mean \"bind\""), "{err}");
}

#[test]
fn empty_file_is_the_default_config() {
    let loaded = load_str("", "keel.toml", &MapEnv::new()).unwrap();
    assert_eq!(loaded.config, keel_config::Config::default());
    assert!(loaded.warnings.is_empty());
}
