//! The run loop (SPEC §4.1–4.4, 4.11, 4.14, 4.15) in-process: the real
//! runtime, a scripted model, closure tools; asserted through the events
//! and the run record the public API gives.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{codes, gated_op, plant};
use keel_core::CoreError;
use keel_protocol::{Message, ModelError, RunStatus, TokenUsage};
use keel_test_support::harness::is_subsequence;
use keel_test_support::scripted::{
    Gate, ScriptedModel, call_tool, call_tools, fail, hang, last_user_text, offers_tools, raw_call,
    reply_text, respond, tool_messages, when_open,
};
use serde_json::json;

#[tokio::test]
async fn a_reply_without_tool_calls_is_the_answer_and_streams_as_deltas() {
    let answer = "Casting pours molten metal into a mould.";
    let model = ScriptedModel::new([reply_text(answer)]).streaming(true);
    let rt = plant(model).build().await;
    let id = rt.start("What is casting?").await;
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(run.output.as_deref(), Some(answer));
    assert_eq!(run.steps, 1);
    assert_eq!((run.usage.llm_calls, run.usage.tool_calls), (1, 0));
    let types = rt.event_types(&id).await;
    assert_eq!(
        types,
        ["run_started", "message_delta", "final", "run_completed"]
    );
    let deltas: String = rt
        .events_of(&id, "message_delta")
        .await
        .iter()
        .map(|d| d["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(deltas, answer);
    assert_eq!(
        rt.events_of(&id, "run_completed").await[0]["reason"],
        "answered"
    );
    // The user's input reached the model, with the tools on offer.
    let request = rt.model().request(0).unwrap();
    assert_eq!(last_user_text(&request), Some("What is casting?"));
    assert!(request.tools.iter().any(|t| t.name == "furnace_status"));
    rt.finish();
}

#[tokio::test]
async fn tool_results_reach_the_model_and_the_run_answers_after_two_calls() {
    let model = ScriptedModel::new([
        call_tool("furnace_status", json!({"furnace_id": "F1"})),
        call_tool("furnace_status", json!({"furnace_id": "F2"})),
        reply_text("F1 and F2 are both running."),
    ]);
    let rt = plant(model).build().await;
    let id = rt.start("How are furnaces F1 and F2?").await;
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(run.output.as_deref(), Some("F1 and F2 are both running."));
    assert_eq!(run.steps, 3);
    let events = rt.events(&id).await;
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=events.len() as u64).collect::<Vec<_>>(),
        "gap-free"
    );
    let types = rt.event_types(&id).await;
    assert!(
        is_subsequence(
            &types,
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
        "{types:?}"
    );
    assert_eq!(types.iter().filter(|t| **t == "tool_call").count(), 2);
    let completed = &rt.events_of(&id, "run_completed").await[0];
    assert_eq!(completed["reason"], "answered");
    assert_eq!(completed["usage"]["llm_calls"], 3);
    assert_eq!(completed["usage"]["tool_calls"], 2);
    assert_eq!(
        rt.tool_arguments("furnace_status"),
        [json!({"furnace_id": "F1"}), json!({"furnace_id": "F2"})]
    );
    // The second result reached the third request, fenced as data.
    let third = rt.model().request(2).unwrap();
    let (_, content) = *tool_messages(&third).last().unwrap();
    assert!(content.contains("B-F2-7"), "{content}");
    assert!(
        content.starts_with("<tool_output tool=\"furnace_status\""),
        "{content}"
    );
    rt.finish();
}

#[tokio::test]
async fn calls_of_one_turn_run_in_the_order_the_model_gave_them() {
    let model = ScriptedModel::new([
        call_tools([
            ("furnace_status", json!({"furnace_id": "F3"})),
            ("furnace_status", json!({"furnace_id": "F1"})),
            ("furnace_status", json!({"furnace_id": "F2"})),
        ]),
        reply_text("All three are running."),
    ]);
    let rt = plant(model).build().await;
    let id = rt.start("Check F3, F1 and F2").await;
    rt.wait_status(&id, RunStatus::Completed).await;
    let plan = &rt.events_of(&id, "react_plan").await[0];
    let planned: Vec<String> = plan["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["call_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(planned.len(), 3);
    let executed: Vec<String> = rt
        .events_of(&id, "tool_call")
        .await
        .iter()
        .map(|c| c["call_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        executed, planned,
        "tool_call events follow the model's order"
    );
    let results: Vec<String> = rt
        .events_of(&id, "tool_result")
        .await
        .iter()
        .map(|c| c["call_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(results, planned);
    assert_eq!(
        rt.tool_arguments("furnace_status"),
        [
            json!({"furnace_id": "F3"}),
            json!({"furnace_id": "F1"}),
            json!({"furnace_id": "F2"})
        ]
    );
    let second = rt.model().request(1).unwrap();
    let answered: Vec<&str> = tool_messages(&second).iter().map(|(id, _)| *id).collect();
    assert_eq!(answered, planned, "one answer per call, in order");
    rt.finish();
}

#[tokio::test]
async fn an_unknown_tool_is_fed_back_with_the_tools_available_and_the_repair_runs() {
    let model = ScriptedModel::new([call_tool("furnace_stats", json!({"furnace_id": "F1"}))])
        // The repair depends on what the feedback told the model.
        .then(respond(|request| {
            let (_, feedback) = *tool_messages(request).last().unwrap();
            if feedback.contains("unknown_tool") && feedback.contains("furnace_status") {
                call_tool("furnace_status", json!({"furnace_id": "F1"}))
            } else {
                reply_text(format!("the feedback did not help: {feedback}"))
            }
        }))
        .then(reply_text("F1 is running."));
    let rt = plant(model).build().await;
    let id = rt.start("How is F1?").await;
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(run.output.as_deref(), Some("F1 is running."));
    let feedback = rt.events_of(&id, "react_feedback").await;
    assert_eq!(codes(&feedback), ["unknown_tool"]);
    assert!(
        feedback[0]["detail"]
            .as_str()
            .unwrap()
            .contains("furnace_status"),
        "lists the available tools: {}",
        feedback[0]["detail"]
    );
    let calls = rt.events_of(&id, "tool_call").await;
    assert_eq!(calls.len(), 1, "only the repaired call executed");
    assert_eq!(calls[0]["tool"], "furnace_status");
    assert_eq!(rt.tool_calls_executed("furnace_status"), 1);
    rt.finish();
}

#[tokio::test]
async fn invalid_arguments_go_back_to_the_model_for_repair() {
    let model = ScriptedModel::new([
        call_tool("furnace_status", json!({"furnace_id": 42})),
        call_tool(
            "furnace_status",
            json!({"furnace_id": "F1", "color": "red"}),
        ),
        raw_call("furnace_status", "{\"furnace_id\": \"F1\""),
        call_tool("no_such_tool", json!({})),
        call_tool("furnace_status", json!({"furnace_id": "F1"})),
        reply_text("F1 is running."),
    ]);
    let rt = plant(model)
        .agent_toml("[agents.limits]\nmax_repairs = 3")
        .build()
        .await;
    let id = rt.start("How is F1?").await;
    rt.wait_status(&id, RunStatus::Completed).await;
    let feedback = rt.events_of(&id, "react_feedback").await;
    assert_eq!(
        codes(&feedback),
        [
            "invalid_arguments",
            "invalid_arguments",
            "invalid_arguments",
            "unknown_tool"
        ]
    );
    let detail = |i: usize| feedback[i]["detail"].as_str().unwrap().to_owned();
    assert!(detail(0).contains("furnace_id"), "{}", detail(0));
    assert!(detail(1).contains("color"), "{}", detail(1));
    assert!(detail(2).contains("JSON"), "{}", detail(2));
    assert!(detail(3).contains("furnace_status"), "{}", detail(3));
    assert_eq!(rt.events_of(&id, "tool_call").await.len(), 1);
    assert_eq!(
        rt.tool_arguments("furnace_status"),
        [json!({"furnace_id": "F1"})]
    );
    assert_eq!(
        rt.events_of(&id, "run_completed").await[0]["reason"],
        "answered"
    );
    // The violation reached the model as the call's own result.
    let second = rt.model().request(1).unwrap();
    let Some(Message::Tool { content, .. }) = second.messages.last().map(|m| &**m) else {
        panic!("the second request ends with the tool result: {second:?}");
    };
    assert!(content.contains("invalid_arguments"), "{content}");
    rt.finish();
}

#[tokio::test]
async fn repeated_invalid_calls_fall_back_to_an_answer_after_max_repairs() {
    let bad = || call_tool("furnace_status", json!({"furnace_id": 7}));
    let model = ScriptedModel::new([
        bad(),
        bad(),
        bad(),
        reply_text("I could not query the furnace."),
    ]);
    let rt = plant(model).build().await;
    let id = rt.start("How is furnace 7?").await;
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(
        run.output.as_deref(),
        Some("I could not query the furnace.")
    );
    // max_repairs = 2 by default: the third invalid call in a row falls back.
    let feedback = rt.events_of(&id, "react_feedback").await;
    assert_eq!(codes(&feedback), ["invalid_arguments"; 3]);
    let decisions = rt.events_of(&id, "policy_decision").await;
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    assert_eq!(decisions[0]["decision"], "fallback");
    assert_eq!(decisions[0]["rule"], "max_repairs");
    assert_eq!(
        rt.events_of(&id, "run_completed").await[0]["reason"],
        "fallback"
    );
    assert_eq!(rt.model().request_count(), 4);
    assert!(!offers_tools(&rt.model().request(3).unwrap()));
    assert_eq!(rt.tool_calls_executed("furnace_status"), 0);
    rt.finish();
}

#[tokio::test]
async fn the_step_budget_ends_the_run_with_an_answer_from_what_is_known() {
    let model = ScriptedModel::handler(|request| {
        if offers_tools(request) {
            call_tool("furnace_status", json!({"furnace_id": "F1"}))
        } else {
            reply_text("Partial: F1 is running; I ran out of steps.")
        }
    });
    let rt = plant(model)
        .agent_toml("[agents.limits]\nmax_steps = 3")
        .build()
        .await;
    let id = rt.start("Watch F1 forever").await;
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(
        run.output.as_deref(),
        Some("Partial: F1 is running; I ran out of steps.")
    );
    assert_eq!(run.steps, 3);
    let feedback = rt.events_of(&id, "react_feedback").await;
    let budget: Vec<_> = feedback
        .iter()
        .filter(|f| f["code"] == "budget_exhausted")
        .collect();
    assert_eq!(budget.len(), 1, "{feedback:?}");
    assert!(budget[0]["detail"].as_str().unwrap().contains("max_steps"));
    assert_eq!(
        rt.events_of(&id, "run_completed").await[0]["reason"],
        "budget_exhausted"
    );
    assert_eq!(rt.tool_calls_executed("furnace_status"), 3);
    assert_eq!(
        rt.model().request_count(),
        4,
        "three steps and the closing call"
    );
    rt.finish();
}

/// Token counts are the provider's word: counts that overflow when added
/// up exhaust the token budget instead of wrapping around below it.
#[tokio::test]
async fn token_counts_that_overflow_exhaust_the_token_budget() {
    let model = ScriptedModel::handler(|request| {
        if offers_tools(request) {
            let mut reply = call_tool("furnace_status", json!({"furnace_id": "F1"}));
            reply.usage = TokenUsage {
                prompt_tokens: u64::MAX,
                completion_tokens: 1,
            };
            reply
        } else {
            reply_text("F1 is running.")
        }
    });
    let rt = plant(model)
        .agent_toml("[agents.limits]\nmax_tokens = 1000")
        .build()
        .await;
    let id = rt.start("Watch F1").await;
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(run.output.as_deref(), Some("F1 is running."));
    assert_eq!(run.usage.prompt_tokens, u64::MAX);
    assert_eq!(
        rt.events_of(&id, "run_completed").await[0]["reason"],
        "budget_exhausted"
    );
    rt.finish();
}

#[tokio::test]
async fn the_tool_call_budget_closes_the_open_calls_and_answers() {
    let model = ScriptedModel::handler(|request| {
        if offers_tools(request) {
            call_tools([
                ("furnace_status", json!({"furnace_id": "F1"})),
                ("furnace_status", json!({"furnace_id": "F2"})),
                ("furnace_status", json!({"furnace_id": "F3"})),
            ])
        } else {
            reply_text("Checked what I could.")
        }
    });
    let rt = plant(model)
        .agent_toml("[agents.limits]\nmax_tool_calls = 2")
        .build()
        .await;
    let id = rt.start("Check all furnaces").await;
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(run.output.as_deref(), Some("Checked what I could."));
    assert_eq!(
        rt.events_of(&id, "run_completed").await[0]["reason"],
        "budget_exhausted"
    );
    assert_eq!(rt.tool_calls_executed("furnace_status"), 2);
    // The closing request answers all three calls, the third without running it.
    let last = rt.model().requests().pop().unwrap();
    assert!(!offers_tools(&last));
    let answers = tool_messages(&last);
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert!(answers[2].1.contains("budget"), "{}", answers[2].1);
    rt.finish();
}

#[tokio::test]
async fn steering_skips_the_rest_of_the_turn_and_reaches_the_model() {
    let gate = Gate::new();
    let model = ScriptedModel::new([call_tools([
        ("slow_op", json!({"label": "slow check"})),
        ("furnace_status", json!({"furnace_id": "F9"})),
    ])])
    .then(respond(|request| {
        reply_text(format!(
            "Steered: {}",
            last_user_text(request).unwrap_or("")
        ))
    }));
    let rt = plant(model).tool(gated_op(&gate)).build().await;
    let id = rt.start("Run the slow check then look at F9").await;
    // The slow call is running; the steer arrives before it finishes.
    rt.wait_event(&id, "tool_call").await;
    rt.runtime()
        .steer("acme", &id, "Forget F9, check F4 instead".into())
        .await
        .unwrap();
    gate.open();
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(
        run.output.as_deref(),
        Some("Steered: Forget F9, check F4 instead")
    );
    let plan = &rt.events_of(&id, "react_plan").await[0];
    let second_call = plan["tool_calls"][1]["call_id"].clone();
    let steer = &rt.events_of(&id, "steering_applied").await[0];
    assert_eq!(steer["text"], "Forget F9, check F4 instead");
    assert_eq!(steer["skipped_calls"], json!([second_call]));
    assert_eq!(
        rt.tool_calls_executed("slow_op"),
        1,
        "the running call finished"
    );
    assert_eq!(
        rt.tool_calls_executed("furnace_status"),
        0,
        "the rest was skipped"
    );
    let second = rt.model().request(1).unwrap();
    assert_eq!(
        second.messages.last().map(|m| &**m),
        Some(&Message::user("Forget F9, check F4 instead"))
    );
    let skipped = tool_messages(&second);
    assert!(skipped[1].1.contains("skipped"), "{skipped:?}");
    rt.finish();
}

#[tokio::test]
async fn a_follow_up_is_answered_by_the_same_run() {
    let gate = Gate::new();
    let model = ScriptedModel::new([when_open(&gate, reply_text("F1 is running."))]).then(respond(
        |request| reply_text(format!("Also: {}", last_user_text(request).unwrap_or(""))),
    ));
    let rt = plant(model).build().await;
    let id = rt.start("How is F1?").await;
    // The follow-up arrives while the first answer is being written.
    rt.wait_until("the first model call is in flight", || {
        rt.model().request_count() == 1
    })
    .await;
    rt.runtime()
        .follow_up("acme", &id, "And F2?".into())
        .await
        .unwrap();
    gate.open();
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(run.output.as_deref(), Some("Also: And F2?"));
    let types = rt.event_types(&id).await;
    assert!(
        is_subsequence(
            &types,
            &["final", "follow_up_started", "final", "run_completed"]
        ),
        "{types:?}"
    );
    let finals: Vec<_> = rt
        .events_of(&id, "final")
        .await
        .iter()
        .map(|f| f["answer"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(finals, ["F1 is running.", "Also: And F2?"]);
    assert_eq!(rt.model().request_count(), 2);
    rt.finish();
}

#[tokio::test]
async fn cancel_stops_a_run_whose_model_never_answers() {
    let rt = plant(ScriptedModel::new([hang()])).build().await;
    let id = rt.start("Think forever").await;
    rt.wait_until("the model call is in flight", || {
        rt.model().request_count() == 1
    })
    .await;
    rt.runtime().cancel("acme", &id, "alice").await.unwrap();
    let run = rt.wait_status(&id, RunStatus::Cancelled).await;
    assert_eq!(run.output, None);
    let types = rt.event_types(&id).await;
    assert_eq!(types.last(), Some(&"run_cancelled"), "{types:?}");
    assert_eq!(rt.events_of(&id, "run_cancelled").await[0]["by"], "alice");
    let again = rt.runtime().cancel("acme", &id, "alice").await;
    assert!(matches!(again, Err(CoreError::Conflict(_))), "{again:?}");
    rt.finish();
}

#[tokio::test]
async fn cancel_during_a_tool_gives_its_call_exactly_one_result() {
    let gate = Gate::new();
    let model = ScriptedModel::new([call_tool("slow_op", json!({"label": "forever"}))]);
    let rt = plant(model).tool(gated_op(&gate)).build().await;
    let id = rt.start("Do the slow thing").await;
    rt.wait_event(&id, "tool_call").await;
    rt.runtime().cancel("acme", &id, "alice").await.unwrap();
    rt.wait_status(&id, RunStatus::Cancelled).await;
    let messages = rt.session_messages(&id).await;
    let results: Vec<_> = messages
        .iter()
        .filter(|m| matches!(m, Message::Tool { .. }))
        .collect();
    assert_eq!(results.len(), 1, "{messages:?}");
    assert!(!gate.is_open(), "the tool never finished on its own");
    rt.finish();
}

#[tokio::test]
async fn a_call_missing_a_required_argument_waits_for_the_user() {
    let model = ScriptedModel::new([call_tool("furnace_status", json!({}))]);
    let rt = plant(model).build().await;
    let id = rt.start("How is the furnace doing?").await;
    let run = rt.wait_status(&id, RunStatus::WaitingInput).await;
    let Some(keel_protocol::Pending::Input {
        question,
        missing_slots,
        ..
    }) = run.pending
    else {
        panic!("the run waits for an answer: {:?}", run.pending);
    };
    assert_eq!(missing_slots, vec!["furnace_id"]);
    assert!(
        question.contains("Furnace id, e.g. F2"),
        "the question comes from the parameter's description: {question}"
    );
    let types = rt.event_types(&id).await;
    assert!(
        is_subsequence(
            &types,
            &[
                "react_plan",
                "react_feedback",
                "policy_decision",
                "clarification_needed"
            ]
        ),
        "{types:?}"
    );
    assert!(!types.contains(&"tool_call"), "{types:?}");
    let feedback = rt.events_of(&id, "react_feedback").await;
    assert_eq!(codes(&feedback), ["missing_required_arguments"]);
    let question = &rt.events_of(&id, "clarification_needed").await[0];
    assert_eq!(question["missing_slots"], json!(["furnace_id"]));
    assert_eq!(question["tool"], "furnace_status");
    assert_eq!(rt.tool_calls_executed("furnace_status"), 0);
    // Cancelling ends the wait; input to an ended run is a conflict.
    rt.runtime().cancel("acme", &id, "alice").await.unwrap();
    rt.wait_status(&id, RunStatus::Cancelled).await;
    let late = rt.runtime().input("acme", &id, "F2".into()).await;
    assert!(matches!(late, Err(CoreError::Conflict(_))), "{late:?}");
    rt.finish();
}

#[tokio::test]
async fn a_provider_error_fails_the_run_with_a_clear_error() {
    let model = ScriptedModel::new([fail(ModelError::Http {
        status: 500,
        message: "boom".into(),
    })]);
    let rt = plant(model).build().await;
    let id = rt.start("hello").await;
    let run = rt.wait_status(&id, RunStatus::Failed).await;
    let error = run.error.unwrap();
    assert_eq!(error.code, "provider_error");
    assert!(error.message.contains("500"), "{}", error.message);
    let failed = rt.events_of(&id, "run_failed").await;
    assert_eq!(failed[0]["error"]["code"], "provider_error");
    assert_eq!(rt.event_types(&id).await.last(), Some(&"run_failed"));
    rt.finish();
}

#[tokio::test]
async fn with_drift_off_the_stored_state_keeps_no_trace_of_the_steps() {
    for enabled in [true, false] {
        let model = ScriptedModel::new([
            call_tool("furnace_status", json!({"furnace_id": "F1"})),
            reply_text("F1 is running."),
        ]);
        let rt = plant(model)
            .agent(move |a| a.drift.enabled = enabled)
            .build()
            .await;
        let id = rt.start("How is furnace F1?").await;
        let run = rt.wait_status(&id, RunStatus::Completed).await;
        let course = &run.state["course"];
        let kept = |list: &str| course[list].as_array().map_or(0, Vec::len);
        let expected = if enabled { (1, 1) } else { (0, 0) };
        assert_eq!(
            (kept("trace"), kept("progress")),
            expected,
            "drift enabled: {enabled}; course: {course}"
        );
        rt.finish();
    }
}
