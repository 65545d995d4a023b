#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Every TOML example of docs/gateway.md is a whole configuration that
//! loads without a problem, so the guide cannot teach a setup keel refuses.

use std::path::PathBuf;

use keel_config::{MapEnv, load_str};

/// The bodies of the ```toml fences, in order.
fn toml_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match current.as_mut() {
            None if line.trim() == "```toml" => current = Some(String::new()),
            None => {}
            Some(_) if line.trim() == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(current.is_none(), "an unclosed ```toml block");
    blocks
}

#[test]
fn every_toml_example_of_the_gateway_guide_loads() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/gateway.md");
    let blocks = toml_blocks(&std::fs::read_to_string(path).unwrap());
    assert!(blocks.len() >= 5, "found only {} toml blocks", blocks.len());
    let env: MapEnv = [
        ("OPENAI_API_KEY", "sk-test"),
        ("TELEGRAM_BOT_TOKEN", "123456:ABC-DEF"),
        ("TELEGRAM_SECRET_TOKEN", "0123456789abcdef"),
        ("SLACK_BOT_TOKEN", "xoxb-1"),
        ("SLACK_SIGNING_SECRET", "8f742231b10e8888abcd99yyyzzz85a5"),
        ("BRIDGE_SIGNING_SECRET", "s3cret"),
        ("KEEL_KEY_ALICE", "k"),
        ("KEEL_HOOK_SECRET", "hook-secret"),
    ]
    .into_iter()
    .collect();
    for block in &blocks {
        let problems: Vec<String> = match load_str(block, "docs/gateway.md", &env) {
            Ok(loaded) => loaded.warnings.iter().map(ToString::to_string).collect(),
            Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
        };
        assert!(
            problems.is_empty(),
            "this example of docs/gateway.md does not load cleanly:\n{block}\n{}",
            problems.join("\n")
        );
    }
}
