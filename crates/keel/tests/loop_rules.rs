//! SPEC §4.1–4.4, 4.11, 4.14, 4.15 through a real `keel serve`, a fake model
//! speaking the OpenAI wire protocol, and a real HTTP tool backend.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Env, Keel, assert_gap_free};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::sse::{is_subsequence, types};
use keel_test_support::tool_server::ToolServer;
use serde_json::json;

fn no_tools_offered(req: &serde_json::Value) -> bool {
    req.get("tools")
        .is_none_or(|t| t.as_array().is_some_and(|a| a.is_empty()))
}

#[tokio::test]
async fn two_tool_calls_stream_in_order_and_resume_from_last_event_id() {
    for stream in [true, false] {
        let model = FakeOpenAi::start(Script::queue(vec![
            Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
            Reply::tool_call("furnace_status", json!({"furnace_id": "F2"})),
            Reply::text("F1 and F2 are both running."),
        ]))
        .await;
        let tools = ToolServer::start().await;
        let mut env = Env::new(&model.base_url(), &tools.base_url());
        env.stream = stream;
        let keel = Keel::start(&env).await;

        let resp = reqwest::Client::new()
            .post(keel.url("/ai/runs"))
            .header("Accept", "text/event-stream")
            .json(&json!({"input": "How are furnaces F1 and F2?"}))
            .send()
            .await
            .unwrap();
        let frames =
            keel_test_support::sse::read_frames(resp, Duration::from_secs(30), |_| false).await;
        let t = types(&frames);
        assert!(
            is_subsequence(
                &t,
                &[
                    "run_started",
                    "react_plan",
                    "policy_decision",
                    "tool_call",
                    "tool_result",
                    "react_plan",
                    "policy_decision",
                    "tool_call",
                    "tool_result",
                    "final",
                    "run_completed"
                ]
            ),
            "stream={stream}: {t:?}"
        );
        assert_eq!(t.iter().filter(|x| *x == "tool_call").count(), 2);
        assert_eq!(t.last().unwrap(), "run_completed");
        assert_gap_free(&frames, 1);
        let last = frames.last().unwrap();
        assert_eq!(last.data["reason"], "answered");
        assert_eq!(last.data["usage"]["llm_calls"], 3);
        assert_eq!(last.data["usage"]["tool_calls"], 2);
        let result = frames.iter().find(|f| f.event == "tool_result").unwrap();
        assert_eq!(result.data["ok"], true);
        assert!(result.data["output"].as_str().unwrap().contains("1450"));
        let run_id = frames[0].data["run_id"].as_str().unwrap().to_owned();

        // A reconnect gets exactly the rest, by header and by query.
        for k in [1u64, 4, frames.len() as u64 - 1] {
            let rest = keel.events(&run_id, Some(k), None).await;
            assert_eq!(rest.len() as u64, frames.len() as u64 - k, "after {k}");
            assert_gap_free(&rest, k + 1);
            assert_eq!(types(&rest), t[k as usize..].to_vec());
        }
        let resp = reqwest::get(keel.url(&format!("/ai/runs/{run_id}/events?after=5")))
            .await
            .unwrap();
        let rest =
            keel_test_support::sse::read_frames(resp, Duration::from_secs(10), |_| false).await;
        assert_gap_free(&rest, 6);

        let (_, run) = keel.get(&format!("/ai/runs/{run_id}"), None).await;
        assert_eq!(run["status"], "completed");
        assert_eq!(run["output"], "F1 and F2 are both running.");
        assert_eq!(run["steps"], 3);
        assert_eq!(tools.count("furnace"), 2);
        assert!(model.violations().is_empty(), "{:?}", model.violations());
        // Tool output reaches the model as a tool message.
        let third = &model.requests()[2];
        let msgs = third["messages"].as_array().unwrap();
        assert!(
            msgs.iter()
                .any(|m| m["role"] == "tool" && m["content"].as_str().unwrap().contains("B-F2-7"))
        );
    }
}

#[tokio::test]
async fn clarify_naming_no_tool_falls_back_to_one_tool_less_call() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call(
            "clarify",
            json!({"tool_name": "", "missing_slots": [], "question": "What do you mean?"}),
        ),
        Reply::text("The foundry industry casts molten metal into shapes."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("What is the foundry industry?", None).await;
    let frames = keel.events(&id, None, None).await;
    let t = types(&frames);
    assert!(!t.contains(&"clarification_needed".to_owned()), "{t:?}");
    let fb = frames.iter().find(|f| f.event == "react_feedback").unwrap();
    assert_eq!(fb.data["code"], "clarify_without_actionable_tool");
    let pd = frames
        .iter()
        .find(|f| f.event == "policy_decision")
        .unwrap();
    assert_eq!(pd.data["decision"], "fallback");
    assert_eq!(t.last().unwrap(), "run_completed");
    let fin = frames.iter().find(|f| f.event == "final").unwrap();
    assert_eq!(
        fin.data["answer"],
        "The foundry industry casts molten metal into shapes."
    );
    // Exactly one extra model call, and it offered no tools.
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2);
    assert!(no_tools_offered(&reqs[1]));
    assert!(!no_tools_offered(&reqs[0]));
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn clarify_for_a_real_tool_asks_and_the_answer_reaches_the_model() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("clarify", json!({"tool_name": "furnace_status", "missing_slots": ["furnace_id"], "question": "Which furnace?"})),
        Reply::tool_call("furnace_status", json!({"furnace_id": "F3"})),
        Reply::text("F3 is running."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("How is the furnace?", None).await;
    let frames = keel
        .events_until(&id, None, None, |f| f.event == "clarification_needed")
        .await;
    let q = frames.last().unwrap();
    assert_eq!(q.data["question"], "Which furnace?");
    assert_eq!(q.data["tool"], "furnace_status");
    assert_eq!(q.data["round"], 1);
    keel.wait_status(&id, "waiting_input", None).await;
    let (code, _) = keel
        .post(&format!("/ai/runs/{id}/input"), json!({"text": "F3"}), None)
        .await;
    assert_eq!(code, 202);
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "F3 is running.");
    // The answer joins the conversation as the user's own message, after
    // the clarify call's result, and the model makes the call from it.
    let second = &model.requests()[1];
    let msgs = second["messages"].as_array().unwrap();
    let last = msgs.last().unwrap();
    assert_eq!(
        (&last["role"], &last["content"]),
        (&json!("user"), &json!("F3"))
    );
    assert_eq!(msgs[msgs.len() - 2]["role"], "tool");
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn missing_required_argument_waits_for_input_then_runs_once_with_it() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("furnace_status", json!({})),
        Reply::text("F2 is running at 1450 °C."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("How is the furnace doing?", None).await;
    let run = keel.wait_status(&id, "waiting_input", None).await;
    assert_eq!(run["pending"]["missing_slots"], json!(["furnace_id"]));
    assert!(
        run["pending"]["question"]
            .as_str()
            .unwrap()
            .contains("Furnace id, e.g. F2")
    );
    assert_eq!(tools.count("furnace"), 0);

    // Steering or input to a run that is not waiting is a conflict; this one waits.
    let (code, _) = keel
        .post(&format!("/ai/runs/{id}/input"), json!({"text": "F2"}), None)
        .await;
    assert_eq!(code, 202);
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "F2 is running at 1450 °C.");
    let calls = tools.calls();
    assert_eq!(
        calls,
        vec![("furnace".to_owned(), json!({"furnace_id": "F2"}))]
    );
    let frames = keel.events(&id, None, None).await;
    let t = types(&frames);
    assert!(
        is_subsequence(
            &t,
            &[
                "react_plan",
                "react_feedback",
                "policy_decision",
                "clarification_needed",
                "policy_decision",
                "tool_call",
                "tool_result",
                "final",
                "run_completed"
            ]
        ),
        "{t:?}"
    );
    let fb = frames.iter().find(|f| f.event == "react_feedback").unwrap();
    assert_eq!(fb.data["code"], "missing_required_arguments");
    let call = frames.iter().find(|f| f.event == "tool_call").unwrap();
    assert_eq!(call.data["arguments"], json!({"furnace_id": "F2"}));
    assert_eq!(model.request_count(), 2);
    assert!(model.violations().is_empty(), "{:?}", model.violations());

    // Input to a finished run: 409.
    let (code, body) = keel
        .post(
            &format!("/ai/runs/{id}/input"),
            json!({"text": "again"}),
            None,
        )
        .await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
}

#[tokio::test]
async fn clarification_rounds_are_capped_then_the_answer_says_what_is_missing() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("furnace_status", json!({})),
        Reply::tool_call("furnace_status", json!({})),
        Reply::tool_call("furnace_status", json!({})),
        Reply::text("I need the furnace id to check its status."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.agent_extra = "[agents.limits]\nmax_clarify_rounds = 2\n".into();
    let keel = Keel::start(&env).await;
    let id = keel.start_run("Check the furnace", None).await;
    for answer in ["{\"wrong\": 1}", "{\"other\": 2}"] {
        keel.wait_status(&id, "waiting_input", None).await;
        let (code, _) = keel
            .post(
                &format!("/ai/runs/{id}/input"),
                json!({"text": answer}),
                None,
            )
            .await;
        assert_eq!(code, 202);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "I need the furnace id to check its status.");
    let frames = keel.events(&id, None, None).await;
    assert_eq!(
        frames
            .iter()
            .filter(|f| f.event == "clarification_needed")
            .count(),
        2
    );
    assert!(
        frames
            .iter()
            .any(|f| f.event == "policy_decision" && f.data["decision"] == "fallback")
    );
    assert_eq!(frames.last().unwrap().data["reason"], "fallback");
    assert!(no_tools_offered(model.requests().last().unwrap()));
    assert_eq!(tools.count("furnace"), 0);
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn schema_guard_returns_violations_for_repair_and_unknown_tools_too() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("furnace_status", json!({"furnace_id": 42})),
        Reply::tool_call(
            "furnace_status",
            json!({"furnace_id": "F1", "color": "red"}),
        ),
        Reply::raw_tool_call("furnace_status", "{\"furnace_id\": \"F1\""),
        Reply::tool_call("no_such_tool", json!({})),
        Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
        Reply::text("F1 is running."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.agent_extra = "[agents.limits]\nmax_repairs = 3\n".into();
    let keel = Keel::start(&env).await;
    let id = keel.start_run("How is F1?", None).await;
    let frames = keel.events(&id, None, None).await;
    let codes: Vec<String> = frames
        .iter()
        .filter(|f| f.event == "react_feedback")
        .map(|f| f.data["code"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        codes,
        vec![
            "invalid_arguments",
            "invalid_arguments",
            "invalid_arguments",
            "unknown_tool"
        ]
    );
    let details: Vec<String> = frames
        .iter()
        .filter(|f| f.event == "react_feedback")
        .map(|f| f.data["detail"].as_str().unwrap().to_owned())
        .collect();
    assert!(details[0].contains("furnace_id"), "{}", details[0]);
    assert!(details[1].contains("color"), "{}", details[1]);
    assert!(details[2].contains("JSON"), "{}", details[2]);
    assert!(
        details[3].contains("furnace_status"),
        "lists available tools: {}",
        details[3]
    );
    // Only the valid call executed.
    assert_eq!(frames.iter().filter(|f| f.event == "tool_call").count(), 1);
    assert_eq!(tools.count("furnace"), 1);
    assert_eq!(frames.last().unwrap().data["reason"], "answered");
    // The violation reached the model as the call's tool result.
    let second = &model.requests()[1];
    let last = second["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "tool");
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .contains("invalid_arguments")
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn repeated_invalid_calls_fall_back_after_max_repairs() {
    let bad = || Reply::tool_call("furnace_status", json!({"furnace_id": 7}));
    let model = FakeOpenAi::start(Script::queue(vec![
        bad(),
        bad(),
        bad(),
        Reply::text("I could not query the furnace."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("How is furnace 7?", None).await;
    let frames = keel.events(&id, None, None).await;
    // max_repairs = 2: the third invalid call in a row ends in a fallback.
    assert_eq!(
        frames
            .iter()
            .filter(|f| f.event == "react_feedback")
            .count(),
        3
    );
    let pd = frames
        .iter()
        .find(|f| f.event == "policy_decision")
        .unwrap();
    assert_eq!(pd.data["decision"], "fallback");
    assert_eq!(pd.data["rule"], "max_repairs");
    assert_eq!(frames.last().unwrap().data["reason"], "fallback");
    assert_eq!(model.request_count(), 4);
    assert!(no_tools_offered(&model.requests()[3]));
    assert_eq!(tools.count("furnace"), 0);
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn step_budget_ends_with_an_answer_from_what_is_known() {
    let model = FakeOpenAi::start(Script::handler(|req| {
        if no_tools_offered(req) {
            Reply::text("Partial: F1 is running; I ran out of steps.")
        } else {
            Reply::tool_call("furnace_status", json!({"furnace_id": "F1"}))
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.agent_extra = "[agents.limits]\nmax_steps = 3\n".into();
    let keel = Keel::start(&env).await;
    let id = keel.start_run("Watch F1 forever", None).await;
    let frames = keel.events(&id, None, None).await;
    let last = frames.last().unwrap();
    assert_eq!(last.event, "run_completed");
    assert_eq!(last.data["reason"], "budget_exhausted");
    assert!(
        frames
            .iter()
            .any(|f| f.event == "react_feedback" && f.data["code"] == "budget_exhausted")
    );
    assert_eq!(tools.count("furnace"), 3);
    assert_eq!(model.request_count(), 4);
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "Partial: F1 is running; I ran out of steps.");
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn tool_call_budget_closes_the_open_calls_and_answers() {
    let model = FakeOpenAi::start(Script::handler(|req| {
        if no_tools_offered(req) {
            Reply::text("Checked what I could.")
        } else {
            Reply::tool_calls(vec![
                ("furnace_status", json!({"furnace_id": "F1"})),
                ("furnace_status", json!({"furnace_id": "F2"})),
                ("furnace_status", json!({"furnace_id": "F3"})),
            ])
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.agent_extra = "[agents.limits]\nmax_tool_calls = 2\n".into();
    let keel = Keel::start(&env).await;
    let id = keel.start_run("Check all furnaces", None).await;
    let frames = keel.events(&id, None, None).await;
    assert_eq!(frames.last().unwrap().data["reason"], "budget_exhausted");
    assert_eq!(tools.count("furnace"), 2);
    assert!(
        model.violations().is_empty(),
        "every call got one result: {:?}",
        model.violations()
    );
}

#[tokio::test]
async fn cancel_stops_a_run_whose_model_never_answers() {
    let model = FakeOpenAi::start(Script::queue(vec![Reply::hang()])).await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("Think forever", None).await;
    keel.events_until(&id, None, None, |f| f.event == "run_started")
        .await;
    // Wait until the model request is in flight.
    for _ in 0..100 {
        if model.request_count() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (code, _) = keel
        .post(&format!("/ai/runs/{id}/cancel"), json!({}), None)
        .await;
    assert_eq!(code, 202);
    let frames = keel.events(&id, None, None).await;
    let last = frames.last().unwrap();
    assert_eq!(last.event, "run_cancelled");
    assert_eq!(last.data["by"], "local");
    let run = keel.wait_status(&id, "cancelled", None).await;
    assert!(run["output"].is_null());
    let (code, _) = keel
        .post(&format!("/ai/runs/{id}/cancel"), json!({}), None)
        .await;
    assert_eq!(code, 409);
}

#[tokio::test]
async fn cancel_during_a_tool_closes_its_call() {
    let model = FakeOpenAi::start(Script::queue(vec![Reply::tool_call(
        "slow_op",
        json!({"ms": 20000}),
    )]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("Do the slow thing", None).await;
    keel.events_until(&id, None, None, |f| f.event == "tool_call")
        .await;
    let (code, _) = keel
        .post(&format!("/ai/runs/{id}/cancel"), json!({}), None)
        .await;
    assert_eq!(code, 202);
    let frames = keel.events(&id, None, None).await;
    assert_eq!(frames.last().unwrap().event, "run_cancelled");
    let (_, session) = keel
        .get(
            &format!(
                "/ai/sessions/{}",
                frames[0].data["session"].as_str().unwrap()
            ),
            None,
        )
        .await;
    let msgs = session["messages"].as_array().unwrap();
    let results: Vec<_> = msgs.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(
        results.len(),
        1,
        "the cancelled call still has exactly one result: {msgs:?}"
    );
}

#[tokio::test]
async fn steering_skips_the_rest_of_the_turn_and_reaches_the_model() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_calls(vec![
            ("slow_op", json!({"ms": 1500})),
            ("furnace_status", json!({"furnace_id": "F9"})),
        ]),
        Reply::text("Switched to F4 as asked: F4 is fine."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel
        .start_run("Run the slow check then look at F9", None)
        .await;
    keel.events_until(&id, None, None, |f| f.event == "tool_call")
        .await;
    let (code, _) = keel
        .post(
            &format!("/ai/runs/{id}/steer"),
            json!({"text": "Forget F9, check F4 instead"}),
            None,
        )
        .await;
    assert_eq!(code, 202);
    let frames = keel.events(&id, None, None).await;
    let steer = frames
        .iter()
        .find(|f| f.event == "steering_applied")
        .expect("steering_applied");
    assert_eq!(steer.data["text"], "Forget F9, check F4 instead");
    assert_eq!(steer.data["skipped_calls"].as_array().unwrap().len(), 1);
    assert_eq!(tools.count("slow"), 1, "the running tool finished");
    assert_eq!(
        tools.count("furnace"),
        0,
        "the rest of the turn was skipped"
    );
    let second = &model.requests()[1];
    let last = second["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user");
    assert_eq!(last["content"], "Forget F9, check F4 instead");
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn follow_up_is_processed_by_the_same_run() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::text("F1 is running.").after(Duration::from_millis(800)),
        Reply::text("F2 is running too."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("How is F1?", None).await;
    let (code, _) = keel
        .post(
            &format!("/ai/runs/{id}/follow_up"),
            json!({"text": "And F2?"}),
            None,
        )
        .await;
    assert_eq!(code, 202);
    let frames = keel.events(&id, None, None).await;
    let t = types(&frames);
    assert!(
        is_subsequence(
            &t,
            &["final", "follow_up_started", "final", "run_completed"]
        ),
        "{t:?}"
    );
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "F2 is running too.");
    assert_eq!(model.request_count(), 2);
}

#[tokio::test]
async fn provider_failures_are_retried_then_fail_the_run_clearly() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::status(503, "{\"error\":{\"message\":\"overloaded\"}}"),
        Reply::status(429, "{\"error\":{\"message\":\"slow down\"}}")
            .with_header("Retry-After", "0"),
        Reply::text("Recovered."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("hello", None).await;
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "Recovered.");
    assert_eq!(model.request_count(), 3);

    let model = FakeOpenAi::start(Script::handler(|_| {
        Reply::status(500, "{\"error\":{\"message\":\"boom\"}}")
    }))
    .await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("hello", None).await;
    let frames = keel.events(&id, None, None).await;
    let last = frames.last().unwrap();
    assert_eq!(last.event, "run_failed");
    assert_eq!(last.data["error"]["code"], "provider_error");
    assert!(
        last.data["error"]["message"]
            .as_str()
            .unwrap()
            .contains("500"),
        "{}",
        last.data
    );
    // max_retries = 2: three attempts in all.
    assert_eq!(model.request_count(), 3);
    let run = keel.wait_status(&id, "failed", None).await;
    assert_eq!(run["error"]["code"], "provider_error");
}

#[tokio::test]
async fn malformed_model_output_never_crashes_the_loop() {
    let huge = "x".repeat(2 * 1024 * 1024);
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::raw_tool_call("furnace_status", "not json at all"),
        Reply::raw_tool_call("", "{}"),
        Reply::text(huge),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("Say a lot", None).await;
    let frames = keel.events(&id, None, None).await;
    let last = frames.last().unwrap();
    assert!(
        last.event == "run_completed" || last.event == "run_failed",
        "{}",
        last.event
    );
    let (code, run) = keel.get(&format!("/ai/runs/{id}"), None).await;
    assert_eq!(code, 200);
    if run["status"] == "completed" {
        let out = run["output"].as_str().unwrap();
        assert!(
            out.len() < 300 * 1024,
            "a 2 MB reply is capped, got {}",
            out.len()
        );
        assert!(out.contains("truncated"));
    } else {
        assert!(run["error"]["message"].as_str().unwrap().len() > 10);
    }
    let (code, _) = keel.get("/healthz", None).await;
    assert_eq!(code, 200);
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}
