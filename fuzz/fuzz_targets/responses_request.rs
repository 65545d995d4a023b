//! A `POST /v1/responses` body: the request, its input items and client
//! tools, read as the handler reads them.
#![no_main]

use std::collections::HashSet;

use keel_server::fuzzing::{Item, read_request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let read = match read_request(data) {
        Ok(read) => read,
        Err(e) => {
            // A rejection names the field at fault, and says so first.
            assert_eq!(e.status.as_u16(), 400, "{e:?}");
            if let Some(param) = &e.param {
                assert!(e.message.starts_with(param.as_str()), "{e:?}");
            }
            return;
        }
    };
    for item in &read.items {
        match item {
            Item::FunctionCall { call_id, .. } | Item::FunctionCallOutput { call_id, .. } => {
                assert!(!call_id.is_empty(), "{item:?}");
            }
            Item::Message { .. } | Item::Reference { .. } => {}
        }
    }
    let mut names = HashSet::new();
    for tool in &read.tools {
        assert!(
            names.insert(tool.name.as_str()),
            "{} declared twice",
            tool.name
        );
        assert!(tool.parameters.is_object(), "{:?}", tool.parameters);
        assert_eq!(tool.to_json()["name"], tool.name.as_str());
    }
    for run in read
        .replayed_runs
        .iter()
        .chain(read.previous.iter().map(|p| &p.0))
    {
        assert!(run.starts_with("run_"), "{run}");
    }
});
