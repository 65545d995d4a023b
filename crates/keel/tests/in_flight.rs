#![allow(clippy::unwrap_used, clippy::expect_used)]
//! An HTTP tool's `max_concurrent_calls`: calls past it wait their turn,
//! and the wait is not part of their timeout.

mod common;

use common::{Env, Keel};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};

#[tokio::test]
async fn calls_past_a_tools_limit_wait_their_turn_and_do_not_time_out() {
    // Each run asks for one 500 ms operation, then answers.
    let model = FakeOpenAi::start(Script::handler(|request: &Value| {
        let answered = request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool");
        if answered {
            Reply::text("done")
        } else {
            Reply::tool_call("queued_op", json!({"ms": 500}))
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    // One call at a time, each timing out after 1 s: three calls at once
    // end after 1.5 s, which only the waiting one's timeout must not count.
    env.extra_tools = format!(
        r#"
[[tools.http]]
name = "queued_op"
description = "A slow operation that takes one caller at a time"
method = "GET"
url = "{}/slow"
parameters = {{ type = "object", properties = {{ ms = {{ type = "integer" }} }}, required = ["ms"] }}
timeout_s = 1
max_concurrent_calls = 1
"#,
        tools.base_url()
    );
    env.agent_tools.push("queued_op".into());
    let keel = Keel::start(&env).await;

    let mut runs = Vec::new();
    for i in 0..3 {
        runs.push(keel.start_run(&format!("operation {i}"), None).await);
    }
    for id in &runs {
        let run = keel.wait_status(id, "completed", None).await;
        assert_eq!(run["output"], "done", "{run}");
        let results: Vec<Value> = keel
            .events(id, None, None)
            .await
            .into_iter()
            .map(|f| f.data)
            .filter(|e| e["type"] == "tool_result")
            .collect();
        assert_eq!(results.len(), 1, "{results:?}");
        assert_eq!(results[0]["ok"], true, "{results:?}");
    }
    // The endpoint saw one call at a time: each ended before the next began.
    let order: Vec<String> = tools
        .calls()
        .into_iter()
        .map(|(route, _)| route)
        .filter(|r| r.starts_with("slow"))
        .collect();
    assert_eq!(
        order,
        [
            "slow_started",
            "slow",
            "slow_started",
            "slow",
            "slow_started",
            "slow"
        ],
    );
}
