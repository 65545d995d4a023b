//! `[telemetry]`: where spans go, read and checked like every other table.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_config::{MapEnv, load_str};

const BASE: &str = r#"
[[providers]]
name = "m"
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "x"

[[agents]]
id = "default"
provider = "m"
"#;

#[test]
fn telemetry_is_off_by_default_and_contents_stay_out() {
    let loaded = load_str(BASE, "test", &MapEnv::default()).unwrap();
    assert_eq!(loaded.config.telemetry.otlp_endpoint, None);
    assert!(!loaded.config.telemetry.capture_content);
    assert_eq!(loaded.config.telemetry.service_name, "keel");
}

#[test]
fn an_endpoint_that_is_not_an_http_url_is_named_in_the_error() {
    let text = format!("{BASE}\n[telemetry]\notlp_endpoint = \"collector:4318\"\n");
    let err = load_str(&text, "test", &MapEnv::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("telemetry.otlp_endpoint"), "{err}");
    let text = format!(
        "{BASE}\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\ncapture_content = true\n"
    );
    let loaded = load_str(&text, "test", &MapEnv::default()).unwrap();
    assert_eq!(
        loaded.config.telemetry.otlp_endpoint.as_deref(),
        Some("http://127.0.0.1:4318")
    );
    assert!(loaded.config.telemetry.capture_content);
    let typo = format!("{BASE}\n[telemetry]\nendpoint = \"http://x\"\n");
    let err = load_str(&typo, "test", &MapEnv::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("endpoint"), "{err}");
}
