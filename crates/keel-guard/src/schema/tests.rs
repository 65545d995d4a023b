use serde_json::json;

use super::*;

fn furnace_schema() -> Value {
    normalize(&json!({
        "type": "object",
        "properties": {
            "furnace_id": {"type": "string", "description": "Furnace id"},
            "mode": {"type": "string", "enum": ["eco", "full"]},
            "setpoint": {"type": "number", "nullable": true},
            "filter": {
                "type": "object",
                "properties": {"zone": {"type": "integer"}},
                "required": ["zone", "ghost"]
            }
        },
        "required": ["furnace_id", "mode", "nope"]
    }))
}

fn compiled() -> CompiledSchema {
    CompiledSchema::compile(&furnace_schema()).unwrap()
}

#[test]
fn normalize_fills_top_level_defaults() {
    let n = normalize(&json!({}));
    assert_eq!(
        n,
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    );
    let n = normalize(&json!(null));
    assert_eq!(n["type"], "object");
    assert_eq!(n["properties"], json!({}));
}

#[test]
fn normalize_filters_required_and_closes_objects() {
    let n = furnace_schema();
    assert_eq!(n["required"], json!(["furnace_id", "mode"]));
    assert_eq!(n["additionalProperties"], json!(false));
    assert_eq!(n["properties"]["filter"]["required"], json!(["zone"]));
    assert_eq!(
        n["properties"]["filter"]["additionalProperties"],
        json!(false)
    );
}

#[test]
fn normalize_keeps_explicit_additional_properties_and_free_form_objects() {
    let n = normalize(&json!({
        "properties": {
            "labels": {"type": "object"},
            "opts": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true}
        },
        "additionalProperties": {"type": "string"}
    }));
    assert_eq!(n["additionalProperties"], json!({"type": "string"}));
    assert!(
        n["properties"]["labels"]
            .get("additionalProperties")
            .is_none()
    );
    assert_eq!(n["properties"]["opts"]["additionalProperties"], json!(true));
}

#[test]
fn normalize_drops_schema_and_id_everywhere() {
    let n = normalize(&json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "urn:x",
        "properties": {"a": {"$id": "urn:y", "type": "string"}}
    }));
    assert!(n.get("$schema").is_none());
    assert!(n.get("$id").is_none());
    assert!(n["properties"]["a"].get("$id").is_none());
}

#[test]
fn normalize_turns_nullable_into_type_union() {
    let n = normalize(&json!({
        "properties": {
            "a": {"type": "string", "nullable": true},
            "b": {"type": ["integer"], "nullable": true},
            "c": {"type": "string", "enum": ["x"], "nullable": true},
            "d": {"type": "string", "nullable": false},
            "list": {"type": "array", "items": {"type": "number", "nullable": true}}
        }
    }));
    let p = &n["properties"];
    assert_eq!(p["a"], json!({"type": ["string", "null"]}));
    assert_eq!(p["b"], json!({"type": ["integer", "null"]}));
    assert_eq!(p["c"]["enum"], json!(["x", null]));
    assert_eq!(p["d"], json!({"type": "string"}));
    assert_eq!(p["list"]["items"], json!({"type": ["number", "null"]}));

    let c = CompiledSchema::compile(&n).unwrap();
    assert!(
        c.check(&json!({"a": null, "c": null, "list": [1, null]}))
            .is_empty()
    );
}

#[test]
fn normalize_recurses_into_array_items_objects() {
    let n = normalize(&json!({
        "properties": {
            "rows": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k", "zz"]}}
        }
    }));
    let items = &n["properties"]["rows"]["items"];
    assert_eq!(items["additionalProperties"], json!(false));
    assert_eq!(items["required"], json!(["k"]));
}

#[test]
fn valid_arguments_pass() {
    let c = compiled();
    let v = c.check(&json!({"furnace_id": "F2", "mode": "eco", "setpoint": null}));
    assert!(v.is_empty(), "{v:?}");
}

#[test]
fn missing_required_is_reported() {
    let c = compiled();
    let v = c.check(&json!({"mode": "eco"}));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(
        v[0].kind,
        ViolationKind::MissingRequired {
            param: "furnace_id".into()
        }
    );
    assert!(v[0].message.contains("furnace_id"), "{}", v[0].message);
}

#[test]
fn nested_missing_required_names_the_full_path() {
    let c = compiled();
    let v = c.check(&json!({"furnace_id": "F2", "mode": "eco", "filter": {}}));
    assert_eq!(
        v[0].kind,
        ViolationKind::MissingRequired {
            param: "filter.zone".into()
        }
    );
}

#[test]
fn unknown_parameter_is_reported() {
    let c = compiled();
    let v = c.check(&json!({"furnace_id": "F2", "mode": "eco", "furnace": "F3"}));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(
        v[0].kind,
        ViolationKind::UnknownParameter {
            param: "furnace".into()
        }
    );
    assert!(v[0].message.contains("furnace"));
}

#[test]
fn wrong_type_names_parameter_expected_and_actual() {
    let c = compiled();
    let v = c.check(&json!({"furnace_id": 42, "mode": "eco"}));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].kind, ViolationKind::WrongType);
    assert_eq!(v[0].path, "furnace_id");
    assert_eq!(v[0].message, "furnace_id: expected string, got 42");
}

#[test]
fn wrong_type_in_nested_value() {
    let c = compiled();
    let v = c.check(&json!({"furnace_id": "F1", "mode": "eco", "filter": {"zone": "two"}}));
    assert_eq!(v[0].kind, ViolationKind::WrongType);
    assert_eq!(v[0].path, "filter.zone");
    assert_eq!(v[0].message, "filter.zone: expected integer, got \"two\"");
}

#[test]
fn enum_violation_lists_options() {
    let c = compiled();
    let v = c.check(&json!({"furnace_id": "F2", "mode": "turbo"}));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].kind, ViolationKind::NotInEnum);
    assert_eq!(
        v[0].message,
        "mode: \"turbo\" is not one of [\"eco\",\"full\"]"
    );
}

#[test]
fn other_violations_are_reported_readably() {
    let s = normalize(&json!({"properties": {"n": {"type": "integer", "minimum": 1}}}));
    let c = CompiledSchema::compile(&s).unwrap();
    let v = c.check(&json!({"n": 0}));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].kind, ViolationKind::Other);
    assert!(v[0].message.starts_with("n: "), "{}", v[0].message);
}

#[test]
fn several_violations_are_all_reported() {
    let c = compiled();
    let v = c.check(&json!({"furnace_id": 1, "mode": "x", "extra": true}));
    assert_eq!(v.len(), 3, "{v:?}");
}

#[test]
fn non_object_arguments_are_one_violation() {
    let c = compiled();
    for args in [json!("F2"), json!([1]), json!(null), json!(3)] {
        let v = c.check(&args);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].kind, ViolationKind::WrongType);
        assert_eq!(v[0].message, "arguments must be a JSON object");
    }
}

#[test]
fn missing_required_lists_absent_and_null_in_schema_order() {
    let c = compiled();
    assert_eq!(
        c.missing_required(&json!({"mode": null})),
        vec!["furnace_id".to_string(), "mode".to_string()]
    );
    assert_eq!(
        c.missing_required(&json!({"furnace_id": "F1", "mode": "eco"})),
        Vec::<String>::new()
    );
    assert_eq!(
        c.missing_required(&json!({"furnace_id": "F1"})),
        vec!["mode".to_string()]
    );
}

#[test]
fn invalid_schema_does_not_compile() {
    let err = CompiledSchema::compile(&json!({"type": "no-such-type"})).unwrap_err();
    assert!(matches!(err, SchemaError::Invalid(_)));
}

#[test]
fn remote_refs_are_not_fetched() {
    let s = json!({"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:1/x.json"}}});
    assert!(CompiledSchema::compile(&s).is_err());
}

#[test]
fn local_refs_resolve() {
    let s = normalize(&json!({
        "properties": {"a": {"$ref": "#/$defs/id"}},
        "$defs": {"id": {"type": "string"}}
    }));
    let c = CompiledSchema::compile(&s).unwrap();
    assert!(c.check(&json!({"a": "x"})).is_empty());
    assert_eq!(c.check(&json!({"a": 1}))[0].kind, ViolationKind::WrongType);
}
