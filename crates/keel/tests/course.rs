//! SPEC §4.9, §4.12, §4.13 through a real `keel serve`: long scripted runs
//! that reflect, drift and get corrected, loop and get their context reset,
//! outgrow the context window and get compacted, are restored from a
//! checkpoint, and are pre-routed. The fake model speaks the OpenAI wire
//! protocol and answers from what each request contains, as a model would.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};

use common::{Env, KEY_ACME, KEY_GLOBEX, Keel, assert_gap_free, tool_results};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::sse::{Frame, read_frames};
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};

const EXTRA_TOOLS: &str = r#"
[[tools.http]]
name = "furnace_log"
description = "One page of a furnace's operating log"
method = "GET"
url = "{tools}/log/{furnace_id}"
parameters = { type = "object", properties = { furnace_id = { type = "string" }, page = { type = "integer" }, lines = { type = "integer" } }, required = ["furnace_id", "page", "lines"] }
idempotent = true

[[tools.http]]
name = "payroll_lookup"
description = "Payroll record of an employee"
method = "GET"
url = "{tools}/lookup/payroll"
parameters = { type = "object", properties = { employee = { type = "string" } }, required = ["employee"] }
idempotent = true

[[tools.http]]
name = "weather_forecast"
description = "Weather forecast for a city"
method = "GET"
url = "{tools}/lookup/weather"
parameters = { type = "object", properties = { city = { type = "string" } }, required = ["city"] }
idempotent = true

[[tools.http]]
name = "crm_leads"
description = "Sales leads in the CRM"
method = "GET"
url = "{tools}/lookup/crm"
parameters = { type = "object", properties = { owner = { type = "string" } }, required = ["owner"] }
idempotent = true

[[tools.http]]
name = "charge_account"
description = "Charge a customer account (not safe to repeat)"
method = "POST"
url = "{tools}/charge"
parameters = { type = "object", properties = { key = { type = "string" }, ms = { type = "integer" } }, required = ["key"] }
"#;

const AGENT_TOOLS: [&str; 7] = [
    "furnace_status",
    "furnace_log",
    "payroll_lookup",
    "weather_forecast",
    "crm_leads",
    "charge_account",
    "restart_furnace",
];

/// A config with the extra tools, the agent allowed to use them, and `agent`
/// TOML (limits, loop detection) for the agent.
fn env_for(model: &FakeOpenAi, tools: &ToolServer, drift: &str, agent: &str) -> Env {
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.extra_tools = EXTRA_TOOLS.replace("{tools}", &tools.base_url());
    env.drift = drift.to_owned();
    env.agent_extra = agent.to_owned();
    env.agent_tools = AGENT_TOOLS.map(String::from).to_vec();
    env
}

async fn start(env: &Env, provider_extra: &str) -> Keel {
    let provider_extra = provider_extra.to_owned();
    Keel::start_with(env, move |c| {
        c.replacen(
            "model = \"fake-model\"\n",
            &format!("model = \"fake-model\"\n{provider_extra}\n"),
            1,
        )
    })
    .await
}

fn system_text(req: &Value) -> String {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "system")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

fn all_text(req: &Value) -> String {
    req["messages"].to_string()
}

fn is_reflection(req: &Value) -> bool {
    system_text(req).contains("keel's reflection step")
}

fn is_compaction(req: &Value) -> bool {
    system_text(req).contains("keel's compaction step")
}

fn is_routing(req: &Value) -> bool {
    system_text(req).contains("Classify the user's message")
}

fn of_type<'a>(frames: &'a [Frame], t: &str) -> Vec<&'a Frame> {
    frames.iter().filter(|f| f.event == t).collect()
}

async fn run_to_end(keel: &Keel, input: &str) -> (String, Vec<Frame>) {
    let run_id = keel.start_run(input, None).await;
    // Long runs: more time than the harness's default 30 s read.
    let resp = reqwest::get(keel.url(&format!("/ai/runs/{run_id}/events")))
        .await
        .unwrap();
    let frames = read_frames(resp, std::time::Duration::from_secs(180), |f| {
        matches!(
            f.event.as_str(),
            "run_completed" | "run_failed" | "run_cancelled"
        )
    })
    .await;
    assert_gap_free(&frames, 1);
    (run_id, frames)
}

const LONG_LIMITS: &str = r#"
[agents.limits]
max_steps = 60
max_tool_calls = 60
max_wall_time_s = 120

[agents.loop_detection]
max_tool_calls_breaker = 60
"#;

#[tokio::test]
async fn a_long_run_reflects_at_every_interval() {
    let model = FakeOpenAi::start(Script::handler(|req| {
        if is_reflection(req) {
            return Reply::text(
                r#"{"on_track": true, "note": "reading the F2 log page by page serves the goal", "next": "continue"}"#,
            );
        }
        let done = tool_results(req);
        if done < 32 {
            Reply::tool_call(
                "furnace_log",
                json!({"furnace_id": "F2", "page": done, "lines": 2}),
            )
        } else {
            Reply::text("F2 ran 32 pages of batches without a fault.")
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let drift = "[agents.drift]\nreflection_interval = 5\ncheckpoint_interval = 10\nexpected_tool_calls = 40\n";
    let keel = start(&env_for(&model, &tools, drift, LONG_LIMITS), "").await;
    let (_, frames) = run_to_end(
        &keel,
        "Read furnace F2's operating log, page by page, and tell me whether any batch had a fault.",
    )
    .await;
    let last = frames.last().unwrap();
    assert_eq!(last.event, "run_completed", "{:?}", last.data);
    assert_eq!(last.data["reason"], "answered");

    // One reflection after every fifth step: 5, 10, …, 30.
    let mut steps_since = 0;
    let mut reflections = 0;
    for f in &frames {
        match f.event.as_str() {
            "react_plan" => steps_since += 1,
            "reflection" => {
                assert_eq!(steps_since, 5, "a reflection after {steps_since} steps");
                assert_eq!(f.data["on_track"], true);
                steps_since = 0;
                reflections += 1;
            }
            _ => {}
        }
    }
    assert_eq!(reflections, 6, "33 steps → 6 reflections");
    assert!(of_type(&frames, "drift_detected").is_empty());
    assert!(
        of_type(&frames, "react_feedback")
            .iter()
            .all(|f| f.data["code"] != "drift_correction")
    );
    // Checkpoints at 10, 20, 30, persisted as events.
    let cps: Vec<u64> = of_type(&frames, "checkpoint")
        .iter()
        .map(|f| f.data["step"].as_u64().unwrap())
        .collect();
    assert_eq!(cps, vec![10, 20, 30]);
    // Reflection calls count toward the run's usage.
    assert_eq!(last.data["usage"]["llm_calls"], 33 + 6);
    // Nothing of a reflection is streamed as the answer.
    let streamed: String = of_type(&frames, "message_delta")
        .iter()
        .map(|f| f.data["text"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, "F2 ran 32 pages of batches without a fault.");
}

#[tokio::test]
async fn a_wandering_run_is_flagged_corrected_and_returns_on_track() {
    let corrected = Arc::new(Mutex::new(false));
    let seen = corrected.clone();
    let model = FakeOpenAi::start(Script::handler(move |req| {
        if is_reflection(req) {
            return Reply::text(
                r#"{"on_track": false, "note": "payroll, weather and CRM records have nothing to do with furnace F2", "next": "read F2's log"}"#,
            );
        }
        if all_text(req).contains("Course correction from keel") {
            *seen.lock().unwrap() = true;
        }
        let done = tool_results(req);
        let after_correction = *seen.lock().unwrap();
        if !after_correction {
            match done {
                0 => Reply::tool_call("furnace_status", json!({"furnace_id": "F2"})),
                1 => Reply::tool_call("payroll_lookup", json!({"employee": "E-1734"})),
                2 => Reply::tool_call("weather_forecast", json!({"city": "Lisbon"})),
                3 => Reply::tool_call("crm_leads", json!({"owner": "sales-team-2"})),
                _ => Reply::tool_call("weather_forecast", json!({"city": "Porto"})),
            }
        } else if done < 8 {
            Reply::tool_call(
                "furnace_log",
                json!({"furnace_id": "F2", "page": done, "lines": 3}),
            )
        } else {
            Reply::text("Furnace F2 is running at 1450 C; its batches B-F2 were poured normally.")
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let drift = "[agents.drift]\nreflection_interval = 0\ncheckpoint_interval = 0\n";
    let keel = start(&env_for(&model, &tools, drift, LONG_LIMITS), "").await;
    let (_, frames) = run_to_end(
        &keel,
        "What is the status of furnace F2, and how were its latest batches poured?",
    )
    .await;
    let last = frames.last().unwrap();
    assert_eq!(last.event, "run_completed", "{:?}", last.data);
    assert_eq!(last.data["reason"], "answered");

    let drift: Vec<&Frame> = of_type(&frames, "drift_detected");
    assert_eq!(
        drift.len(),
        1,
        "flagged once, then back on track: {drift:?}"
    );
    let d = &drift[0].data;
    assert!(d["score"].as_f64().unwrap() < 0.35, "{d}");
    let reason = d["reason"].as_str().unwrap();
    assert!(
        ["payroll_lookup", "weather_forecast", "crm_leads"]
            .iter()
            .any(|t| reason.contains(t)),
        "the reason names the unrelated tools: {reason}"
    );
    // Drift → a reflection that finds the run off track → a correction.
    let seqs = |t: &str| -> Vec<u64> {
        of_type(&frames, t)
            .iter()
            .map(|f| f.data["seq"].as_u64().unwrap())
            .collect()
    };
    let reflection = of_type(&frames, "reflection");
    assert_eq!(reflection.len(), 1);
    assert_eq!(reflection[0].data["on_track"], false);
    assert!(seqs("reflection")[0] > seqs("drift_detected")[0]);
    assert!(
        of_type(&frames, "react_feedback")
            .iter()
            .any(|f| f.data["code"] == "drift_correction")
    );
    // The model saw the correction, and went back to F2 only.
    assert!(*corrected.lock().unwrap());
    let after: Vec<String> = frames
        .iter()
        .skip_while(|f| f.event != "reflection")
        .filter(|f| f.event == "tool_call")
        .map(|f| f.data["tool"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        !after.is_empty() && after.iter().all(|t| t == "furnace_log"),
        "{after:?}"
    );
    // The correction is in the prompt of the step after the reflection.
    let next = model
        .requests()
        .into_iter()
        .skip_while(|r| !is_reflection(r))
        .nth(1)
        .unwrap();
    assert!(all_text(&next).contains("The goal is still"));
    assert!(all_text(&next).contains("furnace F2"));
    assert!(of_type(&frames, "context_reset").is_empty());
}

#[tokio::test]
async fn a_persisting_loop_resets_the_context_to_goal_and_verified_progress() {
    let model = FakeOpenAi::start(Script::handler(|req| {
        if is_reflection(req) {
            return Reply::text(
                r#"{"on_track": false, "note": "furnace F1 is asked again and again with the same answer", "next": "answer about F2"}"#,
            );
        }
        let text = all_text(req);
        if text.contains("Context reset by keel") {
            return Reply::text("F2 is running at 1450 C with batch B-F2-7.");
        }
        match tool_results(req) {
            0 => Reply::tool_call("furnace_status", json!({"furnace_id": "F2"})),
            // Stuck on F1: the same call, the same result, again and again.
            _ => Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let drift = "[agents.drift]\nreflection_interval = 0\ncheckpoint_interval = 0\n";
    let keel = start(&env_for(&model, &tools, drift, LONG_LIMITS), "").await;
    let (_, frames) = run_to_end(&keel, "What is the status of furnace F2?").await;
    let last = frames.last().unwrap();
    assert_eq!(last.event, "run_completed", "{:?}", last.data);
    assert_eq!(last.data["reason"], "answered");
    let calls = last.data["usage"]["tool_calls"].as_u64().unwrap();
    assert!(
        (4..=5).contains(&calls),
        "F2 once, then F1 until the loop persists after the reflection: {calls}"
    );

    let loops = of_type(&frames, "loop_detected");
    assert!(loops.len() >= 2, "{loops:?}");
    let reflection = of_type(&frames, "reflection");
    assert_eq!(reflection.len(), 1);
    assert_eq!(reflection[0].data["on_track"], false);
    let resets = of_type(&frames, "context_reset");
    assert_eq!(resets.len(), 1);
    let kept = &resets[0].data["kept"];
    assert_eq!(kept["goal"][0], "What is the status of furnace F2?");
    let progress = kept["verified_progress"].as_array().unwrap();
    assert!(
        progress
            .iter()
            .any(|p| p["tool"] == "furnace_status"
                && p["result"].as_str().unwrap().contains("B-F2-7"))
    );
    assert!(
        !kept["failure_patterns"].as_array().unwrap().is_empty(),
        "the loop is remembered as a failure pattern"
    );
    let cp = resets[0].data["checkpoint_id"].as_str().unwrap();
    assert!(
        of_type(&frames, "checkpoint")
            .iter()
            .any(|f| f.data["checkpoint_id"] == cp)
    );

    // The next prompt: the goal and the verified progress, no dropped turn.
    let after = model
        .requests()
        .into_iter()
        .find(|r| all_text(r).contains("Context reset by keel"))
        .unwrap();
    let messages = after["messages"].as_array().unwrap();
    assert!(
        messages
            .iter()
            .all(|m| m["role"] != "tool" && m.get("tool_calls").is_none()),
        "no earlier call or result survives the reset: {messages:#?}"
    );
    let text = all_text(&after);
    assert!(text.contains("What is the status of furnace F2?"));
    assert!(text.contains("Verified progress"));
    assert!(text.contains("B-F2-7"));
    assert_eq!(
        messages.len(),
        2,
        "only the system prompt and the brief: the dropped notes stay dropped: {after:#}"
    );
    assert_eq!(
        text.matches("furnace_status {\\\"furnace_id\\\":\\\"F1\\\"}")
            .count(),
        1,
        "progress is listed once per call: {text}"
    );
    assert!(!text.contains("Course correction"));
}

#[tokio::test]
async fn a_history_beyond_the_context_window_is_compacted_and_the_run_completes() {
    const WINDOW_TOKENS: usize = 3000;
    for (summary_ok, mode) in [(true, "summary"), (false, "metadata")] {
        let over_limit = Arc::new(Mutex::new(Vec::<usize>::new()));
        let seen = over_limit.clone();
        let model = FakeOpenAi::start(Script::handler(move |req| {
            // What a provider with a 3,000-token window would refuse
            // (content characters at 4 per token, tool schemas included).
            let chars = all_text(req).len() + req.get("tools").map_or(0, |t| t.to_string().len());
            if chars > WINDOW_TOKENS * 4 {
                seen.lock().unwrap().push(chars);
                return Reply::status(400, json!({"error": {"message": "context_length_exceeded", "code": "context_length_exceeded"}}));
            }
            if is_compaction(req) {
                return if summary_ok {
                    Reply::text("Pages 0 onwards of F2's log were read: no faults, outputs between 900 and 1300 kg.")
                } else {
                    Reply::status(500, "summarizer down")
                };
            }
            let pages_seen: Vec<u64> = req["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "tool")
                .filter_map(|m| {
                    let c = m["content"].as_str()?;
                    let at = c.find("\"page\":")? + 7;
                    c[at..].split(|ch: char| !ch.is_ascii_digit()).next()?.parse().ok()
                })
                .collect();
            let next = pages_seen.iter().max().map_or(0, |p| p + 1);
            if next < 32 {
                Reply::tool_call("furnace_log", json!({"furnace_id": "F2", "page": next, "lines": 12}))
            } else {
                Reply::text("All 32 pages of F2's log read: no faults.")
            }
        }))
        .await;
        let tools = ToolServer::start().await;
        let drift = "[agents.drift]\nenabled = false\n";
        let agent = format!("{LONG_LIMITS}\n[agents.compaction]\nkeep_recent_messages = 4\n");
        let keel = start(
            &env_for(&model, &tools, drift, &agent),
            &format!("context_window = {WINDOW_TOKENS}"),
        )
        .await;
        let (_, frames) = run_to_end(
            &keel,
            "Read all of furnace F2's operating log, page by page from page 0, and tell me about faults.",
        )
        .await;
        let last = frames.last().unwrap();
        assert_eq!(last.event, "run_completed", "{mode}: {:?}", last.data);
        assert_eq!(last.data["reason"], "answered", "{mode}");
        assert!(
            over_limit.lock().unwrap().is_empty(),
            "{mode}: the provider received over-limit prompts: {:?}",
            over_limit.lock().unwrap()
        );
        let compactions = of_type(&frames, "compaction");
        assert!(!compactions.is_empty(), "{mode}: no compaction");
        for c in &compactions {
            assert_eq!(c.data["mode"], mode);
            assert!(
                c.data["tokens_after"].as_u64().unwrap()
                    < c.data["tokens_before"].as_u64().unwrap(),
                "{c:?}"
            );
        }
        // Every page was read exactly once: the summary kept the run on course.
        assert_eq!(tools.count("log"), 32, "{mode}");
        // The fake model checks tool-call/result pairing on every request.
        assert!(
            model.violations().is_empty(),
            "{mode}: {:?}",
            model.violations()
        );
        // After a compaction the prompt opens with the summary and the goal.
        let compacted = model
            .requests()
            .into_iter()
            .rfind(|r| !is_compaction(r) && all_text(r).contains("written by keel's compaction"))
            .unwrap();
        let text = all_text(&compacted);
        assert!(
            text.contains("Read all of furnace F2's operating log"),
            "{mode}"
        );
        if summary_ok {
            assert!(text.contains("outputs between 900 and 1300 kg"));
        } else {
            assert!(text.contains("furnace_log:"), "{text}");
        }
    }
}

#[tokio::test]
async fn a_spiral_right_after_a_compaction_ends_the_run() {
    let model = FakeOpenAi::start(Script::handler(|req| {
        if is_compaction(req) {
            return Reply::text("F2's log pages 0 to 5 were read.");
        }
        let compacted = all_text(req).contains("written by keel's compaction");
        let done = tool_results(req);
        if !compacted {
            Reply::tool_call(
                "furnace_log",
                json!({"furnace_id": "F2", "page": done, "lines": 12}),
            )
        } else if req
            .get("tools")
            .is_none_or(|t| t.as_array().is_none_or(|a| a.is_empty()))
        {
            Reply::text("I could not finish reading the log.")
        } else {
            // The death spiral: the same call, the same result, after compaction.
            Reply::tool_call(
                "furnace_log",
                json!({"furnace_id": "F2", "page": 99, "lines": 12}),
            )
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let drift = "[agents.drift]\nenabled = false\n";
    let agent = format!("{LONG_LIMITS}\n[agents.compaction]\nkeep_recent_messages = 2\n");
    let keel = start(
        &env_for(&model, &tools, drift, &agent),
        "context_window = 3000",
    )
    .await;
    let (_, frames) = run_to_end(&keel, "Read furnace F2's log and report faults.").await;
    let last = frames.last().unwrap();
    assert_eq!(last.event, "run_completed", "{:?}", last.data);
    assert_eq!(last.data["reason"], "loop_blocked");
    assert!(!of_type(&frames, "compaction").is_empty());
    let page99 = of_type(&frames, "tool_call")
        .iter()
        .filter(|f| f.data["arguments"]["page"] == 99)
        .count();
    assert_eq!(page99, 3, "ended at the third identical call");
    assert!(
        of_type(&frames, "react_feedback")
            .iter()
            .any(|f| f.data["code"] == "loop_blocked"
                && f.data["detail"].as_str().unwrap().contains("compacted"))
    );
}

#[tokio::test]
async fn a_restored_run_completes_without_rerunning_a_side_effect() {
    let model = FakeOpenAi::start(Script::handler(|req| {
        let text = all_text(req);
        if text.contains("Not run again") {
            return Reply::text("Account K-1 was charged once; furnace restart was not needed.");
        }
        if text.contains("Restored by keel to checkpoint") {
            // From the model's view the charge has not happened yet: it tries again.
            return Reply::tool_call("charge_account", json!({"key": "K-1"}));
        }
        match tool_results(req) {
            0 => Reply::tool_call("furnace_status", json!({"furnace_id": "F2"})),
            1 => Reply::tool_call("charge_account", json!({"key": "K-1"})),
            // Lacks furnace_id: the run waits for the user.
            _ => Reply::tool_call("restart_furnace", json!({})),
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let mut env = env_for(
        &model,
        &tools,
        "[agents.drift]\nreflection_interval = 0\ncheckpoint_interval = 1\nthreshold = 0.0\ndeep_drift_threshold = 0.0\n",
        "",
    );
    env.auth = true;
    let keel = start(&env, "").await;
    let run_id = keel
        .start_run(
            "Check furnace F2, charge account K-1, then restart the furnace.",
            Some(KEY_ACME),
        )
        .await;
    keel.wait_status(&run_id, "waiting_input", Some(KEY_ACME))
        .await;
    assert_eq!(tools.count("charge"), 1);
    let frames = keel
        .events_until(&run_id, None, Some(KEY_ACME), |f| {
            f.event == "clarification_needed"
        })
        .await;
    let cps: Vec<(String, u64)> = of_type(&frames, "checkpoint")
        .iter()
        .map(|f| {
            (
                f.data["checkpoint_id"].as_str().unwrap().to_owned(),
                f.data["step"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(cps.iter().map(|c| c.1).collect::<Vec<_>>(), vec![1, 2]);
    let first = cps[0].0.clone();

    // Bad requests name what is wrong; another tenant cannot see the run.
    let path = format!("/ai/runs/{run_id}/restore");
    let (code, body) = keel
        .post(&path, json!({"checkpoint_id": "cp-nope"}), Some(KEY_ACME))
        .await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("checkpoint_id")
    );
    let (code, _) = keel
        .post(&path, json!({"checkpoint": first}), Some(KEY_ACME))
        .await;
    assert_eq!(code, 400);
    let (code, _) = keel
        .post(&path, json!({"checkpoint_id": first}), Some(KEY_GLOBEX))
        .await;
    assert_eq!(code, 404);

    let (code, body) = keel
        .post(&path, json!({"checkpoint_id": first}), Some(KEY_ACME))
        .await;
    assert_eq!(code, 202, "{body}");
    let frames = keel
        .events_until(&run_id, None, Some(KEY_ACME), |f| {
            matches!(
                f.event.as_str(),
                "run_completed" | "run_failed" | "run_cancelled"
            )
        })
        .await;
    let last = frames.last().unwrap();
    assert_eq!(last.event, "run_completed", "{:?}", last.data);
    assert_eq!(tools.count("charge"), 1, "the side effect ran once");
    assert!(
        of_type(&frames, "react_feedback")
            .iter()
            .any(|f| f.data["code"] == "checkpoint_restored")
    );
    let refused = of_type(&frames, "policy_decision")
        .into_iter()
        .find(|f| f.data["rule"] == "checkpoint_restore")
        .expect("the repeated charge is refused");
    assert_eq!(refused.data["decision"], "deny");
    assert_eq!(
        of_type(&frames, "tool_call")
            .iter()
            .filter(|f| f.data["tool"] == "charge_account")
            .count(),
        1
    );
    // The restored prompt: up to the checkpoint, then the restore note.
    let restored = model
        .requests()
        .into_iter()
        .find(|r| all_text(r).contains("Restored by keel to checkpoint"))
        .unwrap();
    let text = all_text(&restored);
    assert!(text.contains("B-F2-7"), "turns before the checkpoint stay");
    assert!(
        !text.contains("restart_furnace"),
        "turns after it are hidden"
    );
    assert!(
        text.contains("charge_account"),
        "the side effect since is listed"
    );
}

#[tokio::test]
async fn deep_drift_restores_the_last_good_checkpoint_without_repeating_side_effects() {
    let model = FakeOpenAi::start(Script::handler(|req| {
        let text = all_text(req);
        if is_reflection(req) {
            return Reply::text(
                r#"{"on_track": false, "note": "wandered", "next": "answer about F2"}"#,
            );
        }
        if text.contains("Not run again") {
            return Reply::text("F2 is running at 1450 C.");
        }
        if text.contains("Restored by keel to checkpoint") {
            return Reply::tool_call("charge_account", json!({"key": "K-9"}));
        }
        match tool_results(req) {
            0 => Reply::tool_call("furnace_status", json!({"furnace_id": "F2"})),
            1 => Reply::tool_call("charge_account", json!({"key": "K-9"})),
            2 => Reply::tool_call("payroll_lookup", json!({"employee": "E-1734"})),
            3 => Reply::tool_call("weather_forecast", json!({"city": "Lisbon"})),
            _ => Reply::tool_call("crm_leads", json!({"owner": "sales-team-2"})),
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let drift = "[agents.drift]\nreflection_interval = 0\ncheckpoint_interval = 1\nrestore_on_deep_drift = true\nthreshold = 0.35\ndeep_drift_threshold = 0.3\n";
    let keel = start(&env_for(&model, &tools, drift, LONG_LIMITS), "").await;
    let (_, frames) = run_to_end(&keel, "What is the status of furnace F2?").await;
    let last = frames.last().unwrap();
    assert_eq!(last.event, "run_completed", "{:?}", last.data);
    let drift = of_type(&frames, "drift_detected");
    assert!(!drift.is_empty());
    let restored = of_type(&frames, "react_feedback")
        .into_iter()
        .find(|f| f.data["code"] == "checkpoint_restored")
        .expect("deep drift restores a checkpoint");
    assert!(
        restored.data["detail"]
            .as_str()
            .unwrap()
            .contains("deep drift")
    );
    // Restored to the checkpoint taken on track before the judged window.
    let detail = restored.data["detail"].as_str().unwrap();
    assert!(detail.contains("(step 1)"), "{detail}");
    assert_eq!(
        tools.count("charge"),
        1,
        "the charge is not repeated after the restore"
    );
    assert!(
        of_type(&frames, "policy_decision")
            .iter()
            .any(|f| f.data["rule"] == "checkpoint_restore")
    );
}

/// One scripted model for both modes: it routes by whether the message is
/// about the plant, and answers plant questions after one status call.
fn suite_model() -> Script {
    Script::handler(|req| {
        let user = req["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rfind(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_owned();
        let about_plant = user.contains("furnace");
        if is_routing(req) {
            return Reply::text(if about_plant { "TOOL" } else { "CHAT" });
        }
        let offered = req
            .get("tools")
            .is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()));
        if about_plant && offered && tool_results(req) == 0 {
            return Reply::tool_call("furnace_status", json!({"furnace_id": "F2"}));
        }
        Reply::text("Here is the answer.")
    })
}

const SUITE: [&str; 6] = [
    "What does a foundry do?",
    "Explain what a casting defect is.",
    "Thanks, that helps!",
    "What is the status of furnace F2?",
    "Is furnace F2 running hot right now?",
    "Which batch is furnace F2 pouring?",
];

#[tokio::test]
async fn pre_routing_answers_chat_without_tools_and_is_measured_against_the_single_loop() {
    let mut report = Vec::new();
    for routing in ["single_loop", "pre_route"] {
        let model = FakeOpenAi::start(suite_model()).await;
        let tools = ToolServer::start().await;
        let env = env_for(
            &model,
            &tools,
            "[agents.drift]\nenabled = false\n",
            &format!("routing = \"{routing}\""),
        );
        let keel = Keel::start(&env).await;
        let mut calls = Vec::new();
        for input in SUITE {
            let before = model.request_count();
            let (_, frames) = run_to_end(&keel, input).await;
            let last = frames.last().unwrap();
            assert_eq!(
                last.event, "run_completed",
                "{routing} {input}: {:?}",
                last.data
            );
            let llm_calls = last.data["usage"]["llm_calls"].as_u64().unwrap();
            assert_eq!(llm_calls as usize, model.request_count() - before);
            calls.push(llm_calls);
            let decisions = of_type(&frames, "mode_decision");
            let chat = !input.contains("furnace");
            if routing == "single_loop" {
                assert!(decisions.is_empty());
            } else {
                assert_eq!(decisions.len(), 1, "{input}");
                assert_eq!(
                    decisions[0].data["mode"],
                    if chat { "CHAT" } else { "TOOL" }
                );
                assert_eq!(decisions[0].data["source"], "model");
                if chat {
                    assert!(
                        of_type(&frames, "policy_decision")
                            .iter()
                            .any(|f| f.data["decision"] == "respond")
                    );
                    assert!(of_type(&frames, "tool_call").is_empty());
                    let answering = model.requests().last().cloned().unwrap();
                    assert!(
                        answering
                            .get("tools")
                            .is_none_or(|t| t.as_array().is_some_and(|a| a.is_empty())),
                        "CHAT is answered without tools"
                    );
                }
            }
            if !chat {
                assert_eq!(of_type(&frames, "tool_call").len(), 1, "{routing} {input}");
            }
        }
        let mean = calls.iter().sum::<u64>() as f64 / calls.len() as f64;
        report.push(format!(
            "{routing}: model calls per run {calls:?}, mean {mean:.2}"
        ));
    }
    // The closing note quotes these lines (`cargo nextest run … --no-capture`).
    for line in &report {
        println!("pre-routing suite: {line}");
    }
}
