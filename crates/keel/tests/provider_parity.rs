//! The same guardrail scenarios through three model paths: OpenAI native
//! tool calling, the Anthropic Messages API, and `tool_mode = "json"` (the
//! action as JSON text). Guardrails live in keel's loop, so every path must
//! behave alike.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Env, KEY_ACME, Keel};
use keel_test_support::fake_anthropic::{self, FakeAnthropic};
use keel_test_support::fake_openai::{self, FakeOpenAi};
use keel_test_support::sse::{is_subsequence, types};
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug)]
enum Mode {
    Native,
    Anthropic,
    Json,
}

const MODES: [Mode; 3] = [Mode::Native, Mode::Anthropic, Mode::Json];

/// One scripted model turn.
enum Turn {
    /// A tool call (a `clarify` call too).
    Call(&'static str, Value),
    /// A final answer to a request that offered tools.
    Answer(&'static str),
    /// The text of a tool-less request (fallbacks, budget and loop endings).
    Plain(&'static str),
}

enum Fake {
    OpenAi(FakeOpenAi),
    Anthropic(FakeAnthropic),
}

impl Fake {
    async fn start(mode: Mode, turns: Vec<Turn>) -> Fake {
        match mode {
            Mode::Native => Fake::OpenAi(
                FakeOpenAi::start(fake_openai::Script::queue(
                    turns
                        .into_iter()
                        .map(|t| match t {
                            Turn::Call(n, a) => fake_openai::Reply::tool_call(n, a),
                            Turn::Answer(s) | Turn::Plain(s) => fake_openai::Reply::text(s),
                        })
                        .collect(),
                ))
                .await,
            ),
            Mode::Anthropic => Fake::Anthropic(
                FakeAnthropic::start(fake_anthropic::Script::queue(
                    turns
                        .into_iter()
                        .map(|t| match t {
                            Turn::Call(n, a) => fake_anthropic::Reply::tool_use(n, a),
                            Turn::Answer(s) | Turn::Plain(s) => fake_anthropic::Reply::text(s),
                        })
                        .collect(),
                ))
                .await,
            ),
            Mode::Json => Fake::OpenAi(
                FakeOpenAi::start(fake_openai::Script::queue(
                    turns
                        .into_iter()
                        .map(|t| {
                            let text = match t {
                                Turn::Call("clarify", a) => json!({
                                    "action": "CLARIFY",
                                    "tool_name": a["tool_name"],
                                    "missing_slots": a["missing_slots"],
                                    "clarification_question": a["question"],
                                })
                                .to_string(),
                                Turn::Call(n, a) => {
                                    format!("```json\n{}\n```\nCalling it now.", json!({"action": "CALL_TOOL", "tool_name": n, "arguments": a}))
                                }
                                Turn::Answer(s) => json!({"action": "RESPOND", "answer": s}).to_string(),
                                Turn::Plain(s) => s.to_owned(),
                            };
                            fake_openai::Reply::text(text)
                        })
                        .collect(),
                ))
                .await,
            ),
        }
    }

    fn base_url(&self) -> String {
        match self {
            Fake::OpenAi(f) => f.base_url(),
            Fake::Anthropic(f) => f.base_url(),
        }
    }

    fn requests(&self) -> Vec<Value> {
        match self {
            Fake::OpenAi(f) => f.requests(),
            Fake::Anthropic(f) => f.requests(),
        }
    }

    fn violations(&self) -> Vec<String> {
        match self {
            Fake::OpenAi(f) => f.violations(),
            Fake::Anthropic(f) => f.violations(),
        }
    }
}

async fn keel_for(mode: Mode, fake: &Fake, tools: &ToolServer, auth: bool) -> Keel {
    let mut env = Env::new(&fake.base_url(), &tools.base_url());
    env.auth = auth;
    Keel::start_with(&env, move |cfg| match mode {
        Mode::Native => cfg,
        Mode::Anthropic => cfg.replace("kind = \"openai\"", "kind = \"anthropic\""),
        Mode::Json => cfg.replace("stream = true", "stream = true\ntool_mode = \"json\""),
    })
    .await
}

#[tokio::test]
async fn two_tool_calls_then_an_answer() {
    for mode in MODES {
        let fake = Fake::start(
            mode,
            vec![
                Turn::Call("furnace_status", json!({"furnace_id": "F1"})),
                Turn::Call("furnace_status", json!({"furnace_id": "F2"})),
                Turn::Answer("F1 and F2 are running."),
            ],
        )
        .await;
        let tools = ToolServer::start().await;
        let keel = keel_for(mode, &fake, &tools, false).await;
        let id = keel.start_run("How are F1 and F2?", None).await;
        let frames = keel.events(&id, None, None).await;
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
                    "tool_call",
                    "tool_result",
                    "final",
                    "run_completed"
                ]
            ),
            "{mode:?}: {t:?}"
        );
        assert_eq!(
            frames.last().unwrap().data["reason"],
            "answered",
            "{mode:?}"
        );
        let run = keel.wait_status(&id, "completed", None).await;
        assert_eq!(run["output"], "F1 and F2 are running.", "{mode:?}");
        assert_eq!(tools.count("furnace"), 2, "{mode:?}");
        assert!(
            fake.violations().is_empty(),
            "{mode:?}: {:?}",
            fake.violations()
        );
    }
}

#[tokio::test]
async fn a_clarify_for_no_tool_falls_back_to_a_direct_answer() {
    for mode in MODES {
        let fake = Fake::start(
            mode,
            vec![
                Turn::Call("clarify", json!({"tool_name": "weather", "missing_slots": ["city"], "question": "Which city?"})),
                Turn::Plain("A foundry casts molten metal into shapes."),
            ],
        )
        .await;
        let tools = ToolServer::start().await;
        let keel = keel_for(mode, &fake, &tools, false).await;
        let id = keel.start_run("What is a foundry?", None).await;
        let frames = keel.events(&id, None, None).await;
        let t = types(&frames);
        assert!(
            !t.contains(&"clarification_needed".to_owned()),
            "{mode:?}: {t:?}"
        );
        assert!(
            frames.iter().any(|f| f.event == "react_feedback"
                && f.data["code"] == "clarify_without_actionable_tool"),
            "{mode:?}"
        );
        let run = keel.wait_status(&id, "completed", None).await;
        assert_eq!(
            run["output"], "A foundry casts molten metal into shapes.",
            "{mode:?}"
        );
        assert_eq!(
            fake.requests().len(),
            2,
            "{mode:?}: exactly one extra tool-less call"
        );
        assert!(
            fake.violations().is_empty(),
            "{mode:?}: {:?}",
            fake.violations()
        );
    }
}

#[tokio::test]
async fn a_missing_argument_is_asked_for_then_the_tool_runs_once() {
    for mode in MODES {
        let fake = Fake::start(
            mode,
            vec![
                Turn::Call("furnace_status", json!({})),
                Turn::Answer("F2 is running."),
            ],
        )
        .await;
        let tools = ToolServer::start().await;
        let keel = keel_for(mode, &fake, &tools, false).await;
        let id = keel.start_run("How is the furnace?", None).await;
        keel.wait_status(&id, "waiting_input", None).await;
        let (code, _) = keel
            .post(&format!("/ai/runs/{id}/input"), json!({"text": "F2"}), None)
            .await;
        assert_eq!(code, 202);
        keel.wait_status(&id, "completed", None).await;
        assert_eq!(
            tools.calls(),
            vec![("furnace".to_owned(), json!({"furnace_id": "F2"}))],
            "{mode:?}"
        );
        assert!(
            fake.violations().is_empty(),
            "{mode:?}: {:?}",
            fake.violations()
        );
    }
}

#[tokio::test]
async fn a_dangerous_tool_waits_for_approval_and_runs_once() {
    for mode in MODES {
        let fake = Fake::start(
            mode,
            vec![
                Turn::Call("shutdown_line", json!({"furnace_id": "F2"})),
                Turn::Answer("Line F2 is down."),
            ],
        )
        .await;
        let tools = ToolServer::start().await;
        let keel = keel_for(mode, &fake, &tools, true).await;
        let id = keel.start_run("Shut line F2 down", Some(KEY_ACME)).await;
        let run = keel
            .wait_status(&id, "waiting_approval", Some(KEY_ACME))
            .await;
        assert_eq!(tools.count("restart"), 0, "{mode:?}");
        let aid = run["pending"]["approval_id"].as_str().unwrap().to_owned();
        let (code, _) = keel
            .post(
                &format!("/ai/approvals/{aid}"),
                json!({"decision": "approve"}),
                Some(KEY_ACME),
            )
            .await;
        assert_eq!(code, 200);
        keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
        assert_eq!(tools.count("restart"), 1, "{mode:?}");
        assert!(
            fake.violations().is_empty(),
            "{mode:?}: {:?}",
            fake.violations()
        );
    }
}

#[tokio::test]
async fn a_repeated_call_is_blocked_and_the_run_ends() {
    for mode in MODES {
        let mut turns: Vec<Turn> = (0..6)
            .map(|_| Turn::Call("furnace_status", json!({"furnace_id": "F1"})))
            .collect();
        turns.push(Turn::Plain("F1 kept saying the same: running."));
        let fake = Fake::start(mode, turns).await;
        let tools = ToolServer::start().await;
        let keel = keel_for(mode, &fake, &tools, false).await;
        let id = keel.start_run("Watch F1", None).await;
        let frames = keel.events(&id, None, None).await;
        assert_eq!(
            frames.last().unwrap().data["reason"],
            "loop_blocked",
            "{mode:?}"
        );
        assert_eq!(tools.count("furnace"), 4, "{mode:?}");
        assert!(
            fake.violations().is_empty(),
            "{mode:?}: {:?}",
            fake.violations()
        );
    }
}

#[tokio::test]
async fn another_tenants_rows_never_reach_the_model() {
    for mode in MODES {
        let fake = Fake::start(
            mode,
            vec![
                Turn::Call("tenant_rows", json!({})),
                Turn::Answer("Nothing I can show."),
            ],
        )
        .await;
        let tools = ToolServer::start().await;
        let keel = keel_for(mode, &fake, &tools, true).await;
        let id = keel.start_run("Show the rows", Some(KEY_ACME)).await;
        let frames = keel.events(&id, None, Some(KEY_ACME)).await;
        let v = frames
            .iter()
            .find(|f| f.event == "verify" && f.data["rule"] == "tenant_isolation")
            .unwrap();
        assert_eq!(v.data["passed"], false, "{mode:?}");
        for r in fake.requests() {
            assert!(
                !r.to_string().contains("GLOBEX-SECRET-BATCH"),
                "{mode:?}: leaked to the model"
            );
        }
        assert!(
            fake.violations().is_empty(),
            "{mode:?}: {:?}",
            fake.violations()
        );
    }
}
