use keel_config::VerifyConfig;
use keel_protocol::ToolSpec;
use serde_json::{Value, json};

use super::*;
use crate::schema::CompiledSchema;

fn verifier(cfg: Value) -> Verifier {
    let cfg: VerifyConfig = serde_json::from_value(cfg).unwrap();
    Verifier::new(&cfg)
}

fn tool(name: &str) -> ToolSpec {
    ToolSpec::new(name, "d", json!({"type": "object"}))
}

fn run(v: &Verifier, tool_name: &str, output: &str) -> Report {
    let t = tool(tool_name);
    v.verify(&VerifyInput {
        tool: &t,
        output: &ToolText::read(output),
        structured: None,
        ok: true,
        caller_tenant: "acme",
        output_schema: None,
    })
}

fn rules(report: &Report) -> Vec<&str> {
    report.checks.iter().map(|c| c.rule.as_str()).collect()
}

#[test]
fn rows_of_another_tenant_withhold_the_result_without_quoting_it() {
    let v = verifier(json!({}));
    let output = json!({"rows": [
        {"tenant_id": "acme", "name": "ours"},
        {"tenant_id": "globex", "name": "SECRET-GLOBEX-CUSTOMER", "balance": 987654},
        {"tenant_id": "initech", "name": "SECRET-INITECH"}
    ]})
    .to_string();
    let report = run(&v, "crm.customers", &output);
    assert!(report.withhold);
    let check = report.check(RULE_TENANT_ISOLATION).unwrap();
    assert!(!check.passed);
    assert_eq!(check.detail, "2 rows of another tenant (field tenant_id)");
    let everything = format!("{report:?}");
    for secret in ["SECRET", "globex", "initech", "987654"] {
        assert!(
            !everything.contains(secret),
            "{secret} leaked: {everything}"
        );
    }
}

#[test]
fn own_tenant_rows_pass() {
    let v = verifier(json!({}));
    let report = run(
        &v,
        "t",
        r#"[{"tenant_id": "acme", "x": 1}, {"tenant_id": "acme"}]"#,
    );
    assert!(!report.withhold);
    let check = report.check(RULE_TENANT_ISOLATION).unwrap();
    assert!(check.passed);
    assert_eq!(check.detail, "2 rows of the caller's tenant");
    assert!(report.passed());
}

#[test]
fn tenant_fields_are_found_at_any_depth_and_in_embedded_json() {
    let v = verifier(json!({"tenant_field": "org"}));
    let nested = json!({"data": {"page": 1, "items": [[{"meta": {"org": "globex", "v": 1}}]]}});
    assert!(run(&v, "t", &nested.to_string()).withhold);
    // The configured field name is the one that counts.
    let other_field = json!({"data": [{"tenant_id": "globex"}]});
    assert!(!run(&v, "t", &other_field.to_string()).withhold);
    // A JSON payload carried as text inside the result.
    let embedded = json!({"content": [{"type": "text", "text": "[{\"org\": \"globex\"}]"}]});
    assert!(run(&v, "t", &embedded.to_string()).withhold);
    // JSON lines.
    assert!(run(&v, "t", "{\"org\": \"acme\"}\n{\"org\": \"globex\"}\n").withhold);
    // A null tenant is not the caller's.
    assert!(run(&v, "t", r#"{"org": null}"#).withhold);
}

#[test]
fn structured_results_are_checked_too() {
    let v = verifier(json!({}));
    let t = tool("t");
    let structured = json!({"rows": [{"tenant_id": "globex"}]});
    let report = v.verify(&VerifyInput {
        tool: &t,
        output: &ToolText::read("1 customer found"),
        structured: Some(&structured),
        ok: true,
        caller_tenant: "acme",
        output_schema: None,
    });
    assert!(report.withhold);
    assert_eq!(
        report.check(RULE_TENANT_ISOLATION).unwrap().detail,
        "1 row of another tenant (field tenant_id)"
    );
}

#[test]
fn failed_tools_are_only_checked_for_tenant_isolation() {
    let v = verifier(json!({"required_fields": {"t": ["id"]}}));
    let t = tool("t");
    let schema = CompiledSchema::compile(&json!({"type": "object"})).unwrap();
    let verify = |output: &str| {
        v.verify(&VerifyInput {
            tool: &t,
            output: &ToolText::read(output),
            structured: None,
            ok: false,
            caller_tenant: "acme",
            output_schema: Some(&schema),
        })
    };
    let report = verify("");
    assert!(report.checks.is_empty());
    assert!(!report.empty);
    let report = verify(r#"{"error": "x", "tenant_id": "globex"}"#);
    assert_eq!(rules(&report), vec![RULE_TENANT_ISOLATION]);
    assert!(report.withhold);
}

#[test]
fn plain_text_output_gets_no_tenant_check() {
    let v = verifier(json!({}));
    let report = run(&v, "t", "Furnace F2 is at 1200 C");
    assert_eq!(rules(&report), vec![RULE_NON_EMPTY]);
    assert!(!report.empty);
    assert!(report.passed());
}

#[test]
fn empty_shapes_are_marked_empty() {
    let v = verifier(json!({}));
    for output in [
        "",
        "  \n",
        "null",
        "\"\"",
        "\"  \"",
        "[]",
        "{}",
        r#"{"rows": []}"#,
        r#"{"data": {"items": []}}"#,
        r#"{"result": null}"#,
    ] {
        let report = run(&v, "t", output);
        assert!(report.empty, "{output:?} should be empty");
        let check = report.check(RULE_NON_EMPTY).unwrap();
        assert!(!check.passed);
        assert_eq!(check.detail, "empty result");
    }
    for output in [
        "0",
        "false",
        "[[]]",
        r#"{"rows": [], "total": 0}"#,
        r#"{"rows": [1]}"#,
        "no rows",
    ] {
        let report = run(&v, "t", output);
        assert!(!report.empty, "{output:?} is not empty");
        assert!(report.check(RULE_NON_EMPTY).unwrap().passed);
    }
}

#[test]
fn non_empty_can_be_switched_off() {
    let v = verifier(json!({"non_empty": false}));
    let report = run(&v, "t", "[]");
    assert!(!report.empty);
    assert!(report.check(RULE_NON_EMPTY).is_none());
}

#[test]
fn required_fields_per_row() {
    let v = verifier(json!({"required_fields": {
        "plant.*": ["furnace_id", "temp"],
        "plant.status": ["temp", "state"],
    }}));
    let ok = json!([
        {"furnace_id": "F1", "temp": 1, "state": "on"},
        {"furnace_id": "F2", "temp": 2, "state": "off"}
    ]);
    let report = run(&v, "plant.status", &ok.to_string());
    let check = report.check(RULE_REQUIRED_FIELDS).unwrap();
    assert!(check.passed, "{check:?}");
    assert_eq!(check.detail, "2 rows with furnace_id, temp, state");

    let wrapped = json!({"rows": [
        {"furnace_id": "F1", "temp": 1, "state": "on"},
        {"furnace_id": "F2", "temp": null},
        {"state": "SECRET-VALUE"}
    ]});
    let check = run(&v, "plant.status", &wrapped.to_string())
        .check(RULE_REQUIRED_FIELDS)
        .cloned()
        .unwrap();
    assert!(!check.passed);
    assert_eq!(
        check.detail,
        "2 of 3 rows lack required fields: furnace_id (1), temp (2), state (1)"
    );

    let single = json!({"furnace_id": "F1", "temp": 3});
    assert!(
        run(&v, "plant.temp", &single.to_string())
            .check(RULE_REQUIRED_FIELDS)
            .unwrap()
            .passed
    );
    let single_bad = json!({"furnace_id": "F1", "readings": [1, 2]});
    assert!(
        !run(&v, "plant.temp", &single_bad.to_string())
            .check(RULE_REQUIRED_FIELDS)
            .unwrap()
            .passed
    );
    // Rows that are not objects lack every field.
    assert!(
        !run(&v, "plant.temp", "[1, 2]")
            .check(RULE_REQUIRED_FIELDS)
            .unwrap()
            .passed
    );
    // Text where rows were expected.
    let check = run(&v, "plant.temp", "all fine")
        .check(RULE_REQUIRED_FIELDS)
        .cloned()
        .unwrap();
    assert_eq!(
        (check.passed, check.detail.as_str()),
        (false, "output is not JSON")
    );
    // Other tools have no required fields.
    assert!(
        run(&v, "furnace_status", "[1]")
            .check(RULE_REQUIRED_FIELDS)
            .is_none()
    );
}

fn with_schema(v: &Verifier, output: &str, structured: Option<&Value>) -> Report {
    let t = tool("t");
    let schema = CompiledSchema::compile(&json!({
        "type": "object",
        "properties": {"temp": {"type": "number"}, "tenant_id": {"type": "string"}},
        "required": ["temp"]
    }))
    .unwrap();
    v.verify(&VerifyInput {
        tool: &t,
        output: &ToolText::read(output),
        structured,
        ok: true,
        caller_tenant: "acme",
        output_schema: Some(&schema),
    })
}

#[test]
fn output_schema_pass_and_fail() {
    let v = verifier(json!({}));
    let report = with_schema(&v, r#"{"temp": 1200}"#, None);
    assert_eq!(
        rules(&report),
        vec![RULE_SCHEMA, RULE_TENANT_ISOLATION, RULE_NON_EMPTY]
    );
    assert!(report.passed());

    let report = with_schema(&v, r#"{"temp": "hot"}"#, None);
    let check = report.check(RULE_SCHEMA).unwrap();
    assert!(!check.passed);
    assert!(
        check.detail.contains("temp: expected number"),
        "{}",
        check.detail
    );

    // The structured result is what is validated when there is one.
    let structured = json!({"temp": 3});
    assert!(with_schema(&v, "three degrees", Some(&structured)).passed());

    let check = with_schema(&v, "three degrees", None)
        .check(RULE_SCHEMA)
        .cloned()
        .unwrap();
    assert_eq!(
        (check.passed, check.detail.as_str()),
        (false, "output is not JSON")
    );
}

#[test]
fn schema_details_are_withheld_with_the_result() {
    let v = verifier(json!({}));
    let report = with_schema(
        &v,
        r#"{"temp": "SECRET-TEMP", "tenant_id": "globex"}"#,
        None,
    );
    assert!(report.withhold);
    let everything = format!("{report:?}");
    assert!(!everything.contains("SECRET"), "{everything}");
    assert!(!everything.contains("globex"), "{everything}");
    assert!(!report.check(RULE_SCHEMA).unwrap().passed);
}
