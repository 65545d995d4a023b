//! A crash loses nothing: `keel serve` killed with -9 resumes its runs on restart.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{
    Env, Keel, assert_gap_free, assert_transfer_denied_by_provenance, bank_tools,
    obedient_bank_model, wait_until_asked,
};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::json;

/// Kills keel with -9 once the model has been asked `n` times (the last
/// answer still to come), and starts it again on the same data.
async fn kill_9_once_asked(keel: &mut Keel, model: &FakeOpenAi, n: usize) {
    for _ in 0..200 {
        if model.request_count() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    keel.kill9().await;
    keel.restart().await;
}

#[tokio::test]
async fn run_killed_mid_model_call_completes_after_restart() {
    // The first answer arrives after the crash; the restarted node asks again.
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
        Reply::text("never delivered").after(Duration::from_secs(20)),
        Reply::text("F1 is running."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("How is F1?", None).await;
    keel.events_until(&id, None, None, |f| f.event == "tool_result")
        .await;
    kill_9_once_asked(&mut keel, &model, 2).await;
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "F1 is running.");
    assert_eq!(
        tools.count("furnace"),
        1,
        "the finished step is not repeated"
    );
    let frames = keel.events(&id, None, None).await;
    assert_gap_free(&frames, 1);
    assert_eq!(
        frames.iter().filter(|f| f.event == "run_started").count(),
        1
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn non_idempotent_call_in_flight_is_not_rerun_and_the_model_is_told() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("slow_op", json!({"ms": 3000})),
        Reply::text("The slow operation's outcome is unknown; please check it."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("Do the slow thing", None).await;
    keel.events_until(&id, None, None, |f| f.event == "tool_call")
        .await;
    // Kill only once the call has really reached the tool (it is in flight).
    for _ in 0..500 {
        if tools.count("slow_started") > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        tools.count("slow_started"),
        1,
        "the call reached the tool before the crash"
    );
    keel.kill9().await;
    keel.restart().await;
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(
        run["output"],
        "The slow operation's outcome is unknown; please check it."
    );
    assert_eq!(
        tools.count("slow_started"),
        1,
        "slow_op is not idempotent: never re-run"
    );
    let frames = keel.events(&id, None, None).await;
    assert_gap_free(&frames, 1);
    let result = frames.iter().find(|f| f.event == "tool_result").unwrap();
    assert_eq!(result.data["ok"], false);
    assert!(result.data["error"].as_str().unwrap().contains("unknown"));
    let last_req = model.requests().last().unwrap().clone();
    let tool_msg = last_req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap()
        .clone();
    assert!(
        tool_msg["content"].as_str().unwrap().contains("unknown"),
        "{tool_msg}"
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn calls_of_the_turn_that_never_started_go_through_the_pipeline_after_a_restart() {
    // One turn, two calls: the slow one is in flight when the node dies;
    // the second never started. After the restart the first gets an
    // unknown outcome and the second is judged and run like a new call.
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_calls(vec![
            ("slow_op", json!({"ms": 3000})),
            ("furnace_status", json!({"furnace_id": "F4"})),
        ]),
        Reply::text("F4 is running; the slow operation's outcome is unknown."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel
        .start_run("Do the slow thing, then check F4", None)
        .await;
    keel.events_until(&id, None, None, |f| f.event == "tool_call")
        .await;
    for _ in 0..500 {
        if tools.count("slow_started") > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(tools.count("slow_started"), 1);
    assert_eq!(tools.count("furnace"), 0, "the second call had not started");
    keel.kill9().await;
    keel.restart().await;
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(
        run["output"],
        "F4 is running; the slow operation's outcome is unknown."
    );
    assert_eq!(tools.count("slow_started"), 1, "never re-run");
    assert_eq!(tools.count("furnace"), 1, "run once, after the restart");
    let frames = keel.events(&id, None, None).await;
    assert_gap_free(&frames, 1);
    let decided: Vec<_> = frames
        .iter()
        .filter(|f| f.event == "policy_decision" && f.data["tool"].is_null())
        .filter(|f| f.data["decision"] == "execute")
        .map(|f| f.data["call_id"].clone())
        .collect();
    assert_eq!(
        decided.len(),
        2,
        "both calls were decided by the pipeline: {decided:?}"
    );
    let last = model.requests().last().unwrap().clone();
    let results: Vec<String> = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[0].contains("unknown"), "{results:?}");
    assert!(results[1].contains("B-F4-7"), "{results:?}");
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn idempotent_call_in_flight_is_rerun_after_restart() {
    // Answered by what the conversation holds, not by a queue: the kill
    // may land after the furnace call answered and the model was asked for
    // its answer, which the crash then loses, and the resumed run asks
    // again.
    let model = FakeOpenAi::start(Script::handler(|request: &serde_json::Value| {
        let has_results = request["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if has_results {
            Reply::text("F5 checked.")
        } else {
            Reply::tool_calls(vec![
                ("slow_op", json!({"ms": 1})),
                ("furnace_status", json!({"furnace_id": "F5"})),
            ])
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let mut keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("Check F5", None).await;
    // Kill right after the furnace call started; it may or may not have answered.
    keel.events_until(&id, None, None, |f| {
        f.event == "tool_call" && f.data["tool"] == "furnace_status"
    })
    .await;
    keel.kill9().await;
    keel.restart().await;
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "F5 checked.");
    assert!(tools.count("furnace") >= 1);
    let frames = keel.events(&id, None, None).await;
    assert_gap_free(&frames, 1);
    let furnace_results = frames
        .iter()
        .filter(|f| f.event == "tool_result" && f.data["tool"] == "furnace_status")
        .count();
    assert_eq!(furnace_results, 1, "exactly one result for the call");
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn a_run_waiting_for_input_still_waits_after_a_crash() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("furnace_status", json!({})),
        Reply::text("F8 is running."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("How is the furnace?", None).await;
    keel.wait_status(&id, "waiting_input", None).await;
    keel.kill9().await;
    keel.restart().await;
    let run = keel.wait_status(&id, "waiting_input", None).await;
    assert_eq!(run["pending"]["missing_slots"], json!(["furnace_id"]));
    let (code, _) = keel
        .post(&format!("/ai/runs/{id}/input"), json!({"text": "F8"}), None)
        .await;
    assert_eq!(code, 202);
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "F8 is running.");
    assert_eq!(
        tools.calls(),
        vec![("furnace".to_owned(), json!({"furnace_id": "F8"}))]
    );
    let frames = keel.events(&id, None, None).await;
    assert_gap_free(&frames, 1);
}

#[tokio::test]
async fn the_provenance_of_arguments_survives_a_kill_9() {
    // The model reads a bill carrying an injected transfer, and obeys it.
    // Its answer after the read is slow the first time: the node is killed
    // while it waits, and the restarted node asks again.
    let (script, asked_after_read) = obedient_bank_model(Some(Duration::from_secs(30)));
    let model = FakeOpenAi::start(script).await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.extra_tools = format!(
        "{}\n[policy]\nuntrusted_arguments = \"deny\"\n",
        bank_tools(&tools.base_url())
    );
    env.agent_tools = vec!["read_bill".into(), "send_money".into()];
    let mut keel = Keel::start(&env).await;
    let id = keel.start_run("Pay my latest bill.", None).await;
    keel.events_until(&id, None, None, |f| f.event == "tool_result")
        .await;
    wait_until_asked(&asked_after_read, "killed while the model answers").await;
    keel.kill9().await;
    keel.restart().await;
    assert_transfer_denied_by_provenance(&keel, &id, &tools).await;
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn loop_detection_counts_the_calls_made_before_a_kill_9() {
    // Two identical calls, a crash while the model thinks, and the same call
    // a third time after the restart: the third is the repeat the
    // default settings warn about, which only the stored records can tell.
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
        Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
        Reply::text("never delivered").after(Duration::from_secs(20)),
        Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
        Reply::text("F1 is running."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("How is F1?", None).await;
    let results = std::cell::Cell::new(0);
    keel.events_until(&id, None, None, |f| {
        results.set(results.get() + usize::from(f.event == "tool_result"));
        results.get() == 2
    })
    .await;
    kill_9_once_asked(&mut keel, &model, 3).await;
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "F1 is running.");
    let frames = keel.events(&id, None, None).await;
    assert_gap_free(&frames, 1);
    let warned = frames
        .iter()
        .find(|f| f.event == "loop_detected")
        .unwrap_or_else(|| panic!("no loop warning after the restart: {frames:?}"));
    assert_eq!(
        warned.data["detector"], "generic_repeat",
        "{:?}",
        warned.data
    );
    assert_eq!(warned.data["level"], "warning", "{:?}", warned.data);
    assert_eq!(warned.data["count"], 3, "{:?}", warned.data);
    assert_eq!(
        frames.iter().filter(|f| f.event == "loop_detected").count(),
        1,
        "only the third call is a repeat"
    );
    assert_eq!(tools.count("furnace"), 3);
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn the_identical_outcomes_breaker_counts_the_results_seen_before_a_kill_9() {
    // Three identical results, a crash while the model thinks, and a fourth
    // call after the restart: the breaker, set to four, warns before it.
    // Its counters are not in the stored state but counted again from the
    // stored call records, so only those can tell.
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
        Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
        Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
        Reply::text("never delivered").after(Duration::from_secs(20)),
        Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
        Reply::text("F1 is running."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    // Repeats of the same call would warn first; here only the breaker may.
    env.agent_extra = "[agents.loop_detection]\nrepeat_warning = 20\nrepeat_critical = 30\nidentical_outcomes_breaker = 4\n".into();
    let mut keel = Keel::start(&env).await;
    let id = keel.start_run("How is F1?", None).await;
    let results = std::cell::Cell::new(0);
    keel.events_until(&id, None, None, |f| {
        results.set(results.get() + usize::from(f.event == "tool_result"));
        results.get() == 3
    })
    .await;
    kill_9_once_asked(&mut keel, &model, 4).await;
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "F1 is running.");
    let frames = keel.events(&id, None, None).await;
    assert_gap_free(&frames, 1);
    let warnings: Vec<_> = frames
        .iter()
        .filter(|f| f.event == "loop_detected")
        .map(|f| &f.data)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0]["detector"], "global_circuit_breaker");
    assert_eq!(warnings[0]["level"], "warning");
    assert_eq!(warnings[0]["count"], 3, "{:?}", warnings[0]);
    assert_eq!(tools.count("furnace"), 4);
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}
