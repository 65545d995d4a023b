#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The real SmolLM2 GGUF, found where scripts/setup-local-model.sh puts it.

use std::path::PathBuf;

use keel_local::{LocalModel, LocalSettings};
use keel_protocol::ToolSchema;
use serde_json::json;

pub fn gguf() -> PathBuf {
    let path = std::env::var_os("KEEL_TEST_GGUF")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| {
                PathBuf::from(h).join(".cache/keel-models/SmolLM2-135M-Instruct.Q4_1.gguf")
            })
        })
        .expect("HOME or KEEL_TEST_GGUF must be set");
    assert!(
        path.is_file(),
        "the test model {} is missing: run scripts/setup-local-model.sh (or set KEEL_TEST_GGUF)",
        path.display()
    );
    path
}

/// One thread (tests run side by side on 2 cores, and llama.cpp threads
/// spin while waiting for each other) and short outputs keep CI time down.
pub fn model(max_output_tokens: u32) -> LocalModel {
    let mut settings = LocalSettings::new(gguf(), "smollm2-135m");
    settings.threads = Some(1);
    settings.context_window = Some(2048);
    settings.max_output_tokens = max_output_tokens;
    LocalModel::load(settings).unwrap()
}

/// A plant-operations tool set with strings, enums, bounded numbers and
/// optional parameters, plus the loop's reserved `clarify`.
pub fn tools() -> Vec<ToolSchema> {
    vec![
        ToolSchema {
            name: "furnace_status".into(),
            description: "Current status of one furnace.".into(),
            parameters: json!({"type":"object","properties":{"furnace_id":{"type":"string","description":"Furnace id, e.g. F2"}},"required":["furnace_id"]}).into(),
        },
        ToolSchema {
            name: "list_batches".into(),
            description: "Production batches between two dates.".into(),
            parameters: json!({"type":"object","properties":{
                "from":{"type":"string","description":"Start date, YYYY-MM-DD"},
                "to":{"type":"string","description":"End date, YYYY-MM-DD"},
                "limit":{"type":"integer","minimum":1,"maximum":100}
            },"required":["from","to"]}).into(),
        },
        ToolSchema {
            name: "restart_furnace".into(),
            description: "Restart a furnace. Dangerous.".into(),
            parameters: json!({"type":"object","properties":{
                "furnace_id":{"type":"string"},
                "reason":{"type":"string","description":"Why the restart is needed"}
            },"required":["furnace_id","reason"]}).into(),
        },
        ToolSchema {
            name: "set_setpoint".into(),
            description: "Set a furnace's temperature setpoint.".into(),
            parameters: json!({"type":"object","properties":{
                "furnace_id":{"type":"string"},
                "temperature":{"type":"number","minimum":0,"maximum":2000},
                "unit":{"type":"string","enum":["C","F"]},
                "dry_run":{"type":"boolean"}
            },"required":["furnace_id","temperature"]}).into(),
        },
        ToolSchema {
            name: "clarify".into(),
            description: "Ask the user for required parameters of one specific tool.".into(),
            parameters: json!({"type":"object","properties":{
                "tool_name":{"type":"string"},
                "missing_slots":{"type":"array","items":{"type":"string"}},
                "question":{"type":"string"}
            },"required":["tool_name","missing_slots","question"],"additionalProperties":false}).into(),
        },
    ]
}
