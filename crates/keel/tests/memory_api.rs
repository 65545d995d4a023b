//! `/ai/memory/*` over real HTTP on a real `keel serve`: documents added
//! by one tenant are found by that tenant's search and by no other's.
//! Needs the memory wired into `AppState` by `keel serve`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Env, KEY_ACME, KEY_GLOBEX, Keel};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::json;

#[tokio::test]
async fn add_then_search_is_scoped_to_the_tenant() {
    let model = FakeOpenAi::start(Script::queue(vec![Reply::text("unused")])).await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    let keel = Keel::start(&env).await;

    let (status, body) = keel
        .post(
            "/ai/memory/documents",
            json!({"title": "Kiln manual", "text": "The burner purge lasts 90 seconds before ignition."}),
            Some(KEY_ACME),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("mem_"));
    assert_eq!(body["source"], "doc:Kiln manual");

    let (status, body) = keel
        .get("/ai/memory/search?q=burner%20purge&k=3", Some(KEY_ACME))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["hits"][0]["source"], "doc:Kiln manual");
    assert!(
        body["hits"][0]["snippet"]
            .as_str()
            .unwrap()
            .contains("90 seconds")
    );

    let (status, body) = keel
        .get("/ai/memory/search?q=burner%20purge", Some(KEY_GLOBEX))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["hits"], json!([]));

    // Bad input is a 400 naming the field; no key is a 401.
    let (status, body) = keel.get("/ai/memory/search?q=x&k=0", Some(KEY_ACME)).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains('k'));
    let (status, _) = keel.get("/ai/memory/search?q=", Some(KEY_ACME)).await;
    assert_eq!(status, 400);
    let (status, body) = keel
        .post(
            "/ai/memory/documents",
            json!({"title": "t", "text": "x", "agent": "nobody"}),
            Some(KEY_ACME),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = keel
        .post(
            "/ai/memory/documents",
            json!({"title": "t"}),
            Some(KEY_ACME),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = keel.get("/ai/memory/search?q=burner", None).await;
    assert_eq!(status, 401);
}
