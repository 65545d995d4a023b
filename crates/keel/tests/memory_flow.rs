//! Memory's round trip: a fact stated in one session, the session reset,
//! and the fact found from a new session through the model's `memory_search`
//! call and through `/ai/memory/search`; another tenant finds nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Env, KEY_ACME, KEY_GLOBEX, Keel};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::json;

#[tokio::test]
async fn a_fact_from_a_reset_session_is_found_from_a_new_one_and_only_by_its_tenant() {
    let model = FakeOpenAi::start(Script::queue(vec![
        // session A
        Reply::text("Noted."),
        // the reset's summary
        Reply::text("## Facts\n- The crucible of furnace F7 was replaced on 2026-11-20."),
        // session B: the model searches memory, then answers
        Reply::tool_call(
            "memory_search",
            json!({"query": "when was the F7 crucible replaced", "k": 3}),
        ),
        Reply::text("On 2026-11-20."),
        // globex tries the same
        Reply::tool_call(
            "memory_search",
            json!({"query": "when was the F7 crucible replaced", "k": 3}),
        ),
        Reply::text("I found nothing."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    let keel = Keel::start_with(&env, |cfg| {
        cfg.replace(
            "tools = [\"furnace_status\"",
            "tools = [\"memory_search\", \"memory_get\", \"furnace_status\"",
        )
    })
    .await;

    let (_, run) = keel
        .post("/ai/runs", json!({"input": "The crucible of furnace F7 was replaced on 2026-11-20.", "session": "A"}), Some(KEY_ACME))
        .await;
    keel.wait_status(run["id"].as_str().unwrap(), "completed", Some(KEY_ACME))
        .await;
    let (code, reset) = keel
        .post("/ai/sessions/A/reset", json!({}), Some(KEY_ACME))
        .await;
    assert_eq!(code, 200, "{reset}");
    assert!(
        reset["memory_id"].is_string(),
        "the summary was indexed: {reset}"
    );
    // A readable Markdown copy sits under the data dir.
    let md = walk(&keel.dir.join("memory"));
    assert!(
        md.iter()
            .any(|p| std::fs::read_to_string(p).unwrap().contains("2026-11-20")),
        "{md:?}"
    );

    let (_, run) = keel
        .post(
            "/ai/runs",
            json!({"input": "When was the F7 crucible replaced?", "session": "B"}),
            Some(KEY_ACME),
        )
        .await;
    let id = run["id"].as_str().unwrap().to_owned();
    let frames = keel.events(&id, None, Some(KEY_ACME)).await;
    let result = frames
        .iter()
        .find(|f| f.event == "tool_result")
        .expect("memory_search ran");
    assert_eq!(result.data["tool"], "memory_search");
    assert!(
        result.data["output"]
            .as_str()
            .unwrap()
            .contains("2026-11-20"),
        "{}",
        result.data
    );
    let (code, hits) = keel
        .get(
            "/ai/memory/search?q=F7%20crucible%20replaced&k=3",
            Some(KEY_ACME),
        )
        .await;
    assert_eq!(code, 200, "{hits}");
    assert!(hits.to_string().contains("2026-11-20"), "{hits}");

    // Another tenant: nothing by the API, nothing through the tool.
    let (code, hits) = keel
        .get(
            "/ai/memory/search?q=F7%20crucible%20replaced&k=3",
            Some(KEY_GLOBEX),
        )
        .await;
    assert_eq!(code, 200);
    assert!(!hits.to_string().contains("2026-11-20"), "{hits}");
    let (_, run) = keel
        .post(
            "/ai/runs",
            json!({"input": "When was the F7 crucible replaced?", "session": "A"}),
            Some(KEY_GLOBEX),
        )
        .await;
    let frames = keel
        .events(run["id"].as_str().unwrap(), None, Some(KEY_GLOBEX))
        .await;
    let result = frames
        .iter()
        .find(|f| f.event == "tool_result")
        .expect("memory_search ran");
    assert!(
        !result.data["output"]
            .as_str()
            .unwrap()
            .contains("2026-11-20"),
        "{}",
        result.data
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
    let (_, ready) = keel.get("/readyz", None).await;
    assert!(ready["memory"].is_object(), "{ready}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}
