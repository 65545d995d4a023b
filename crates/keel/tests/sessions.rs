//! Session reset (SPEC §2, §6): archive, summary by the model (or verbatim
//! fallback), a fresh history afterwards, and `/new` typed as input.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Env, KEY_ACME, KEY_GLOBEX, Keel};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::json;

fn user_messages(req: &serde_json::Value) -> Vec<String> {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[tokio::test]
async fn reset_archives_the_session_and_the_next_run_starts_fresh() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::text("Noted: the crucible of furnace F7 was replaced on 2026-11-20."),
        Reply::text("## Facts\n- Furnace F7: crucible replaced on 2026-11-20."),
        Reply::text("Hello again."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    let keel = Keel::start(&env).await;
    let (code, run) = keel
        .post(
            "/ai/runs",
            json!({"input": "F7's crucible was replaced on 2026-11-20.", "session": "line-7"}),
            Some(KEY_ACME),
        )
        .await;
    assert_eq!(code, 201);
    keel.wait_status(run["id"].as_str().unwrap(), "completed", Some(KEY_ACME))
        .await;

    // Another tenant cannot reset (or see) it.
    let (code, _) = keel
        .post("/ai/sessions/line-7/reset", json!({}), Some(KEY_GLOBEX))
        .await;
    assert_eq!(code, 404);

    let (code, reset) = keel
        .post("/ai/sessions/line-7/reset", json!({}), Some(KEY_ACME))
        .await;
    assert_eq!(code, 200, "{reset}");
    assert_eq!(reset["summarized_by"], "model");
    assert_eq!(reset["messages"], 2);
    assert!(
        reset["summary"]
            .as_str()
            .unwrap()
            .contains("crucible replaced on 2026-11-20")
    );
    let archived = reset["archived_as"].as_str().unwrap();
    assert!(archived.starts_with("line-7~"));
    // The summarizer saw the conversation and was offered no tools.
    let summary_req = &model.requests()[1];
    assert!(summary_req.get("tools").is_none());
    assert!(summary_req.to_string().contains("2026-11-20"));

    let (_, session) = keel.get("/ai/sessions/line-7", Some(KEY_ACME)).await;
    assert_eq!(session["messages"].as_array().unwrap().len(), 0);
    let (_, old) = keel
        .get(&format!("/ai/sessions/{archived}"), Some(KEY_ACME))
        .await;
    assert_eq!(old["messages"].as_array().unwrap().len(), 2);

    let (_, run) = keel
        .post(
            "/ai/runs",
            json!({"input": "hello", "session": "line-7"}),
            Some(KEY_ACME),
        )
        .await;
    keel.wait_status(run["id"].as_str().unwrap(), "completed", Some(KEY_ACME))
        .await;
    assert_eq!(
        user_messages(&model.requests()[2]),
        vec!["hello".to_owned()],
        "the old history is gone from the prompt"
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn a_failed_summary_keeps_the_last_messages_verbatim() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::text("Batch B-12 is on hold."),
        Reply::status(400, "{\"error\":{\"message\":\"no\"}}"),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let (_, run) = keel
        .post(
            "/ai/runs",
            json!({"input": "Status of B-12?", "session": "s"}),
            None,
        )
        .await;
    keel.wait_status(run["id"].as_str().unwrap(), "completed", None)
        .await;
    let (code, reset) = keel.post("/ai/sessions/s/reset", json!({}), None).await;
    assert_eq!(code, 200, "{reset}");
    assert_eq!(reset["summarized_by"], "fallback");
    let summary = reset["summary"].as_str().unwrap();
    assert!(
        summary.contains("Status of B-12?") && summary.contains("Batch B-12 is on hold."),
        "{summary}"
    );
}

#[tokio::test]
async fn typing_new_resets_without_asking_the_model_and_busy_sessions_are_refused() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::text("first answer"),
        Reply::text("summary of the first answer"),
        Reply::hang(),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let (_, run) = keel
        .post(
            "/ai/runs",
            json!({"input": "question one", "session": "chat"}),
            None,
        )
        .await;
    keel.wait_status(run["id"].as_str().unwrap(), "completed", None)
        .await;
    let (_, run) = keel
        .post(
            "/ai/runs",
            json!({"input": "/new", "session": "chat"}),
            None,
        )
        .await;
    let done = keel
        .wait_status(run["id"].as_str().unwrap(), "completed", None)
        .await;
    assert!(
        done["output"]
            .as_str()
            .unwrap()
            .starts_with("Started a new session"),
        "{done}"
    );
    assert_eq!(
        model.request_count(),
        2,
        "one answer and one summary; /new itself asks no model"
    );
    // A run that is still going blocks a reset.
    let (_, run) = keel
        .post(
            "/ai/runs",
            json!({"input": "think forever", "session": "chat"}),
            None,
        )
        .await;
    let id = run["id"].as_str().unwrap().to_owned();
    keel.wait_status(&id, "running", None).await;
    let (code, err) = keel.post("/ai/sessions/chat/reset", json!({}), None).await;
    assert_eq!(code, 409, "{err}");
    let (code, _) = keel.post("/ai/sessions/nope/reset", json!({}), None).await;
    assert_eq!(code, 404);
    keel.post(&format!("/ai/runs/{id}/cancel"), json!({}), None)
        .await;
}

#[tokio::test]
async fn a_session_keel_made_up_is_continued_by_the_next_run() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::text("Furnace F7 ran batch B-12 at 1,480 °C."),
        Reply::text("It was B-12."),
        Reply::text("Nothing new."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    // No session: keel makes one up, and the run starts with no history.
    let (code, first) = keel
        .post("/ai/runs", json!({"input": "What did F7 run?"}), None)
        .await;
    assert_eq!(code, 201, "{first}");
    let session = first["session"].as_str().unwrap().to_owned();
    keel.wait_status(first["id"].as_str().unwrap(), "completed", None)
        .await;
    assert_eq!(
        user_messages(&model.requests()[0]),
        vec!["What did F7 run?".to_owned()]
    );

    // The next run names that session and sees the first run's exchange.
    let (code, second) = keel
        .post(
            "/ai/runs",
            json!({"input": "Which batch was that again?", "session": session}),
            None,
        )
        .await;
    assert_eq!(code, 201, "{second}");
    keel.wait_status(second["id"].as_str().unwrap(), "completed", None)
        .await;
    let prompt = &model.requests()[1];
    assert_eq!(
        user_messages(prompt),
        vec![
            "What did F7 run?".to_owned(),
            "Which batch was that again?".to_owned()
        ]
    );
    assert!(
        prompt.to_string().contains("batch B-12 at 1,480"),
        "the first run's answer is in the second run's prompt: {prompt}"
    );
    // A third run without a session starts fresh again.
    let (_, third) = keel
        .post("/ai/runs", json!({"input": "Anything new?"}), None)
        .await;
    assert_ne!(third["session"], json!(session));
    keel.wait_status(third["id"].as_str().unwrap(), "completed", None)
        .await;
    assert_eq!(
        user_messages(&model.requests()[2]),
        vec!["Anything new?".to_owned()]
    );
}
