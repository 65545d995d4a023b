#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `memory_search` and `memory_get` as the agent loop calls them: scoped by
//! the run's tenant and agent, whatever the arguments say.

mod common;

use std::sync::Arc;

use keel_memory::{Embedder, Memory, MemoryGetTool, MemorySearchTool, Settings};
use keel_protocol::{Risk, Tool, ToolContext, ToolSource};
use serde_json::json;

fn ctx(tenant: &str, agent: &str) -> ToolContext {
    ToolContext {
        tenant: tenant.into(),
        principal: "alice".into(),
        agent: agent.into(),
        session: "s".into(),
        run_id: "run_1".into(),
        call_id: "call_1".into(),
    }
}

async fn memory(dir: &std::path::Path) -> Arc<dyn Memory> {
    let e: Arc<dyn Embedder> = common::CountingEmbedder::new();
    keel_memory::open_with("", dir, Some(e), Settings::default(), None)
        .await
        .unwrap()
}

#[tokio::test]
async fn search_then_get_through_the_tools() {
    let dir = tempfile::tempdir().unwrap();
    let memory = memory(dir.path()).await;
    memory
        .add_document(common::doc(
            "acme",
            "ops",
            "session:chat-1",
            "# Session chat-1\n- Decision: furnace F2 runs at 840 °C.\n- Open: order TC-448.",
        ))
        .await
        .unwrap();
    let search = MemorySearchTool::new(memory.clone());
    let get = MemoryGetTool::new(memory.clone());
    for tool in [search.spec(), get.spec()] {
        assert_eq!(tool.risk, Risk::Read);
        assert_eq!(tool.source, ToolSource::Builtin);
        assert!(!tool.requires_approval);
    }
    assert_eq!(search.spec().name, "memory_search");
    assert_eq!(search.spec().required_params(), ["query"]);
    assert_eq!(get.spec().name, "memory_get");

    let out = search
        .call(
            json!({"query": "furnace F2 temperature", "k": 3}),
            &ctx("acme", "ops"),
        )
        .await
        .unwrap();
    let hits = out.structured.unwrap()["hits"].as_array().unwrap().clone();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0]["source"], "session:chat-1");
    assert!(hits[0]["snippet"].as_str().unwrap().contains("840"));
    assert!(hits[0]["score"].as_f64().unwrap() > 0.0);
    assert!(out.content.contains("840"));
    let id = hits[0]["id"].as_str().unwrap();

    let out = get
        .call(
            json!({"id": id, "from": 2, "lines": 1}),
            &ctx("acme", "ops"),
        )
        .await
        .unwrap();
    assert_eq!(out.content, "- Decision: furnace F2 runs at 840 °C.");
    assert!(!out.is_error);

    // Another tenant, or another agent, finds and reads nothing.
    for (tenant, agent) in [("globex", "ops"), ("acme", "other")] {
        let out = search
            .call(json!({"query": "furnace F2 840"}), &ctx(tenant, agent))
            .await
            .unwrap();
        assert_eq!(out.structured.unwrap()["hits"], json!([]));
        let out = get
            .call(json!({"id": id}), &ctx(tenant, agent))
            .await
            .unwrap();
        assert!(out.is_error);
        assert!(!out.content.contains("840"));
    }

    // A blank query is the model's mistake, reported as a failure it can fix.
    let err = search
        .call(json!({"query": "   "}), &ctx("acme", "ops"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("query"), "{err}");
}
