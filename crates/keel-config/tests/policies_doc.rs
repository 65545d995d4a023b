#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Every TOML example of docs/policies.md loads with keel's own loader, so
//! the guide cannot teach a configuration that keel would refuse.

use std::path::PathBuf;

use keel_config::{MapEnv, load_str};

fn guide() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/policies.md");
    std::fs::read_to_string(&path).unwrap()
}

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

/// A block with what keel needs around it: a provider and an agent, and
/// the plant tools the examples name, unless the block brings its own.
fn wrapped(block: &str) -> String {
    let mut text = String::new();
    if !block.contains("[[providers]]") {
        text.push_str(
            "[[providers]]\nname = \"main\"\nkind = \"openai\"\nmodel = \"qwen-plus\"\n\n",
        );
    }
    if !block.contains("[[agents]]") {
        text.push_str(
            "[[agents]]\nid = \"default\"\nprovider = \"main\"\ntools = [\"plant.*\", \"furnace_status\"]\n\n",
        );
    }
    if !block.contains("[[tools.mcp]]") {
        text.push_str(
            "[[tools.mcp]]\nname = \"plant\"\ncommand = \"python3\"\nargs = [\"plant_server.py\"]\n\n",
        );
    }
    if !block.contains("[[tools.http]]") {
        text.push_str(concat!(
            "[[tools.http]]\nname = \"furnace_status\"\ndescription = \"Current status of one furnace\"\n",
            "url = \"http://127.0.0.1:9100/furnaces/{furnace_id}\"\n",
            "parameters = { type = \"object\", properties = { furnace_id = { type = \"string\" } }, required = [\"furnace_id\"] }\n\n",
        ));
    }
    text.push_str(block);
    text
}

#[test]
fn every_toml_example_of_the_policy_guide_loads() {
    let blocks = toml_blocks(&guide());
    assert!(
        blocks.len() >= 10,
        "found only {} toml blocks",
        blocks.len()
    );
    let env = MapEnv::new();
    for block in &blocks {
        let text = wrapped(block);
        let problems: Vec<String> = match load_str(&text, "docs/policies.md", &env) {
            Ok(loaded) => loaded.warnings.iter().map(ToString::to_string).collect(),
            Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
        };
        assert!(
            problems.is_empty(),
            "this example of docs/policies.md does not load cleanly:\n{block}\n{}",
            problems.join("\n")
        );
    }
}

#[test]
fn toml_blocks_are_found() {
    let md = "a\n```toml\nx = 1\n```\n```sh\nls\n```\n```toml\ny = 2\n```\n";
    assert_eq!(toml_blocks(md), ["x = 1\n", "y = 2\n"]);
}
