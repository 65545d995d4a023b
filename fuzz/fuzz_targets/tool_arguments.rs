//! Tool-call argument text from a model, and a user's reply to a
//! clarification question: parsing, fingerprinting, schema checks and the
//! direct fill of a missing argument.
#![no_main]

use keel_core::clarify::{ClarifyRequest, direct_fill};
use keel_core::pipeline::parse_arguments;
use keel_guard::loop_detect::call_fingerprint;
use keel_guard::schema::{CompiledSchema, ViolationKind, normalize};
use keel_protocol::ToolSpec;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let spec = ToolSpec::new(
        "furnace_status",
        "status of one furnace",
        normalize(&json!({
            "type": "object",
            "properties": {
                "furnace_id": {"type": "string", "pattern": "^F[0-9]+$"},
                "hours": {"type": "integer", "minimum": 1, "maximum": 48},
                "unit": {"type": "string", "enum": ["celsius", "kelvin"]},
                "verbose": {"type": "boolean"}
            },
            "required": ["furnace_id", "hours"]
        })),
    );
    let Ok(schema) = CompiledSchema::compile(&spec.parameters) else {
        return;
    };

    if let Ok(args) = parse_arguments(text) {
        assert!(args.is_object(), "{args}");
        // Stored and re-read arguments are the same call.
        let written = args.to_string();
        let reread: Value = match serde_json::from_str(&written) {
            Ok(v) => v,
            Err(e) => panic!("{written} does not read back: {e}"),
        };
        assert_eq!(
            call_fingerprint("t", &args),
            call_fingerprint("t", &reread),
            "{written}"
        );
        let _ = schema.check(&args);
        let _ = schema.missing_required(&args);
    }
    let request = ClarifyRequest::parse(text);
    if let Some(c) = request.understanding.confidence {
        assert!((0.0..=1.0).contains(&c), "confidence {c}");
    }

    // The same text as a user's answer to "which furnace, how many hours?".
    let asked = json!({"unit": "celsius"});
    for slots in [
        vec!["furnace_id".to_owned()],
        vec!["hours".to_owned()],
        vec!["furnace_id".to_owned(), "hours".to_owned()],
    ] {
        if let Some(filled) = direct_fill(&spec, &schema, &asked, &slots, text) {
            assert!(filled.is_object(), "{filled}");
            let wrong: Vec<_> = schema
                .check(&filled)
                .into_iter()
                .filter(|v| !matches!(v.kind, ViolationKind::MissingRequired { .. }))
                .collect();
            assert!(
                wrong.is_empty(),
                "{filled} was filled in but fails: {wrong:?}"
            );
        }
    }
});
