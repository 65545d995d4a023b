#![allow(clippy::unwrap_used, clippy::expect_used)]

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

/// (severity, key) of every problem, in report order.
fn keys(result: &Result<Loaded, ConfigErrors>) -> Vec<(Severity, String)> {
    let problems = match result {
        Ok(l) => &l.warnings,
        Err(e) => &e.0,
    };
    problems
        .iter()
        .map(|p| (p.severity, p.key.clone()))
        .collect()
}

fn messages(result: &Result<Loaded, ConfigErrors>) -> String {
    match result {
        Ok(l) => l.warnings.iter().map(|p| format!("{p}\n")).collect(),
        Err(e) => e.to_string(),
    }
}

use Severity::{Error as E, Warning as W};

fn k(s: Severity, key: &str) -> (Severity, String) {
    (s, key.to_string())
}

#[test]
fn duplicate_names_are_errors_pointing_at_the_first() {
    let r = load(
        r#"
[[providers]]
name = "main"
kind = "local"
model = "x"

[[agents]]
id = "a"
provider = "main"
[[agents]]
id = "a"
provider = "main"

[[tools.mcp]]
name = "plant"
command = "p"
[[tools.mcp]]
name = "plant"
url = "http://127.0.0.1:1/mcp"

[[tools.http]]
name = "t"
description = "d"
url = "http://127.0.0.1:1/"
[[tools.http]]
name = "t"
description = "d"
url = "http://127.0.0.1:1/"
"#,
    );
    assert_eq!(
        keys(&r),
        vec![
            k(E, "providers[1].name"),
            k(E, "agents[1].id"),
            k(E, "tools.mcp[1].name"),
            k(E, "tools.http[1].name"),
        ],
        "{}",
        messages(&r)
    );
    let text = messages(&r);
    assert!(
        text.contains("keel.toml:8:1: providers[1].name: duplicate provider name \"main\" (first at providers[0].name, keel.toml:3:1)"),
        "{text}"
    );
}

#[test]
fn mcp_server_needs_exactly_one_transport() {
    let r = load(
        r#"
[[tools.mcp]]
name = "none"
[[tools.mcp]]
name = "both"
command = "x"
url = "http://127.0.0.1:1/mcp"
[[tools.mcp]]
name = "ok"
url = "http://127.0.0.1:1/mcp"
"#,
    );
    assert_eq!(
        keys(&r),
        vec![k(E, "tools.mcp[0]"), k(E, "tools.mcp[1].url")],
        "{}",
        messages(&r)
    );
    assert!(messages(&r).contains("keel.toml:7:1: tools.mcp[0]: needs either command"));
}

#[test]
fn limits_and_loop_detection_must_make_sense() {
    let r = load(
        r#"
[[agents]]
id = "a"
provider = "main"
[agents.limits]
max_steps = 0
[agents.loop_detection]
repeat_warning = 4
repeat_critical = 2
"#,
    );
    assert_eq!(
        keys(&r),
        vec![
            k(E, "agents[0].limits.max_steps"),
            k(E, "agents[0].loop_detection.repeat_critical"),
        ],
        "{}",
        messages(&r)
    );
    // Negative and oversized numbers are type errors, not wraparounds.
    let r = load(
        "[[agents]]\nid = \"a\"\nprovider = \"main\"\n[agents.limits]\nmax_steps = -1\nmax_tool_calls = 5000000000\n",
    );
    assert_eq!(
        keys(&r),
        vec![
            k(E, "agents[0].limits.max_steps"),
            k(E, "agents[0].limits.max_tool_calls")
        ],
        "{}",
        messages(&r)
    );
    assert!(
        messages(&r).contains("expected an integer from 0 to 4294967295, found integer 5000000000")
    );
}

#[test]
fn http_tool_url_and_parameters_are_checked() {
    let r = load(
        r#"
[[tools.http]]
name = "one"
description = "d"
url = "http://127.0.0.1:1/f/{furnace_id}/{line}"
parameters = { type = "object", properties = { furnace_id = { type = "string" } } }

[[tools.http]]
name = "two"
description = "d"
url = "http://127.0.0.1:1/"
parameters = ["not", "a", "schema"]

[[tools.http]]
name = "three"
description = "d"
method = "FETCH"
url = "ftp://x/{a"
parameters = { type = "array" }
"#,
    );
    assert_eq!(
        keys(&r),
        vec![
            k(E, "tools.http[0].url"),
            k(E, "tools.http[1].parameters"),
            k(E, "tools.http[2].method"),
            k(E, "tools.http[2].url"),
            k(E, "tools.http[2].url"),
            k(E, "tools.http[2].parameters.type"),
        ],
        "{}",
        messages(&r)
    );
    let text = messages(&r);
    assert!(
        text.contains("{line}, which is not in parameters.properties"),
        "{text}"
    );
    assert!(!text.contains("{furnace_id}"), "{text}");
}

#[test]
fn server_addresses_and_database_urls() {
    for (server, bad) in [
        (
            "bind = \"127.0.0.1:8780\"\ndatabase_url = \"postgresql://u@h/db\"",
            None,
        ),
        ("database_url = \"sqlite://./data/keel.db\"", None),
        ("bind = \"localhost:80\"", None),
        ("bind = \"8780\"", Some("server.bind")),
        ("bind = \"127.0.0.1:70000\"", Some("server.bind")),
        (
            "database_url = \"mysql://u@h/db\"",
            Some("server.database_url"),
        ),
        ("database_url = \"./keel.db\"", Some("server.database_url")),
    ] {
        let r = load(&format!("[server]\n{server}\n"));
        match bad {
            None => assert!(r.is_ok(), "{server}: {}", messages(&r)),
            Some(key) => assert_eq!(keys(&r), vec![k(E, key)], "{server}"),
        }
    }
}

#[test]
fn provider_without_base_url_is_fine() {
    let r = load_str(
        "[[providers]]\nname = \"o\"\nkind = \"openai\"\nmodel = \"gpt\"\n[[providers]]\nname = \"a\"\nkind = \"anthropic\"\nmodel = \"claude\"\n",
        "keel.toml",
        &MapEnv::new(),
    );
    assert!(r.is_ok(), "{}", messages(&r));
    assert!(keys(&r).is_empty());
}

#[test]
fn tool_patterns_that_match_nothing_are_warnings() {
    let r = load(
        r#"
[[agents]]
id = "a"
provider = "main"
tools = ["plant.*", "plant.restart", "p*", "*", "furnace_*", "memory_search", "web_fetch", "nothing_here", "other.*"]

[[tools.mcp]]
name = "plant"
command = "python3"

[[tools.http]]
name = "furnace_status"
description = "d"
url = "http://127.0.0.1:1/"

[tools.overrides."plant.restart_furnace"]
risk = "dangerous"
[tools.overrides.ghost]
risk = "write"
"#,
    );
    let loaded = r.as_ref().unwrap();
    assert_eq!(
        keys(&r),
        vec![
            k(W, "agents[0].tools[7]"),
            k(W, "agents[0].tools[8]"),
            k(W, "tools.overrides.ghost"),
        ],
        "{}",
        messages(&r)
    );
    assert!(
        loaded.warnings[0]
            .to_string()
            .contains("warning: agents[0].tools[7]: pattern \"nothing_here\"")
    );
}

#[test]
fn env_references_in_headers_and_mcp_env() {
    let text = r#"
[[tools.mcp]]
name = "plant"
command = "python3"
env = { PLANT_TOKEN = "${PLANT_TOKEN}", LITERAL = "$${NOT_A_REF}" }

[[tools.http]]
name = "t"
description = "d"
url = "http://127.0.0.1:1/"
headers = { Authorization = "Bearer ${API_TOKEN}", X-Bad = "${oops" }
"#;
    let r = load(text);
    assert_eq!(
        keys(&r),
        vec![
            k(W, "tools.mcp[0].env.PLANT_TOKEN"),
            k(W, "tools.http[0].headers.Authorization"),
            k(E, "tools.http[0].headers.X-Bad"),
        ],
        "{}",
        messages(&r)
    );
    let env = MapEnv::new()
        .with("PLANT_TOKEN", "a")
        .with("API_TOKEN", "b");
    let r = load_str(
        &format!("{PROVIDER}{}", text.replace(", X-Bad = \"${oops\"", "")),
        "keel.toml",
        &env,
    );
    assert!(
        r.as_ref().is_ok_and(|l| l.warnings.is_empty()),
        "{}",
        messages(&r)
    );
}

#[test]
fn wrong_section_shapes_are_type_errors() {
    let r = load_str(
        "server = 5\nproviders = { name = \"x\" }\n[tools]\noverrides = []\n",
        "keel.toml",
        &MapEnv::new(),
    );
    assert_eq!(
        keys(&r),
        vec![k(E, "server"), k(E, "providers"), k(E, "tools.overrides")],
        "{}",
        messages(&r)
    );
    assert!(messages(&r).contains("providers: expected an array of tables, found a table"));
}

#[test]
fn quoted_keys_render_quoted() {
    let r = load("[tools.overrides.\"plant.restart_furnace\"]\nrisk = \"fatal\"\n");
    assert_eq!(
        keys(&r),
        vec![
            k(W, "tools.overrides.\"plant.restart_furnace\""),
            k(E, "tools.overrides.\"plant.restart_furnace\".risk"),
        ],
        "{}",
        messages(&r)
    );
}

#[test]
fn loop_detection_thresholds_load_and_are_checked_in_pairs() {
    let r = load(
        r#"
[[agents]]
id = "a"
provider = "main"
[agents.loop_detection]
poll_warning = 6
poll_critical = 12
ping_pong_warning = 5
ping_pong_critical = 0
identical_outcomes_breaker = 20
unknown_tool_warning = 3
unknown_tool_critical = 4
error_streak_warning = 2
error_streak_critical = 6
"#,
    );
    let loaded = r.as_ref().expect("valid loop detection");
    let ld = &loaded.config.agents[0].loop_detection;
    assert_eq!(
        (ld.poll_warning, ld.poll_critical, ld.ping_pong_critical),
        (6, 12, 0)
    );
    assert_eq!(
        (
            ld.identical_outcomes_breaker,
            ld.unknown_tool_critical,
            ld.error_streak_warning
        ),
        (20, 4, 2)
    );
    // Unset keys keep their defaults.
    assert_eq!((ld.repeat_warning, ld.repeat_critical), (3, 5));
    assert_eq!(ld.max_tool_calls_breaker, 30);

    let r = load(
        r#"
[[agents]]
id = "a"
provider = "main"
[agents.loop_detection]
poll_warning = 6
poll_critical = 5
ping_pong_warning = 8
ping_pong_critical = 4
unknown_tool_warning = 3
unknown_tool_critical = 2
error_streak_warning = 5
error_streak_critical = 3
ping_pong_criticl = 9
"#,
    );
    assert_eq!(
        keys(&r),
        vec![
            k(E, "agents[0].loop_detection.poll_critical"),
            k(E, "agents[0].loop_detection.ping_pong_critical"),
            k(E, "agents[0].loop_detection.unknown_tool_critical"),
            k(E, "agents[0].loop_detection.error_streak_critical"),
            k(E, "agents[0].loop_detection.ping_pong_criticl"),
        ],
        "{}",
        messages(&r)
    );
    assert!(messages(&r).contains("did you mean \"ping_pong_critical\""));
    assert!(messages(&r).contains("poll_critical (5) is less than poll_warning (6)"));
}

#[test]
fn drift_and_compaction_settings_must_make_sense() {
    let r = load(
        r#"
[[agents]]
id = "a"
provider = "main"
[agents.drift]
threshold = 1.5
deep_drift_threshold = 0.2
reflection_interval = 0
[agents.compaction]
threshold = 1.0
default_context_window = 100
"#,
    );
    assert_eq!(
        keys(&r),
        vec![
            k(E, "agents[0].drift.threshold"),
            k(E, "agents[0].compaction.threshold"),
            k(E, "agents[0].compaction.default_context_window"),
        ],
        "{}",
        messages(&r)
    );
    assert!(messages(&r).contains("must be between 0 and 1, not 1.5"));
}

#[test]
fn drift_and_compaction_can_be_turned_off() {
    let r = load(
        r#"
[[agents]]
id = "a"
provider = "main"
routing = "pre_route"
success_criterion = "the batch count for F2 is given"
[agents.drift]
enabled = false
[agents.compaction]
enabled = false
"#,
    );
    assert!(keys(&r).is_empty(), "{}", messages(&r));
}

#[test]
fn local_provider_weight_copy_can_be_turned_off_and_wrong_types_name_the_key() {
    let on = load_str(
        "[[providers]]\nname = \"l\"\nkind = \"local\"\nmodel = \"smollm2-135m\"\n",
        "keel.toml",
        &MapEnv::new(),
    )
    .unwrap();
    assert_eq!(on.config.providers[0].requantize_q4_1, None);
    let off = load_str(
        "[[providers]]\nname = \"l\"\nkind = \"local\"\nmodel = \"smollm2-135m\"\nrequantize_q4_1 = false\n",
        "keel.toml",
        &MapEnv::new(),
    )
    .unwrap();
    assert_eq!(off.config.providers[0].requantize_q4_1, Some(false));
    let wrong = load_str(
        "[[providers]]\nname = \"l\"\nkind = \"local\"\nmodel = \"smollm2-135m\"\nrequantize_q4_1 = \"no\"\n",
        "keel.toml",
        &MapEnv::new(),
    );
    assert_eq!(
        keys(&wrong),
        [k(E, "providers[0].requantize_q4_1")],
        "{}",
        messages(&wrong)
    );
}

#[test]
fn mcp_server_wide_risk_and_approval_load_and_are_type_checked() {
    let r = load(
        r#"
[[tools.mcp]]
name = "plant"
command = "python3"
risk = "read"
requires_approval = true
"#,
    );
    let loaded = r.as_ref().unwrap();
    assert!(loaded.warnings.is_empty(), "{}", messages(&r));
    let plant = &loaded.config.tools.mcp[0];
    assert_eq!(plant.risk, Some(keel_protocol::Risk::Read));
    assert_eq!(plant.requires_approval, Some(true));

    let r = load(
        r#"
[[tools.mcp]]
name = "plant"
command = "python3"
risk = "fatal"
requires_approval = "yes"
"#,
    );
    assert_eq!(
        keys(&r),
        vec![
            k(E, "tools.mcp[0].risk"),
            k(E, "tools.mcp[0].requires_approval"),
        ],
        "{}",
        messages(&r)
    );
    let text = messages(&r);
    assert!(
        text.contains(
            "keel.toml:10:1: tools.mcp[0].risk: expected one of \"read\", \"write\", \"exec\", \"dangerous\", found \"fatal\""
        ),
        "{text}"
    );
    assert!(
        text.contains("keel.toml:11:1: tools.mcp[0].requires_approval: expected a boolean"),
        "{text}"
    );
}

#[test]
fn glob_override_keys_are_checked_like_agent_tool_patterns() {
    let r = load(
        r#"
[[tools.mcp]]
name = "plant"
command = "python3"

[[tools.http]]
name = "furnace_status"
description = "d"
url = "http://127.0.0.1:1/"

[tools.overrides."plant.*"]
risk = "read"
[tools.overrides."plant.restart_furnace"]
risk = "dangerous"
requires_approval = true
[tools.overrides."*_status"]
poll = true
[tools.overrides."*"]
timeout_s = 10
[tools.overrides."line.*"]
risk = "write"
[tools.overrides.""]
risk = "write"
"#,
    );
    assert_eq!(
        keys(&r),
        vec![
            k(W, "tools.overrides.\"line.*\""),
            k(E, "tools.overrides.\"\""),
        ],
        "{}",
        messages(&r)
    );
    assert!(
        messages(&r).contains(
            "keel.toml:25:18: warning: tools.overrides.\"line.*\": \"line.*\" matches no http tool, built-in tool or tool under an mcp server's prefix"
        ),
        "{}",
        messages(&r)
    );
}

#[test]
fn a_limit_of_nothing_in_flight_is_an_error() {
    let r = load_str(
        r#"
[[providers]]
name = "main"
kind = "openai"
model = "m"
max_concurrent_requests = 0

[[tools.http]]
name = "lookup"
description = "d"
url = "http://127.0.0.1:9/lookup"
max_concurrent_calls = 0
"#,
        "keel.toml",
        &MapEnv::new(),
    );
    assert_eq!(
        keys(&r),
        vec![
            k(E, "providers[0].max_concurrent_requests"),
            k(E, "tools.http[0].max_concurrent_calls"),
        ]
    );
    let text = messages(&r);
    assert!(
        text.contains("providers[0].max_concurrent_requests: must be at least 1"),
        "{text}"
    );
    assert!(
        text.contains("tools.http[0].max_concurrent_calls: must be at least 1"),
        "{text}"
    );

    let fine = load_str(
        &format!("{PROVIDER}max_concurrent_requests = 8\n"),
        "keel.toml",
        &MapEnv::new(),
    )
    .unwrap();
    assert_eq!(fine.config.providers[0].max_concurrent_requests, 8);
}
