//! SPEC §2 through a real `keel serve`: auth, tenant scoping, the error body,
//! size limits, listing, idempotency, tools, sessions and operations endpoints.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Env, KEY_ACME, KEY_GLOBEX, Keel};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::json;

async fn keel_with_auth(model: &FakeOpenAi, tools: &ToolServer) -> Keel {
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    Keel::start(&env).await
}

#[tokio::test]
async fn missing_or_unknown_keys_are_401_and_health_needs_none() {
    let model = FakeOpenAi::start(Script::queue(vec![])).await;
    let tools = ToolServer::start().await;
    let keel = keel_with_auth(&model, &tools).await;
    let (code, body) = keel.post("/ai/runs", json!({"input": "hi"}), None).await;
    assert_eq!(code, 401);
    assert_eq!(body["error"]["code"], "unauthorized");
    let (code, _) = keel
        .post("/ai/runs", json!({"input": "hi"}), Some("wrong"))
        .await;
    assert_eq!(code, 401);
    let (code, _) = keel.get("/ai/tools", None).await;
    assert_eq!(code, 401);
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (code, _) = keel.get(path, None).await;
        assert_eq!(code, 200, "{path}");
    }
    let (_, ready) = keel.get("/readyz", None).await;
    assert_eq!(ready["checks"]["store"], "ok");
}

#[tokio::test]
async fn another_tenants_run_is_404_on_every_endpoint() {
    let model = FakeOpenAi::start(Script::queue(vec![Reply::tool_call(
        "furnace_status",
        json!({}),
    )]))
    .await;
    let tools = ToolServer::start().await;
    let keel = keel_with_auth(&model, &tools).await;
    let id = keel.start_run("How is the furnace?", Some(KEY_ACME)).await;
    let run = keel.wait_status(&id, "waiting_input", Some(KEY_ACME)).await;
    assert_eq!(run["tenant"], "acme");
    let session = run["session"].as_str().unwrap().to_owned();

    let g = Some(KEY_GLOBEX);
    for path in [
        format!("/ai/runs/{id}"),
        format!("/ai/runs/{id}/events"),
        format!("/ai/sessions/{session}"),
    ] {
        let (code, body) = keel.get(&path, g).await;
        assert_eq!(code, 404, "{path}: {body}");
        assert_eq!(body["error"]["code"], "not_found");
        assert!(
            !body.to_string().contains("furnace"),
            "no content leaks: {body}"
        );
    }
    for action in ["input", "steer", "follow_up", "cancel"] {
        let (code, body) = keel
            .post(&format!("/ai/runs/{id}/{action}"), json!({"text": "F1"}), g)
            .await;
        assert_eq!(code, 404, "{action}: {body}");
    }
    let (_, list) = keel.get("/ai/runs", g).await;
    assert_eq!(list["runs"].as_array().unwrap().len(), 0);
    let (_, list) = keel.get(&format!("/ai/runs?session={session}"), g).await;
    assert_eq!(list["runs"].as_array().unwrap().len(), 0);
    // Globex using acme's session key gets a session of its own, not acme's history.
    let (code, _) = keel
        .post("/ai/runs", json!({"input": "hello", "session": session}), g)
        .await;
    assert_eq!(code, 201);

    // The owner still sees and controls it; nothing changed.
    let run = keel.wait_status(&id, "waiting_input", Some(KEY_ACME)).await;
    assert_eq!(run["status"], "waiting_input");
    let (_, list) = keel.get("/ai/runs", Some(KEY_ACME)).await;
    assert_eq!(list["runs"].as_array().unwrap().len(), 1);
    let (code, _) = keel
        .post(&format!("/ai/runs/{id}/cancel"), json!({}), Some(KEY_ACME))
        .await;
    assert_eq!(code, 202);
    let run = keel.wait_status(&id, "cancelled", Some(KEY_ACME)).await;
    assert_eq!(run["status"], "cancelled");
    let frames = keel.events(&id, None, Some(KEY_ACME)).await;
    assert_eq!(frames.last().unwrap().data["by"], "alice");
}

#[tokio::test]
async fn bad_bodies_get_clear_errors_naming_the_field() {
    let model = FakeOpenAi::start(Script::queue(vec![])).await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;

    let (code, body) = keel
        .post_raw("/ai/runs", b"{\"input\": ".to_vec(), None)
        .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request");

    let (code, body) = keel.post("/ai/runs", json!({"input": 5}), None).await;
    assert_eq!(code, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("input"),
        "{body}"
    );

    let (code, body) = keel.post("/ai/runs", json!({"inptu": "x"}), None).await;
    assert_eq!(code, 400);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("inptu"),
        "{body}"
    );

    let (code, body) = keel
        .post("/ai/runs", json!({"input": "x", "metadata": [1]}), None)
        .await;
    assert_eq!(code, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("metadata"),
        "{body}"
    );

    let (code, body) = keel.post("/ai/runs", json!({"input": ""}), None).await;
    assert_eq!(code, 400, "{body}");

    let (code, body) = keel
        .post("/ai/runs", json!({"input": "x", "agent": "nobody"}), None)
        .await;
    assert_eq!(code, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nobody"),
        "{body}"
    );

    let big_input = "a".repeat(64 * 1024 + 1);
    let (code, body) = keel
        .post("/ai/runs", json!({"input": big_input}), None)
        .await;
    assert_eq!(code, 413, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("input"),
        "{body}"
    );

    let huge = vec![b' '; 2 * 1024 * 1024];
    let (code, body) = keel.post_raw("/ai/runs", huge, None).await;
    assert_eq!(code, 413, "{body}");
    assert_eq!(body["error"]["code"], "payload_too_large");

    let (code, body) = keel.post_raw("/ai/runs", Vec::new(), None).await;
    assert_eq!(code, 400, "{body}");

    for path in [
        "/ai/runs/run_nope",
        "/ai/runs/run_nope/events",
        "/ai/sessions/nope",
    ] {
        let (code, body) = keel.get(path, None).await;
        assert_eq!(code, 404, "{path}: {body}");
    }
    let (code, _) = keel
        .post("/ai/runs/run_nope/input", json!({"text": "x"}), None)
        .await;
    assert_eq!(code, 404);
    let (code, body) = keel
        .post("/ai/runs/run_nope/input", json!({"txt": "x"}), None)
        .await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = keel.get("/ai/runs?status=bogus", None).await;
    assert_eq!(code, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("status")
    );
    let (code, _) = keel.get("/ai/runs?limit=0", None).await;
    assert_eq!(code, 400);
    let (code, _) = keel.get("/ai/runs?cursor=zzz", None).await;
    assert_eq!(code, 400);
    let (code, _) = keel.get("/no/such/path", None).await;
    assert_eq!(code, 404);
    // Still healthy after all of that.
    let (code, _) = keel.get("/healthz", None).await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn idempotency_key_returns_the_same_run() {
    let model = FakeOpenAi::start(Script::queue(vec![Reply::text("one")])).await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let body = json!({"input": "hi", "idempotency_key": "req-1"});
    let (c1, a) = keel.post("/ai/runs", body.clone(), None).await;
    let (c2, b) = keel.post("/ai/runs", body, None).await;
    assert_eq!((c1, c2), (201, 201));
    assert_eq!(a["id"], b["id"]);
    keel.wait_status(a["id"].as_str().unwrap(), "completed", None)
        .await;
    assert_eq!(model.request_count(), 1);
}

/// A streamed run shows every event from the first, whether this request
/// started it (the stream begins live) or an idempotency key found it
/// after it ended (the stream is read from the store).
#[tokio::test]
async fn a_streamed_run_and_its_idempotent_repeat_stream_the_same_events() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
        Reply::text("F1 is running."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let stream = || async {
        let resp = reqwest::Client::new()
            .post(keel.url("/ai/runs"))
            .header("Accept", "text/event-stream")
            .json(&json!({"input": "How is F1?", "idempotency_key": "req-stream"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        keel_test_support::sse::read_frames(resp, Duration::from_secs(30), |_| false).await
    };
    let first = stream().await;
    common::assert_gap_free(&first, 1);
    let types = keel_test_support::sse::types(&first);
    assert_eq!(types.first().map(String::as_str), Some("run_started"));
    assert_eq!(types.last().map(String::as_str), Some("run_completed"));
    assert!(types.iter().any(|t| t == "tool_result"), "{types:?}");

    let again = stream().await;
    common::assert_gap_free(&again, 1);
    let seen = |frames: &[keel_test_support::sse::Frame]| {
        frames
            .iter()
            .map(|f| (f.id, f.event.clone(), f.data.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(seen(&again), seen(&first));
    assert_eq!(model.request_count(), 2, "the repeat ran nothing");
}

#[tokio::test]
async fn runs_list_newest_first_with_pagination_and_sessions_keep_history() {
    let model = FakeOpenAi::start(Script::handler(|req| {
        let n = req["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "user")
            .count();
        Reply::text(format!("answer {n}"))
    }))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let (code, run) = keel
            .post(
                "/ai/runs",
                json!({"input": format!("q{i}"), "session": "plant-1"}),
                None,
            )
            .await;
        assert_eq!(code, 201);
        let id = run["id"].as_str().unwrap().to_owned();
        keel.wait_status(&id, "completed", None).await;
        ids.push(id);
    }
    // The third run saw the whole session: three user messages.
    let (_, run) = keel.get(&format!("/ai/runs/{}", ids[2]), None).await;
    assert_eq!(run["output"], "answer 3");
    let (_, page1) = keel.get("/ai/runs?session=plant-1&limit=2", None).await;
    let got: Vec<&str> = page1["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, vec![ids[2].as_str(), ids[1].as_str()]);
    let cursor = page1["next_cursor"].as_str().unwrap();
    let (_, page2) = keel
        .get(
            &format!("/ai/runs?session=plant-1&limit=2&cursor={cursor}"),
            None,
        )
        .await;
    let got: Vec<&str> = page2["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, vec![ids[0].as_str()]);
    assert!(page2["next_cursor"].is_null());
    let (_, completed) = keel.get("/ai/runs?status=completed", None).await;
    assert_eq!(completed["runs"].as_array().unwrap().len(), 3);
    let (_, session) = keel.get("/ai/sessions/plant-1", None).await;
    assert_eq!(session["messages"].as_array().unwrap().len(), 6);
}

#[tokio::test]
async fn tools_endpoint_hides_tools_the_caller_may_not_use() {
    let model = FakeOpenAi::start(Script::queue(vec![])).await;
    let tools = ToolServer::start().await;
    let keel = keel_with_auth(&model, &tools).await;
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, acme) = keel.get("/ai/tools", Some(KEY_ACME)).await;
    assert!(
        names(&acme).contains(&"restart_furnace".to_owned()),
        "{acme}"
    );
    let (_, globex) = keel.get("/ai/tools", Some(KEY_GLOBEX)).await;
    assert!(
        !names(&globex).contains(&"restart_furnace".to_owned()),
        "{globex}"
    );
    let t = &acme["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "furnace_status")
        .unwrap()
        .clone();
    assert_eq!(t["risk"], "read");
    assert_eq!(t["source"], "http");
    assert_eq!(t["parameters"]["required"], json!(["furnace_id"]));
}

#[tokio::test]
async fn a_call_to_a_tool_the_roles_forbid_is_denied_and_never_runs() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("restart_furnace", json!({"furnace_id": "F1"})),
        Reply::text("I am not allowed to restart furnaces."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = keel_with_auth(&model, &tools).await;
    let id = keel.start_run("Restart F1", Some(KEY_GLOBEX)).await;
    let frames = keel.events(&id, None, Some(KEY_GLOBEX)).await;
    let pd = frames
        .iter()
        .find(|f| f.event == "policy_decision")
        .unwrap();
    assert_eq!(pd.data["decision"], "deny");
    assert_eq!(pd.data["rule"], "tool_roles");
    assert!(!frames.iter().any(|f| f.event == "tool_call"));
    assert_eq!(tools.count("restart"), 0);
    // The model never saw the tool offered either.
    let offered: Vec<String> = model.requests()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        !offered.contains(&"restart_furnace".to_owned()),
        "{offered:?}"
    );
    assert!(model.violations().is_empty());
}

#[tokio::test]
async fn metrics_count_runs_steps_and_tool_calls() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
        Reply::text("ok"),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("How is F1?", None).await;
    keel.wait_status(&id, "completed", None).await;
    let text = reqwest::get(keel.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "keel_runs_total{status=\"completed\"} 1",
        "keel_steps_total 2",
        "keel_tool_calls_total{tool=\"furnace_status\",outcome=\"ok\"} 1",
        "keel_llm_latency_seconds",
        "keel_step_overhead_seconds",
    ] {
        assert!(text.contains(needle), "missing {needle} in:\n{text}");
    }
}

#[tokio::test]
async fn a_request_head_past_8_kb_is_431_and_the_server_goes_on() {
    let model = FakeOpenAi::start(Script::queue(vec![])).await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let http = reqwest::Client::new();
    let health_with_header_of = |bytes: usize| {
        http.get(keel.url("/healthz"))
            .header("x-trace-context", "t".repeat(bytes))
            .send()
    };
    // A long header that still fits (a large token, say) is served.
    let fits = health_with_header_of(6 * 1024).await.unwrap();
    assert_eq!(fits.status().as_u16(), 200);
    let refused = health_with_header_of(9 * 1024).await.unwrap();
    assert_eq!(refused.status().as_u16(), 431);
    let (code, _) = keel.get("/healthz", None).await;
    assert_eq!(code, 200, "the server still answers");
}
