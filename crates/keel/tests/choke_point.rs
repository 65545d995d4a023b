//! One choke point, tried from outside: a real `keel serve`, a fake model on
//! the OpenAI wire that reads each request like a model would, and a real
//! HTTP tool backend.
//!
//! - Clarification answers written as sentences go back to the model, which
//!   makes the complete call; no sentence ever reaches a tool as an
//!   argument. Only a bare value fills the missing slot directly.
//! - After `max_clarify_rounds`, `on_clarify_exhausted = "handoff"` hands
//!   the question to a person who answers through the same endpoint.
//! - Client tools (Responses API) pass hooks, `max_tool_calls` and
//!   `max_calls_per_run` like every other call.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Env, Keel, NOTHING_TRANSFERRED, bank_tools, obedient_bank_model};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};

/// Tools in the style of BFCL's multi-turn cases, served by the tool backend.
const BFCL_TOOLS: &str = r#"
[[tools.http]]
name = "send_message"
description = "Send a message to a user"
method = "GET"
url = "{tools}/lookup/message"
parameters = { type = "object", properties = { receiver_id = { type = "string", description = "The user id of the receiver" }, message = { type = "string" } }, required = ["receiver_id", "message"] }

[[tools.http]]
name = "create_file"
description = "Create a file in the current directory"
method = "GET"
url = "{tools}/lookup/file"
parameters = { type = "object", properties = { file_name = { type = "string", description = "Name of the file" } }, required = ["file_name"] }

[[tools.http]]
name = "book_flight"
description = "Book a flight"
method = "GET"
url = "{tools}/lookup/flight"
parameters = { type = "object", properties = { from = { type = "string" }, to = { type = "string" }, travel_class = { type = "string", enum = ["economy", "business", "first"] } }, required = ["from", "to", "travel_class"] }

[[tools.http]]
name = "get_stock_info"
description = "Current price of a stock"
method = "GET"
url = "{tools}/lookup/stock"
parameters = { type = "object", properties = { symbol = { type = "string", description = "Ticker symbol" } }, required = ["symbol"] }
"#;

const AGENT_TOOLS: [&str; 5] = [
    "furnace_status",
    "send_message",
    "create_file",
    "book_flight",
    "get_stock_info",
];

/// One user turn in the style of BFCL `multi_turn_miss_param`: the user's
/// request lacks one argument, the model calls without it, keel asks, and
/// the user answers in a sentence.
struct Case {
    input: &'static str,
    tool: &'static str,
    /// What the model knows before the answer.
    known: Value,
    slot: &'static str,
    answer: &'static str,
    /// The value a model reads out of the answer.
    value: &'static str,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            input: "Send Bob a message saying the report is ready.",
            tool: "send_message",
            known: json!({"message": "The report is ready."}),
            slot: "receiver_id",
            answer: "Ah I forget to mention, his user id is USR002.",
            value: "USR002",
        },
        Case {
            input: "Create the notes file for the team.",
            tool: "create_file",
            known: json!({}),
            slot: "file_name",
            answer: "The document name should be 'TeamNotes.txt'.",
            value: "TeamNotes.txt",
        },
        Case {
            input: "Book me a flight from SFO to LAX.",
            tool: "book_flight",
            known: json!({"from": "SFO", "to": "LAX"}),
            slot: "travel_class",
            answer: "I forgot to tell you, it's in business class, estimated at $1,200",
            value: "business",
        },
        Case {
            input: "What is the stock trading at?",
            tool: "get_stock_info",
            known: json!({}),
            slot: "symbol",
            answer: "Oh sorry, I meant Zeta Corp. Its ticker is ZETA.",
            value: "ZETA",
        },
        Case {
            input: "How is the furnace doing?",
            tool: "furnace_status",
            known: json!({}),
            slot: "furnace_id",
            answer: "the big one, F7",
            value: "F7",
        },
    ]
}

fn last_message(request: &Value) -> &Value {
    request["messages"].as_array().unwrap().last().unwrap()
}

/// A model that understands each case: it calls the tool without the
/// missing argument, reads the value out of the user's sentence when it
/// comes back, and answers once it has a result.
fn model_for(cases: Vec<Case>) -> Script {
    Script::handler(move |request| {
        let last = last_message(request);
        let text = last["content"].as_str().unwrap_or_default();
        if last["role"] == "tool" {
            return Reply::text("Done.");
        }
        if let Some(c) = cases.iter().find(|c| c.input == text) {
            return Reply::tool_call(c.tool, c.known.clone());
        }
        if let Some(c) = cases.iter().find(|c| c.answer == text) {
            let mut args = c.known.clone();
            args[c.slot] = json!(c.value);
            return Reply::tool_call(c.tool, args);
        }
        Reply::text(format!("unexpected request: {text}"))
    })
}

fn recorded_value(call: &(String, Value), slot: &str) -> Option<String> {
    let (route, args) = call;
    if route == "furnace" {
        return args["furnace_id"].as_str().map(str::to_owned);
    }
    args["query"][slot].as_str().map(str::to_owned)
}

#[tokio::test]
async fn every_sentence_answer_ends_in_the_right_call_and_never_reaches_a_tool() {
    let model = FakeOpenAi::start(model_for(cases())).await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.extra_tools = BFCL_TOOLS.replace("{tools}", &tools.base_url());
    env.agent_tools = AGENT_TOOLS.map(String::from).to_vec();
    let keel = Keel::start(&env).await;
    for case in cases() {
        let before = tools.calls().len();
        let id = keel.start_run(case.input, None).await;
        let run = keel.wait_status(&id, "waiting_input", None).await;
        assert_eq!(
            run["pending"]["missing_slots"],
            json!([case.slot]),
            "{}",
            case.input
        );
        let (code, _) = keel
            .post(
                &format!("/ai/runs/{id}/input"),
                json!({"text": case.answer}),
                None,
            )
            .await;
        assert_eq!(code, 202);
        let run = keel.wait_status(&id, "completed", None).await;
        assert_eq!(run["output"], "Done.", "{}", case.input);
        let calls = tools.calls()[before..].to_vec();
        assert_eq!(
            calls.len(),
            1,
            "{}: exactly one tool call: {calls:?}",
            case.input
        );
        assert_eq!(
            recorded_value(&calls[0], case.slot).as_deref(),
            Some(case.value),
            "{}: the tool got the value, not the sentence: {calls:?}",
            case.input
        );
        // The answer reached the model as the user's words, and no event
        // shows the sentence as an argument.
        let events = keel.events(&id, None, None).await;
        for f in events.iter().filter(|f| f.event == "tool_call") {
            assert!(
                !f.data["arguments"].to_string().contains(case.answer),
                "{}: {}",
                case.input,
                f.data
            );
        }
        assert_eq!(
            events.iter().filter(|f| f.event == "react_plan").count(),
            2,
            "the model was asked again after the answer"
        );
    }
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn a_bare_value_fills_the_slot_and_an_answer_without_one_leads_to_a_further_question() {
    let model = FakeOpenAi::start(Script::handler(|request| {
        let last = last_message(request);
        let text = last["content"].as_str().unwrap_or_default().to_owned();
        match (last["role"].as_str(), text.as_str()) {
            (Some("tool"), _) => Reply::text("F2 is running."),
            (Some("user"), "How is the furnace?") => Reply::tool_call("furnace_status", json!({})),
            (Some("user"), "F2") => Reply::tool_call("furnace_status", json!({"furnace_id": "F2"})),
            // Nothing in the answer names a furnace: the model asks again.
            (Some("user"), _) => Reply::tool_call(
                "clarify",
                json!({"tool_name": "furnace_status", "missing_slots": ["furnace_id"],
                       "question": "Which furnace do you mean, F1 to F9?"}),
            ),
            _ => Reply::text("unexpected"),
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("How is the furnace?", None).await;
    keel.wait_status(&id, "waiting_input", None).await;
    let (code, _) = keel
        .post(
            &format!("/ai/runs/{id}/input"),
            json!({"text": "hmm, I am not sure which one it was"}),
            None,
        )
        .await;
    assert_eq!(code, 202);
    let frames = keel
        .events_until(&id, None, None, |f| {
            f.event == "clarification_needed" && f.data["round"] == 2
        })
        .await;
    assert_eq!(
        frames.last().unwrap().data["question"],
        "Which furnace do you mean, F1 to F9?"
    );
    assert_eq!(tools.count("furnace"), 0, "no tool ran on the vague answer");
    let run = keel.wait_status(&id, "waiting_input", None).await;
    assert_eq!(run["pending"]["round"], 2);
    // A clarify asked by the model is answered in the conversation too.
    let (code, _) = keel
        .post(&format!("/ai/runs/{id}/input"), json!({"text": "F2"}), None)
        .await;
    assert_eq!(code, 202);
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "F2 is running.");
    assert_eq!(
        tools.calls(),
        vec![("furnace".to_owned(), json!({"furnace_id": "F2"}))]
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn a_bare_value_answer_fills_the_missing_slot_without_asking_the_model_again() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("furnace_status", json!({})),
        Reply::text("F3 is running."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let id = keel.start_run("How is the furnace?", None).await;
    keel.wait_status(&id, "waiting_input", None).await;
    keel.post(
        &format!("/ai/runs/{id}/input"),
        json!({"text": " F3 "}),
        None,
    )
    .await;
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "F3 is running.");
    assert_eq!(
        tools.calls(),
        vec![("furnace".to_owned(), json!({"furnace_id": "F3"}))]
    );
    assert_eq!(model.request_count(), 2);
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn exhausted_clarification_hands_the_question_to_a_person() {
    let model = FakeOpenAi::start(Script::handler(|request| {
        let last = last_message(request);
        if last["role"] == "tool"
            && last["content"]
                .as_str()
                .unwrap_or("")
                .contains("<tool_output")
        {
            return Reply::text("F4 is running.");
        }
        // However the user answers, this model never finds the furnace.
        Reply::tool_call("furnace_status", json!({}))
    }))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.agent_extra =
        "on_clarify_exhausted = \"handoff\"\n[agents.limits]\nmax_clarify_rounds = 1\n".into();
    let keel = Keel::start(&env).await;
    let id = keel.start_run("How is the furnace?", None).await;
    keel.wait_status(&id, "waiting_input", None).await;
    keel.post(
        &format!("/ai/runs/{id}/input"),
        json!({"text": "the one that was restarted yesterday, I think"}),
        None,
    )
    .await;
    let frames = keel
        .events_until(&id, None, None, |f| f.event == "handoff_requested")
        .await;
    let handoff = frames.last().unwrap();
    assert_eq!(handoff.data["tool"], "furnace_status");
    assert_eq!(handoff.data["missing_slots"], json!(["furnace_id"]));
    let decision = frames
        .iter()
        .rev()
        .find(|f| f.event == "policy_decision")
        .unwrap();
    assert_eq!(decision.data["rule"], "handoff");
    let run = keel.wait_status(&id, "waiting_input", None).await;
    assert_eq!(run["pending"]["handoff"], true);
    assert_eq!(tools.count("furnace"), 0);
    // A person answers through the same endpoint.
    let (code, _) = keel
        .post(&format!("/ai/runs/{id}/input"), json!({"text": "F4"}), None)
        .await;
    assert_eq!(code, 202);
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "F4 is running.");
    assert_eq!(
        tools.calls(),
        vec![("furnace".to_owned(), json!({"furnace_id": "F4"}))]
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

/// A client function tool, as the Responses API declares it.
fn door_tool() -> Value {
    json!({
        "type": "function",
        "name": "open_gate",
        "description": "Open a gate of the yard, done by the client",
        "parameters": {
            "type": "object",
            "properties": {"gate": {"type": "string"}},
            "required": ["gate"]
        }
    })
}

async fn client_keel(
    replies: Vec<Reply>,
    extra: &str,
    agent_extra: &str,
) -> (FakeOpenAi, ToolServer, Keel) {
    let model = FakeOpenAi::start(Script::queue(replies)).await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.stream = false;
    env.extra_tools = extra.to_owned();
    env.agent_extra = agent_extra.to_owned();
    let keel = Keel::start(&env).await;
    (model, tools, keel)
}

fn function_calls(response: &Value) -> Vec<Value> {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "function_call")
        .cloned()
        .collect()
}

fn tool_messages(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn a_hook_blocks_a_client_tool_and_the_client_never_receives_the_call() {
    let (model, _tools, keel) = client_keel(
        vec![
            Reply::tool_call("open_gate", json!({"gate": "vault"})),
            Reply::text("The vault gate cannot be opened."),
        ],
        r#"
[[hooks]]
kind = "deny_pattern"
tools = ["open_gate"]
argument = "gate"
pattern = "^vault$"
reason = "the vault gate is opened on site only"
"#,
        "",
    )
    .await;
    let (code, response) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "input": "Open the vault gate", "tools": [door_tool()]}),
            None,
        )
        .await;
    assert_eq!(code, 200, "{response}");
    assert_eq!(response["status"], "completed");
    assert!(function_calls(&response).is_empty(), "{response}");
    let told = tool_messages(&model.last_request().unwrap());
    assert!(
        told.iter()
            .any(|t| t.contains("the vault gate is opened on site only")),
        "{told:?}"
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn client_calls_count_against_max_calls_per_run_and_max_tool_calls() {
    // max_calls_per_run: the second call of the tool is refused.
    let (model, _tools, keel) = client_keel(
        vec![
            Reply::tool_call("open_gate", json!({"gate": "north"})),
            Reply::tool_call("open_gate", json!({"gate": "south"})),
            Reply::text("Only the north gate was opened."),
        ],
        r#"
[[policy.rules]]
name = "one_gate_per_run"
tools = ["open_gate"]
max_calls_per_run = 1
decision = "deny"
reason = "one gate per run"
"#,
        "",
    )
    .await;
    let (_, first) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "input": "Open the gates", "tools": [door_tool()]}),
            None,
        )
        .await;
    let calls = function_calls(&first);
    assert_eq!(calls.len(), 1, "{first}");
    let (code, second) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "previous_response_id": first["id"], "tools": [door_tool()],
                   "input": [{"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "opened"}]}),
            None,
        )
        .await;
    assert_eq!(code, 200, "{second}");
    assert_eq!(second["status"], "completed", "{second}");
    assert!(
        function_calls(&second).is_empty(),
        "the second call never reached the client: {second}"
    );
    let told = tool_messages(&model.last_request().unwrap());
    assert!(
        told.iter().any(|t| t.contains("one gate per run")),
        "{told:?}"
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());

    // max_tool_calls: a client call spends the budget like any other.
    let (model, tools, keel) = client_keel(
        vec![
            Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
            Reply::tool_call("open_gate", json!({"gate": "north"})),
            Reply::text("Budget used up; F1 is running."),
        ],
        "",
        "[agents.limits]\nmax_tool_calls = 1\n",
    )
    .await;
    let (code, response) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "input": "Check F1 then open the north gate", "tools": [door_tool()]}),
            None,
        )
        .await;
    assert_eq!(code, 200, "{response}");
    assert!(function_calls(&response).is_empty(), "{response}");
    assert_eq!(tools.count("furnace"), 1);
    let run_id = response["id"]
        .as_str()
        .unwrap()
        .strip_prefix("resp_")
        .unwrap()
        .rsplit_once('_')
        .unwrap()
        .0
        .to_owned();
    let events = keel.events(&run_id, None, None).await;
    let completed = events.iter().find(|f| f.event == "run_completed").unwrap();
    assert_eq!(completed.data["reason"], "budget_exhausted");
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn a_low_stated_confidence_asks_the_user_to_confirm_before_the_call_runs() {
    // A model in JSON tool mode states its intent and confidence with every
    // action (tool results reach it as text, not as tool messages).
    let model = FakeOpenAi::start(Script::handler(|request| {
        let conversation = request["messages"].to_string();
        if conversation.contains("B-F2-7") {
            return Reply::text(
                r#"{"action":"RESPOND","answer":"F2 is running.","confidence":0.95}"#,
            );
        }
        let confidence = if conversation.contains("go ahead") { 0.95 } else { 0.4 };
        Reply::text(
            json!({"action": "CALL_TOOL", "tool_name": "furnace_status", "arguments": {"furnace_id": "F2"},
                   "intent": "check the furnace the user means", "confidence": confidence,
                   "brief_rationale": "F2 is the furnace mentioned most recently"})
            .to_string(),
        )
    }))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.extra_tools = r#"
[[policy.rules]]
name = "unsure_reads"
tools = ["furnace_status"]
min_confidence = 0.7
decision = "clarify"
reason = "the model is not sure which furnace is meant"
"#
    .into();
    let keel = Keel::start_with(&env, |c| {
        c.replacen(
            "model = \"fake-model\"",
            "model = \"fake-model\"\ntool_mode = \"json\"",
            1,
        )
    })
    .await;
    let id = keel.start_run("How is that furnace doing?", None).await;
    let run = keel.wait_status(&id, "waiting_input", None).await;
    assert!(
        run["pending"]["question"]
            .as_str()
            .unwrap()
            .contains("furnace_status"),
        "{run}"
    );
    assert_eq!(
        tools.count("furnace"),
        0,
        "nothing ran before the user confirmed"
    );
    let events = keel
        .events_until(&id, None, None, |f| f.event == "clarification_needed")
        .await;
    let plan = events.iter().find(|f| f.event == "react_plan").unwrap();
    assert_eq!(plan.data["intent"], "check the furnace the user means");
    assert_eq!(plan.data["confidence"], 0.4);
    let decision = events
        .iter()
        .find(|f| f.event == "policy_decision")
        .unwrap();
    assert_eq!(
        (&decision.data["decision"], &decision.data["rule"]),
        (&json!("clarify"), &json!("unsure_reads"))
    );
    keel.post(
        &format!("/ai/runs/{id}/input"),
        json!({"text": "Yes, F2, go ahead"}),
        None,
    )
    .await;
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "F2 is running.");
    assert_eq!(
        tools.calls(),
        vec![("furnace".to_owned(), json!({"furnace_id": "F2"}))]
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

async fn bank_keel(policy: &str) -> (FakeOpenAi, ToolServer, Keel) {
    let model = FakeOpenAi::start(obedient_bank_model(None).0).await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.extra_tools = format!("{}\n{policy}", bank_tools(&tools.base_url()));
    env.agent_tools = vec!["read_bill".into(), "send_money".into()];
    let keel = Keel::start(&env).await;
    (model, tools, keel)
}

#[tokio::test]
async fn an_injected_transfer_waits_for_approval_by_default_and_is_denied_unattended() {
    // Default: untrusted_arguments = "approve" for write tools.
    let (model, tools, keel) = bank_keel("").await;
    let id = keel.start_run("Pay my latest bill.", None).await;
    let run = keel.wait_status(&id, "waiting_approval", None).await;
    assert_eq!(run["pending"]["tool"], "send_money");
    assert!(
        run["pending"]["reason"]
            .as_str()
            .unwrap()
            .contains("`iban` comes from the output of `read_bill`"),
        "{run}"
    );
    let frames = keel
        .events_until(&id, None, None, |f| f.event == "approval_required")
        .await;
    let decision = frames
        .iter()
        .rev()
        .find(|f| f.event == "policy_decision")
        .unwrap();
    assert_eq!(decision.data["rule"], "provenance");
    assert_eq!(tools.count("charge"), 0);
    assert!(model.violations().is_empty(), "{:?}", model.violations());

    // Unattended: the call is refused and the model is told where the value must come from.
    let (model, tools, keel) = bank_keel("[policy]\nuntrusted_arguments = \"deny\"\n").await;
    let id = keel.start_run("Pay my latest bill.", None).await;
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], NOTHING_TRANSFERRED);
    assert_eq!(
        tools.count("charge_started"),
        0,
        "the injected transfer never ran"
    );
    let told = model.requests().last().unwrap().to_string();
    assert!(told.contains("must come from the user"), "{told}");
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn exec_stops_for_approval_then_runs_sandboxed_in_the_allowed_path() {
    let dir = tempfile::tempdir().unwrap();
    let inside = dir.path().join("report.txt");
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call(
            "exec",
            json!({"program": "touch", "args": [inside.to_str().unwrap()]}),
        ),
        Reply::text("The report file is there."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.extra_tools = format!(
        "[tools.exec]\nenabled = true\nwrite_paths = [\"{d}\"]\n[[tools.exec.programs]]\npath = \"/usr/bin/touch\"\nargs = [\"^/[A-Za-z0-9_./-]+$\"]\n",
        d = dir.path().display()
    );
    env.agent_tools = vec!["exec".into()];
    let keel = Keel::start(&env).await;
    let id = keel.start_run("Create the report file", None).await;
    let run = keel.wait_status(&id, "waiting_approval", None).await;
    assert_eq!(run["pending"]["tool"], "exec");
    assert!(!inside.exists(), "nothing ran before the approval");
    let approval = run["pending"]["approval_id"].as_str().unwrap().to_owned();
    let (code, body) = keel
        .post(
            &format!("/ai/approvals/{approval}"),
            json!({"decision": "approve", "reason": "ok"}),
            None,
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "The report file is there.");
    assert!(
        inside.exists(),
        "the approved program ran and wrote inside the allowed path"
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}
