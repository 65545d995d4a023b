//! The chat gateway through a real `keel serve`: Telegram updates, Slack
//! events and keel's signed webhook posted with real bodies and signatures
//! to `POST /ai/channels/{id}/webhook`, answers sent to a fake Telegram and
//! Slack API that checks the request format and the bot token.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::{Env, KEY_ACME, KEY_GLOBEX, Keel};
use hmac::{Hmac, Mac};
use keel_test_support::fake_chat::FakeChat;
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::pg::TestDb;
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};
use sha2::Sha256;

const BOT_TOKEN: &str = "123456:AAtest-bot-token";
const TG_SECRET: &str = "tg-secret-token";
const SLACK_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const HOOK_SECRET: &str = "hook-signing-secret";

/// Answers every conversation the same way: a furnace question is looked
/// up (and its furnace asked for when the user gave none), a shutdown is
/// proposed, anything else is answered at once.
fn plant_model() -> Script {
    Script::handler(|req: &Value| {
        let messages = req["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or(Value::Null);
        if last["role"] == "tool" {
            let said = last["content"].as_str().unwrap_or_default();
            if said.contains("Not executed") {
                return Reply::text("The shutdown was not approved.");
            }
            return Reply::text("Furnace F2 is running at 1450 °C.");
        }
        let said: Vec<String> = messages
            .iter()
            .filter(|m| m["role"] == "user")
            .filter_map(|m| m["content"].as_str().map(str::to_owned))
            .collect();
        let latest = said.last().cloned().unwrap_or_default();
        if latest.contains("Shut") {
            Reply::tool_call("shutdown_line", json!({"furnace_id": "F2"}))
        } else if latest.contains("furnace") || latest.contains("F2") {
            if said.iter().any(|s| s.contains("F2")) {
                Reply::tool_call("furnace_status", json!({"furnace_id": "F2"}))
            } else {
                Reply::tool_call("furnace_status", json!({}))
            }
        } else {
            Reply::text(format!("You said: {latest}"))
        }
    })
}

fn channels_toml(chat: &FakeChat, extra: &str) -> String {
    format!(
        r#"
[[channels]]
id = "tg"
kind = "telegram"
tenant = "acme"
bot_token_env = "TEST_TG_TOKEN"
secret_token_env = "TEST_TG_SECRET"
api_base = "{base}"
{extra}

[[channels]]
id = "slack"
kind = "slack"
tenant = "acme"
bot_token_env = "TEST_TG_TOKEN"
signing_secret_env = "TEST_SLACK_SECRET"
api_base = "{base}"

[[channels]]
id = "hook"
kind = "webhook"
tenant = "acme"
signing_secret_env = "TEST_HOOK_SECRET"
reply_url = "{base}/response"
"#,
        base = chat.base_url()
    )
}

fn env(model: &FakeOpenAi, tools: &ToolServer) -> Env {
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    env.vars = vec![
        ("TEST_TG_TOKEN".into(), BOT_TOKEN.into()),
        ("TEST_TG_SECRET".into(), TG_SECRET.into()),
        ("TEST_SLACK_SECRET".into(), SLACK_SECRET.into()),
        ("TEST_HOOK_SECRET".into(), HOOK_SECRET.into()),
    ];
    env
}

async fn keel_with(model: &FakeOpenAi, tools: &ToolServer, chat: &FakeChat, extra: &str) -> Keel {
    let channels = channels_toml(chat, "");
    Keel::start_with(&env(model, tools), |c| format!("{c}\n{channels}\n{extra}")).await
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn hmac_hex(secret: &str, parts: &[&[u8]]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    for p in parts {
        mac.update(p);
    }
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// POSTs raw bytes with headers; the status and the body as JSON.
async fn post(keel: &Keel, channel: &str, headers: &[(&str, String)], body: &[u8]) -> (u16, Value) {
    let mut r = reqwest::Client::new()
        .post(keel.url(&format!("/ai/channels/{channel}/webhook")))
        .body(body.to_vec());
    for (k, v) in headers {
        r = r.header(*k, v);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn telegram(keel: &Keel, update: &Value) -> (u16, Value) {
    let headers = [
        ("X-Telegram-Bot-Api-Secret-Token", TG_SECRET.to_owned()),
        ("Content-Type", "application/json".to_owned()),
    ];
    post(keel, "tg", &headers, update.to_string().as_bytes()).await
}

/// A Telegram `Update` with a text message, as the Bot API sends it.
fn tg_message(update_id: i64, user: i64, chat: i64, text: &str, topic: Option<i64>) -> Value {
    let chat_type = if chat == user {
        "private"
    } else {
        "supergroup"
    };
    let mut message = json!({
        "message_id": update_id * 10,
        "from": {"id": user, "is_bot": false, "first_name": "Ana", "username": "ana_ops", "language_code": "en"},
        "chat": if chat == user {
            json!({"id": chat, "first_name": "Ana", "username": "ana_ops", "type": chat_type})
        } else {
            json!({"id": chat, "title": "Melt shop", "type": chat_type, "is_forum": topic.is_some()})
        },
        "date": unix_now(),
        "text": text,
    });
    if let Some(t) = topic {
        message["message_thread_id"] = json!(t);
        message["is_topic_message"] = json!(true);
    }
    json!({"update_id": update_id, "message": message})
}

/// A Telegram `callback_query` update: a press on one of keel's buttons.
fn tg_click(update_id: i64, user: i64, chat: i64, data: &str) -> Value {
    json!({
        "update_id": update_id,
        "callback_query": {
            "id": format!("cbq-{update_id}"),
            "from": {"id": user, "is_bot": false, "first_name": "Someone"},
            "message": {
                "message_id": 777,
                "from": {"id": 123456, "is_bot": true, "first_name": "keel"},
                "chat": {"id": chat, "title": "Approvers", "type": "supergroup"},
                "date": unix_now(),
                "text": "Approval needed"
            },
            "chat_instance": "-4242",
            "data": data
        }
    })
}

fn slack_headers(body: &[u8], ts: u64, secret: &str) -> Vec<(&'static str, String)> {
    let ts = ts.to_string();
    let sig = hmac_hex(secret, &[b"v0:", ts.as_bytes(), b":", body]);
    vec![
        ("X-Slack-Request-Timestamp", ts),
        ("X-Slack-Signature", format!("v0={sig}")),
        ("Content-Type", "application/json".to_owned()),
    ]
}

/// A Slack Events API `event_callback` with a direct message.
fn slack_dm(event_id: &str, user: &str, text: &str) -> Value {
    json!({
        "token": "verification-token-unused",
        "team_id": "T0PLANT",
        "api_app_id": "A0KEEL",
        "event": {
            "type": "message",
            "channel": "D0ANA",
            "channel_type": "im",
            "user": user,
            "text": text,
            "ts": "1700000000.000100",
            "event_ts": "1700000000.000100"
        },
        "type": "event_callback",
        "event_id": event_id,
        "event_time": unix_now()
    })
}

async fn slack(keel: &Keel, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let headers = slack_headers(body.as_bytes(), unix_now(), SLACK_SECRET);
    post(keel, "slack", &headers, body.as_bytes()).await
}

async fn hook(keel: &Keel, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let ts = unix_now().to_string();
    let sig = hmac_hex(HOOK_SECRET, &[ts.as_bytes(), b".", body.as_bytes()]);
    let headers = [
        ("X-Keel-Timestamp", ts),
        ("X-Keel-Signature", format!("sha256={sig}")),
        ("Content-Type", "application/json".to_owned()),
    ];
    post(keel, "hook", &headers, body.as_bytes()).await
}

async fn runs_of(keel: &Keel, key: &str) -> Vec<Value> {
    let (code, page) = keel.get("/ai/runs?limit=100", Some(key)).await;
    assert_eq!(code, 200, "{page}");
    page["runs"].as_array().unwrap().clone()
}

fn event_types(frames: &[keel_test_support::sse::Frame]) -> Vec<String> {
    frames.iter().map(|f| f.event.clone()).collect()
}

#[tokio::test]
async fn a_telegram_message_is_answered_in_its_chat_and_topic_once() {
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(BOT_TOKEN).await;
    let keel = keel_with(&model, &tools, &chat, "").await;

    let update = tg_message(5001, 111, -10042, "How is furnace F2?", Some(7));
    let (code, body) = telegram(&keel, &update).await;
    assert_eq!(code, 200, "{body}");
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    assert_eq!(body["matched_by"], "default");
    assert_eq!(body["session"], "agent:default:tg:group:-10042:thread:7");

    let run = keel.wait_status(&run_id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "Furnace F2 is running at 1450 °C.");
    assert_eq!(run["metadata"]["matched_by"], "default");
    assert_eq!(run["metadata"]["channel"]["id"], "tg");

    let sent = chat.wait_for("sendMessage", 1).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].token.as_deref(), Some(BOT_TOKEN));
    let m = &sent[0].body;
    assert_eq!(m["chat_id"].to_string().trim_matches('"'), "-10042");
    assert_eq!(m["message_thread_id"].to_string().trim_matches('"'), "7");
    assert_eq!(m["text"], "Furnace F2 is running at 1450 °C.");

    // The delivery is in the run's own log, before it completed.
    let frames = keel.events(&run_id, None, Some(KEY_ACME)).await;
    assert_eq!(frames[0].event, "run_started");
    assert_eq!(frames[0].data["metadata"]["matched_by"], "default");
    let types = event_types(&frames);
    let delivered = types.iter().position(|t| t == "channel_delivery").unwrap();
    assert_eq!(types[delivered - 1], "final", "{types:?}");
    assert_eq!(types[delivered + 1], "run_completed", "{types:?}");
    let d = &frames[delivered].data;
    assert_eq!(
        (d["ok"].clone(), d["what"].clone()),
        (json!(true), json!("answer"))
    );
    assert!(!d["detail"].as_str().unwrap().contains(BOT_TOKEN), "{d}");

    // Telegram retries the same update: 200, no second run, no second answer.
    let (code, again) = telegram(&keel, &update).await;
    assert_eq!(code, 200, "{again}");
    assert_eq!(again["run_id"], run_id.as_str());
    assert_eq!(runs_of(&keel, KEY_ACME).await.len(), 1);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(chat.accepted("sendMessage").len(), 1);
    // The channel is acme's: another tenant sees nothing of it.
    assert!(runs_of(&keel, KEY_GLOBEX).await.is_empty());
}

#[tokio::test]
async fn a_question_asked_in_telegram_is_answered_there_and_the_run_completes() {
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(BOT_TOKEN).await;
    let keel = keel_with(&model, &tools, &chat, "").await;

    let (code, body) = telegram(
        &keel,
        &tg_message(6001, 222, 222, "How is the furnace doing?", None),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    keel.wait_status(&run_id, "waiting_input", Some(KEY_ACME))
        .await;
    let asked = chat.wait_for("sendMessage", 1).await;
    assert_eq!(
        asked[0].body["chat_id"].to_string().trim_matches('"'),
        "222"
    );
    let question = asked[0].body["text"].as_str().unwrap().to_owned();
    assert!(question.contains("furnace_id"), "{question}");

    // Answered in the chat, as a sentence: it goes to the waiting run.
    let (code, body) = telegram(
        &keel,
        &tg_message(
            6002,
            222,
            222,
            "Ah I forgot to say, it is furnace F2.",
            None,
        ),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["run_id"], run_id.as_str());
    assert_eq!(body["input"], true);
    let run = keel.wait_status(&run_id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "Furnace F2 is running at 1450 °C.");
    assert_eq!(tools.count("furnace"), 1);
    let sent = chat.wait_for("sendMessage", 2).await;
    assert_eq!(sent[1].body["text"], "Furnace F2 is running at 1450 °C.");
    assert_eq!(
        runs_of(&keel, KEY_ACME).await.len(),
        1,
        "the answer started no run"
    );

    let frames = keel.events(&run_id, None, Some(KEY_ACME)).await;
    let deliveries: Vec<&Value> = frames
        .iter()
        .filter(|f| f.event == "channel_delivery")
        .map(|f| &f.data)
        .collect();
    assert_eq!(deliveries.len(), 2, "{deliveries:?}");
    assert_eq!(deliveries[0]["what"], "question");
    assert_eq!(deliveries[1]["what"], "answer");
}

#[tokio::test]
async fn an_approval_clicked_in_telegram_by_a_linked_approver_runs_the_call_once() {
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(BOT_TOKEN).await;
    let routing = r#"
[[routing.identity_links]]
person = "alice"
principal = "alice"
identities = [{ channel = "tg", sender = "111" }]

[[routing.identity_links]]
person = "carol"
principal = "carol"
identities = [{ channel = "tg", sender = "333" }]
"#;
    let channels = channels_toml(&chat, "approvers_chat = \"-100999\"");
    let keel = Keel::start_with(&env(&model, &tools), |c| {
        format!("{c}\n{channels}\n{routing}")
    })
    .await;

    let (code, body) = telegram(
        &keel,
        &tg_message(7001, 222, 222, "Shut line F2 down", None),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    let run = keel
        .wait_status(&run_id, "waiting_approval", Some(KEY_ACME))
        .await;
    let approval = run["pending"]["approval_id"].as_str().unwrap().to_owned();

    // The request is posted to the approvers' chat, with two buttons.
    let posted = chat.wait_for("sendMessage", 1).await;
    let request = &posted[0].body;
    assert_eq!(request["chat_id"].to_string().trim_matches('"'), "-100999");
    assert!(
        request["text"].as_str().unwrap().contains("shutdown_line"),
        "{request}"
    );
    let buttons = request["reply_markup"]["inline_keyboard"].to_string();
    assert!(
        buttons.contains(&format!("approve:{approval}")),
        "{buttons}"
    );
    assert!(buttons.contains(&format!("deny:{approval}")), "{buttons}");

    // Carol is linked but may not approve; a stranger is not linked at all.
    for (update, user) in [(7002, 333), (7003, 999)] {
        let (code, body) = telegram(
            &keel,
            &tg_click(update, user, -100999, &format!("approve:{approval}")),
        )
        .await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["decided"], false, "{body}");
    }
    let refusals = chat.wait_for("answerCallbackQuery", 2).await;
    assert!(
        refusals[0].body["text"]
            .as_str()
            .unwrap()
            .starts_with("Sorry"),
        "{:?}",
        refusals[0]
    );
    let run = keel
        .wait_status(&run_id, "waiting_approval", Some(KEY_ACME))
        .await;
    assert_eq!(run["pending"]["approval_id"], approval.as_str());
    assert_eq!(tools.count("restart"), 0, "nothing ran");

    // Alice approves: the call runs once; a second click changes nothing.
    let (code, body) = telegram(
        &keel,
        &tg_click(7004, 111, -100999, &format!("approve:{approval}")),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["decided"], true, "{body}");
    let run = keel.wait_status(&run_id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "Furnace F2 is running at 1450 °C.");
    let (_, decided) = keel
        .get(&format!("/ai/approvals/{approval}"), Some(KEY_ACME))
        .await;
    assert_eq!(decided["status"], "approved");
    assert_eq!(decided["decided_by"], "alice");
    let (code, body) = telegram(
        &keel,
        &tg_click(7005, 111, -100999, &format!("deny:{approval}")),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["decided"], false, "{body}");
    // The same click delivered twice is one click.
    let (code, body) = telegram(
        &keel,
        &tg_click(7004, 111, -100999, &format!("approve:{approval}")),
    )
    .await;
    assert_eq!(
        (code, body["duplicate"].clone()),
        (200, json!(true)),
        "{body}"
    );
    assert_eq!(tools.count("restart"), 1, "the approved call ran once");
}

#[tokio::test]
async fn forged_stale_and_malformed_requests_are_refused_and_leave_nothing() {
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(BOT_TOKEN).await;
    let keel = keel_with(&model, &tools, &chat, "").await;
    let body = slack_dm("Ev0001", "U111", "How is furnace F2?").to_string();
    let bytes = body.as_bytes();

    // Slack: a bad signature, then a good one over a timestamp 10 minutes old.
    let (code, err) = post(
        &keel,
        "slack",
        &slack_headers(bytes, unix_now(), "not-the-secret"),
        bytes,
    )
    .await;
    assert_eq!(code, 401, "{err}");
    assert_eq!(err["error"]["code"], "unauthorized");
    let (code, err) = post(
        &keel,
        "slack",
        &slack_headers(bytes, unix_now() - 600, SLACK_SECRET),
        bytes,
    )
    .await;
    assert_eq!(code, 401, "{err}");
    let (code, _) = post(&keel, "slack", &[], bytes).await;
    assert_eq!(code, 401);
    // Telegram: the wrong secret token; then the right one on a broken body.
    let update = tg_message(8001, 111, 111, "How is furnace F2?", None).to_string();
    let wrong = [("X-Telegram-Bot-Api-Secret-Token", "guess".to_owned())];
    let (code, _) = post(&keel, "tg", &wrong, update.as_bytes()).await;
    assert_eq!(code, 401);
    let right = [("X-Telegram-Bot-Api-Secret-Token", TG_SECRET.to_owned())];
    let (code, err) = post(&keel, "tg", &right, b"{\"update_id\": \"x\"").await;
    assert_eq!(code, 400, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Telegram update"),
        "{err}"
    );
    let (code, err) = post(&keel, "nope", &right, update.as_bytes()).await;
    assert_eq!(code, 404, "{err}");

    assert!(
        runs_of(&keel, KEY_ACME).await.is_empty(),
        "no run was started"
    );
    assert!(chat.received().is_empty(), "nothing was sent");

    // Slack's URL check is answered with its challenge.
    let challenge = json!({"token": "t", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", "type": "url_verification"});
    let (code, body) = slack(&keel, &challenge).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["challenge"], challenge["challenge"]);
}

#[tokio::test]
async fn each_binding_tier_wins_over_the_ones_below_it() {
    let model = FakeOpenAi::start(Script::handler(|_| Reply::text("ok"))).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(BOT_TOKEN).await;
    let mut agents = String::new();
    for id in [
        "a_peer",
        "a_parent",
        "a_roles",
        "a_guild",
        "a_team",
        "a_account",
        "a_channel",
    ] {
        agents.push_str(&format!(
            "[[agents]]\nid = \"{id}\"\nprovider = \"main\"\nsystem_prompt = \"You help.\"\ntools = []\n[agents.drift]\nenabled = false\n\n"
        ));
    }
    // Listed least specific first: the order in the file does not decide.
    let routing = r#"
[[routing.bindings]]
agent = "a_channel"
channel = "hook"

[[routing.bindings]]
agent = "a_account"
channel = "hook"
account = "acct-1"

[[routing.bindings]]
agent = "a_team"
channel = "hook"
team = "T1"

[[routing.bindings]]
agent = "a_guild"
channel = "hook"
guild = "G1"

[[routing.bindings]]
agent = "a_roles"
channel = "hook"
guild = "G1"
roles = ["admin"]

[[routing.bindings]]
agent = "a_parent"
channel = "hook"
peer = "room-1"

[[routing.bindings]]
agent = "a_peer"
channel = "hook"
peer = "u-peer"
"#;
    let channels = channels_toml(&chat, "");
    let keel = Keel::start_with(&env(&model, &tools), |c| {
        format!("{c}\n{agents}\n{channels}\n{routing}")
    })
    .await;

    let everything = json!({"account": "acct-1", "guild": "G1", "roles": ["admin"], "team": "T1"});
    let with = |extra: Value| {
        let mut body = everything.clone();
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                body.as_object_mut().unwrap().remove(k);
            } else {
                body[k] = v.clone();
            }
        }
        body
    };
    let cases = [
        ("peer", "a_peer", with(json!({"sender": "u-peer"}))),
        (
            "parent_peer",
            "a_parent",
            with(json!({"sender": "x", "chat": "room-1", "thread": "t9"})),
        ),
        (
            "guild_roles",
            "a_roles",
            with(json!({"sender": "x", "chat": "room-2"})),
        ),
        (
            "guild",
            "a_guild",
            with(json!({"sender": "x", "chat": "room-2", "roles": []})),
        ),
        (
            "team",
            "a_team",
            with(json!({"sender": "x", "chat": "room-2", "guild": null})),
        ),
        (
            "account",
            "a_account",
            with(json!({"sender": "x", "chat": "room-2", "guild": null, "team": null})),
        ),
        (
            "channel",
            "a_channel",
            with(
                json!({"sender": "x", "chat": "room-2", "guild": null, "team": null, "account": "other"}),
            ),
        ),
    ];
    for (i, (tier, agent, mut body)) in cases.into_iter().enumerate() {
        body["id"] = json!(format!("msg-{i}"));
        body["text"] = json!("hello");
        let (code, resp) = hook(&keel, &body).await;
        assert_eq!(code, 200, "{tier}: {resp}");
        assert_eq!(resp["matched_by"], tier, "{body}: {resp}");
        assert_eq!(resp["agent"], agent, "{body}: {resp}");
        let run_id = resp["run_id"].as_str().unwrap();
        let run = keel.wait_status(run_id, "completed", Some(KEY_ACME)).await;
        assert_eq!(run["agent"], agent);
        assert_eq!(run["metadata"]["matched_by"], tier);
    }
    // A channel with no binding: the default agent.
    let (code, resp) = telegram(&keel, &tg_message(9001, 5, 5, "hello", None)).await;
    assert_eq!(code, 200, "{resp}");
    assert_eq!(
        (resp["matched_by"].clone(), resp["agent"].clone()),
        (json!("default"), json!("default"))
    );
}

#[tokio::test]
async fn each_dm_scope_gives_its_documented_session_key() {
    let model = FakeOpenAi::start(Script::handler(|_| Reply::text("ok"))).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(BOT_TOKEN).await;
    for (scope, key) in [
        ("main", "agent:default:main"),
        ("per-peer", "agent:default:direct:tg:42"),
        ("per-channel-peer", "agent:default:tg:direct:42"),
        ("per-account-channel-peer", "agent:default:tg:tg:direct:42"),
    ] {
        let keel = keel_with(
            &model,
            &tools,
            &chat,
            &format!("[routing]\ndm_scope = \"{scope}\"\n"),
        )
        .await;
        let (code, resp) = telegram(&keel, &tg_message(100, 42, 42, "hello", None)).await;
        assert_eq!(code, 200, "{resp}");
        assert_eq!(resp["session"], key, "{scope}");
        let run = keel
            .wait_status(
                resp["run_id"].as_str().unwrap(),
                "completed",
                Some(KEY_ACME),
            )
            .await;
        assert_eq!(run["session"], key);
        // A group is one shared conversation whatever the scope.
        let (_, resp) = telegram(&keel, &tg_message(101, 42, -500, "hello", None)).await;
        assert_eq!(resp["session"], "agent:default:tg:group:-500", "{scope}");
    }
}

#[tokio::test]
async fn two_identities_linked_to_one_person_continue_one_session() {
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(BOT_TOKEN).await;
    let routing = r#"
[routing]
dm_scope = "per-peer"

[[routing.identity_links]]
person = "ana"
identities = [{ channel = "tg", sender = "111" }, { channel = "slack", sender = "U111" }]
"#;
    let keel = keel_with(&model, &tools, &chat, routing).await;
    let (code, first) = telegram(
        &keel,
        &tg_message(200, 111, 111, "Remember batch B-77", None),
    )
    .await;
    assert_eq!(code, 200, "{first}");
    keel.wait_status(
        first["run_id"].as_str().unwrap(),
        "completed",
        Some(KEY_ACME),
    )
    .await;
    let (code, second) = slack(
        &keel,
        &slack_dm("Ev0200", "U111", "Which batch did I mention?"),
    )
    .await;
    assert_eq!(code, 200, "{second}");
    assert_eq!(first["session"], "agent:default:direct:ana");
    assert_eq!(second["session"], first["session"]);
    keel.wait_status(
        second["run_id"].as_str().unwrap(),
        "completed",
        Some(KEY_ACME),
    )
    .await;
    // The second run saw the first one's conversation.
    let request = model.last_request().unwrap();
    assert!(
        request.to_string().contains("Remember batch B-77"),
        "{request}"
    );
    // And the Slack answer went to Slack, in the DM it came from.
    let posted = chat.wait_for("chat.postMessage", 1).await;
    assert_eq!(posted[0].token.as_deref(), Some(BOT_TOKEN));
    assert_eq!(posted[0].body["channel"], "D0ANA");
    // An unlinked Slack user has a session of their own.
    let (_, other) = slack(&keel, &slack_dm("Ev0201", "U999", "hello")).await;
    assert_eq!(other["session"], "agent:default:direct:slack:U999");
}

#[tokio::test]
async fn a_failed_send_is_retried_and_every_attempt_is_an_event() {
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(BOT_TOKEN).await;
    let keel = keel_with(&model, &tools, &chat, "").await;
    chat.fail_next(2);
    let (_, body) = telegram(&keel, &tg_message(300, 111, 111, "hello there", None)).await;
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    let run = keel.wait_status(&run_id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "You said: hello there");
    let frames = keel.events(&run_id, None, Some(KEY_ACME)).await;
    let attempts: Vec<(u64, bool)> = frames
        .iter()
        .filter(|f| f.event == "channel_delivery")
        .map(|f| {
            (
                f.data["attempt"].as_u64().unwrap(),
                f.data["ok"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(attempts, vec![(1, false), (2, false), (3, true)]);
    assert_eq!(chat.accepted("sendMessage").len(), 1);
}

#[tokio::test]
async fn one_update_posted_to_two_nodes_at_once_starts_one_run() {
    let db = TestDb::create().await;
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(BOT_TOKEN).await;
    let mut nodes = Vec::new();
    for node in ["node-a", "node-b"] {
        let mut e = env(&model, &tools);
        e.server_extra = format!("database_url = \"{}\"\nnode_id = \"{node}\"\n", db.url);
        let channels = channels_toml(&chat, "");
        nodes.push(Keel::start_with(&e, |c| format!("{c}\n{channels}")).await);
    }
    for update_id in 400..405 {
        let update = tg_message(update_id, 111, 111, "hello nodes", None);
        let (a, b) = tokio::join!(telegram(&nodes[0], &update), telegram(&nodes[1], &update));
        assert_eq!((a.0, b.0), (200, 200), "{a:?} {b:?}");
        assert_eq!(a.1["run_id"], b.1["run_id"], "both nodes name the one run");
    }
    let runs = runs_of(&nodes[0], KEY_ACME).await;
    assert_eq!(runs.len(), 5, "one run per update");
    for run in &runs {
        nodes[0]
            .wait_status(run["id"].as_str().unwrap(), "completed", Some(KEY_ACME))
            .await;
    }
    chat.wait_for("sendMessage", 5).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        chat.accepted("sendMessage").len(),
        5,
        "one answer per update"
    );
    drop(nodes);
    drop(db);
}

/// The operator's own hook service: records what `message_received` is
/// told, and answers `before_prompt_build` with context, checking keel's
/// signature; `/down` always fails.
async fn hook_service() -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<(String, Value, bool)>>>,
) {
    use axum::body::Bytes;
    use axum::http::{HeaderMap, StatusCode};
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record =
        |path: &'static str, seen: std::sync::Arc<std::sync::Mutex<Vec<(String, Value, bool)>>>| {
            move |headers: HeaderMap, body: Bytes| {
                let seen = seen.clone();
                async move {
                    let ts = headers
                        .get("x-keel-timestamp")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    let sig = headers
                        .get("x-keel-signature")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    let signed = sig
                        == format!(
                            "sha256={}",
                            hmac_hex(HOOK_SECRET, &[ts.as_bytes(), b".", &body])
                        );
                    let v: Value = serde_json::from_slice(&body).unwrap();
                    seen.lock().unwrap().push((path.to_owned(), v, signed));
                    match path {
                        "/context" => (
                            StatusCode::OK,
                            axum::Json(
                                json!({"context": "Operator note: furnace F2 is under maintenance until Friday."}),
                            ),
                        ),
                        "/down" => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({}))),
                        _ => (StatusCode::OK, axum::Json(json!({"ignored": "anything"}))),
                    }
                }
            }
        };
    let app = axum::Router::new()
        .route(
            "/received",
            axum::routing::post(record("/received", seen.clone())),
        )
        .route(
            "/context",
            axum::routing::post(record("/context", seen.clone())),
        )
        .route("/down", axum::routing::post(record("/down", seen.clone())));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), seen)
}

#[tokio::test]
async fn dispatch_hooks_observe_messages_and_add_context_and_fail_open() {
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(BOT_TOKEN).await;
    let (service, seen) = hook_service().await;
    let hooks = format!(
        r#"
[[routing.hooks]]
point = "message_received"
url = "{service}/received"

[[routing.hooks]]
point = "message_received"
url = "{service}/down"

[[routing.hooks]]
point = "before_prompt_build"
url = "{service}/down"

[[routing.hooks]]
point = "before_prompt_build"
url = "{service}/context"
secret_env = "TEST_HOOK_SECRET"
channels = ["tg"]

[[routing.hooks]]
point = "before_prompt_build"
url = "http://127.0.0.1:1/closed"
timeout_ms = 300
"#
    );
    let keel = keel_with(&model, &tools, &chat, &hooks).await;
    let (code, body) = telegram(
        &keel,
        &tg_message(500, 111, 111, "Can I restart F2 today?", None),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    let run = keel.wait_status(&run_id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "Furnace F2 is running at 1450 °C.");

    // The context reached the model's system prompt, after the agent's own.
    let first = model.requests()[0].clone();
    let system = first["messages"][0]["content"].as_str().unwrap().to_owned();
    assert!(
        system.starts_with("You are the plant operations assistant."),
        "{system}"
    );
    assert!(
        system.contains("Operator note: furnace F2 is under maintenance until Friday."),
        "{system}"
    );
    assert_eq!(
        run["metadata"]["prompt_context"],
        "Operator note: furnace F2 is under maintenance until Friday."
    );

    // Every hook was called with the routed message; the signed one was signed.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(p, _, _)| p == "/received")
        .count()
        == 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "message_received never came"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let seen = seen.lock().unwrap().clone();
    let received = seen.iter().find(|(p, _, _)| p == "/received").unwrap();
    assert_eq!(received.1["point"], "message_received");
    assert_eq!(received.1["text"], "Can I restart F2 today?");
    assert_eq!(received.1["session"], "agent:default:tg:direct:111");
    let context = seen.iter().find(|(p, _, _)| p == "/context").unwrap();
    assert!(context.2, "the before_prompt_build call is signed");
    assert_eq!(context.1["point"], "before_prompt_build");
    assert!(
        seen.iter().any(|(p, _, _)| p == "/down"),
        "the failing hooks were called"
    );

    // A Slack message: the context hook is for tg only.
    let (_, body) = slack(&keel, &slack_dm("Ev0500", "U5", "hello")).await;
    let run = keel
        .wait_status(
            body["run_id"].as_str().unwrap(),
            "completed",
            Some(KEY_ACME),
        )
        .await;
    assert!(run["metadata"].get("prompt_context").is_none(), "{run}");
}

/// Slack's headers for a form-encoded interaction.
fn slack_form_headers(body: &[u8], ts: u64, secret: &str) -> Vec<(&'static str, String)> {
    let mut headers = slack_headers(body, ts, secret);
    headers.retain(|(k, _)| *k != "Content-Type");
    headers.push((
        "Content-Type",
        "application/x-www-form-urlencoded".to_owned(),
    ));
    headers
}

/// Posts a Slack interaction signed with the channel's secret.
async fn slack_interaction(keel: &Keel, body: &[u8]) -> (u16, Value) {
    let headers = slack_form_headers(body, unix_now(), SLACK_SECRET);
    post(keel, "slack", &headers, body).await
}

/// A Slack `block_actions` interaction: form-encoded `payload=`, as Slack
/// posts a button press.
fn slack_click(user: &str, value: &str, response_url: &str, trigger: &str) -> Vec<u8> {
    let payload = json!({
        "type": "block_actions",
        "user": {"id": user, "username": "someone", "team_id": "T0PLANT"},
        "api_app_id": "A0KEEL",
        "token": "verification-token-unused",
        "container": {"type": "message", "message_ts": "1700000200.000100", "channel_id": "C0APPROVE"},
        "trigger_id": trigger,
        "team": {"id": "T0PLANT", "domain": "plant"},
        "channel": {"id": "C0APPROVE", "name": "approvals"},
        "message": {"type": "message", "text": "Approval needed", "ts": "1700000200.000100"},
        "response_url": response_url,
        "actions": [{
            "action_id": "keel_approve",
            "block_id": "keel_approval",
            "text": {"type": "plain_text", "text": "Approve"},
            "value": value,
            "type": "button",
            "action_ts": "1700000210.840180"
        }]
    });
    serde_urlencoded::to_string([("payload", payload.to_string())])
        .unwrap()
        .into_bytes()
}

#[tokio::test]
async fn a_slack_approval_is_posted_with_buttons_and_a_click_by_the_approver_decides_it() {
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(BOT_TOKEN).await;
    let base = chat.base_url();
    let extra = format!(
        r#"
[[channels]]
id = "slack"
kind = "slack"
tenant = "acme"
bot_token_env = "TEST_TG_TOKEN"
signing_secret_env = "TEST_SLACK_SECRET"
api_base = "{base}"
approvers_chat = "C0APPROVE"

[[routing.identity_links]]
person = "alice"
principal = "alice"
identities = [{{ channel = "slack", sender = "U0ALICE" }}]
"#
    );
    let keel = Keel::start_with(&env(&model, &tools), |c| format!("{c}\n{extra}")).await;

    let (code, body) = slack(&keel, &slack_dm("Ev0600", "U0ANA", "Shut line F2 down")).await;
    assert_eq!(code, 200, "{body}");
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    let run = keel
        .wait_status(&run_id, "waiting_approval", Some(KEY_ACME))
        .await;
    let approval = run["pending"]["approval_id"].as_str().unwrap().to_owned();
    let posted = chat.wait_for("chat.postMessage", 1).await;
    assert_eq!(posted[0].body["channel"], "C0APPROVE");
    let blocks = posted[0].body["blocks"].to_string();
    assert!(blocks.contains(&format!("approve:{approval}")), "{blocks}");

    // Ana is not linked to a principal: refused, nothing changes.
    let response_url = format!("{base}/response");
    let click = slack_click(
        "U0ANA",
        &format!("approve:{approval}"),
        &response_url,
        "trig-1",
    );
    let (code, body) = slack_interaction(&keel, &click).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["decided"], false);
    assert_eq!(tools.count("restart"), 0);

    // A forged click is refused before anything is read.
    let (code, _) = post(
        &keel,
        "slack",
        &slack_form_headers(&click, unix_now(), "forged"),
        &click,
    )
    .await;
    assert_eq!(code, 401);

    let click = slack_click(
        "U0ALICE",
        &format!("approve:{approval}"),
        &response_url,
        "trig-2",
    );
    let (code, body) = slack_interaction(&keel, &click).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["decided"], true, "{body}");
    keel.wait_status(&run_id, "completed", Some(KEY_ACME)).await;
    assert_eq!(tools.count("restart"), 1);
    let answers = chat.wait_for("response", 2).await;
    assert!(
        answers[1].body.to_string().contains("Approved by alice"),
        "{:?}",
        answers[1]
    );
    // The run's answer goes to the DM it came from.
    let posted = chat.wait_for("chat.postMessage", 2).await;
    assert_eq!(posted[1].body["channel"], "D0ANA");
    assert_eq!(posted[1].body["text"], "Furnace F2 is running at 1450 °C.");
}

#[tokio::test]
async fn stop_cancels_the_running_run_and_new_starts_a_fresh_session() {
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(BOT_TOKEN).await;
    let keel = keel_with(&model, &tools, &chat, "").await;

    let (_, body) = telegram(&keel, &tg_message(700, 111, 111, "Shut line F2 down", None)).await;
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    keel.wait_status(&run_id, "waiting_approval", Some(KEY_ACME))
        .await;
    let (code, body) = telegram(&keel, &tg_message(701, 111, 111, "/stop", None)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["stopped"], 1, "{body}");
    keel.wait_status(&run_id, "cancelled", Some(KEY_ACME)).await;
    let sent = chat.wait_for("sendMessage", 2).await;
    assert_eq!(sent.last().unwrap().body["text"], "Stopped.");
    assert_eq!(tools.count("restart"), 0);

    // In a group, only a linked user may stop or reset the shared session.
    let (_, body) = telegram(&keel, &tg_message(702, 222, -300, "/stop@keel_bot", None)).await;
    assert_eq!(body["refused"], "stop", "{body}");

    let (code, body) = telegram(&keel, &tg_message(703, 111, 111, "/new", None)).await;
    assert_eq!(code, 200, "{body}");
    let reset = keel
        .wait_status(
            body["run_id"].as_str().unwrap(),
            "completed",
            Some(KEY_ACME),
        )
        .await;
    assert!(
        reset["output"]
            .as_str()
            .unwrap()
            .starts_with("Started a new session."),
        "{reset}"
    );
    let sent = chat.wait_for("sendMessage", 4).await;
    assert!(
        sent.last().unwrap().body["text"]
            .as_str()
            .unwrap()
            .starts_with("Started a new session."),
        "{sent:?}"
    );
}

#[tokio::test]
async fn routing_follows_the_configuration_after_a_reload() {
    let model = FakeOpenAi::start(Script::handler(|_| Reply::text("ok"))).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(BOT_TOKEN).await;
    let agents = "[[agents]]\nid = \"ops\"\nprovider = \"main\"\nsystem_prompt = \"Ops.\"\ntools = []\n[agents.drift]\nenabled = false\n";
    let binding = |agent: &str| {
        format!("[[routing.bindings]]\nagent = \"{agent}\"\nchannel = \"tg\"\npeer = \"111\"\n")
    };
    let channels = channels_toml(&chat, "");
    let first = binding("ops");
    let keel = Keel::start_with(&env(&model, &tools), |c| {
        format!("{c}\n{agents}\n{channels}\n{first}")
    })
    .await;
    let (_, body) = telegram(&keel, &tg_message(800, 111, 111, "hello", None)).await;
    assert_eq!(
        (body["agent"].clone(), body["matched_by"].clone()),
        (json!("ops"), json!("peer"))
    );

    // The binding now names another agent; a broken file changes nothing.
    let path = keel.dir.join("keel.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{text}\n[routing]\nnot_a_key = 1\n")).unwrap();
    let hup = |pid: u32| {
        let ok = std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -HUP failed");
    };
    hup(keel.pid());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (_, body) = telegram(&keel, &tg_message(801, 111, 111, "hello", None)).await;
    assert_eq!(
        body["agent"], "ops",
        "a configuration with errors is not applied: {body}"
    );

    std::fs::write(&path, text.replace(&first, &binding("default"))).unwrap();
    hup(keel.pid());
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    for update in 802.. {
        let (_, body) = telegram(&keel, &tg_message(update, 111, 111, "hello", None)).await;
        if body["agent"] == "default" {
            assert_eq!(body["matched_by"], "peer");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reload never applied: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A model that reads the furnace named in the input, then reports what
/// the tool (or the refusal) said.
fn furnace_reader() -> Script {
    Script::handler(|req: &Value| {
        let messages = req["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or(Value::Null);
        if last["role"] == "tool" {
            return Reply::text(format!(
                "Tool said: {}",
                last["content"].as_str().unwrap_or_default()
            ));
        }
        let input = last["content"].as_str().unwrap_or_default();
        let furnace = if input.contains("F3") { "F3" } else { "F2" };
        Reply::tool_call("furnace_status", json!({"furnace_id": furnace}))
    })
}

#[tokio::test]
async fn a_before_tool_call_hook_sees_the_cleared_call_and_its_refusal_stops_it() {
    use axum::http::StatusCode;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/admit",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let record = record.clone();
            async move {
                record.lock().unwrap().push(body.clone());
                let answer = if body["arguments"]["furnace_id"] == "F3" {
                    json!({"decision": "deny", "reason": "F3 is being relined"})
                } else {
                    json!({"decision": "allow"})
                };
                (StatusCode::OK, axum::Json(answer))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let service = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let model = FakeOpenAi::start(furnace_reader()).await;
    let tools = ToolServer::start().await;
    let hook = |url: &str| {
        format!(
            "[[routing.hooks]]\npoint = \"before_tool_call\"\nurl = \"{url}\"\ntools = [\"furnace_*\"]\ntimeout_ms = 500\n"
        )
    };
    let admit = hook(&format!("{service}/admit"));
    let mut e = env(&model, &tools);
    e.auth = false;
    let keel = Keel::start_with(&e, |c| format!("{c}\n{admit}")).await;

    let ok = keel.start_run("How is furnace F2?", None).await;
    let run = keel.wait_status(&ok, "completed", None).await;
    assert!(run["output"].as_str().unwrap().contains("1450"), "{run}");
    let asked = seen.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0]["tool"], "furnace_status");
    assert_eq!(asked[0]["arguments"], json!({"furnace_id": "F2"}));
    assert_eq!(asked[0]["run_id"], ok.as_str());

    let refused = keel.start_run("How is furnace F3?", None).await;
    let run = keel.wait_status(&refused, "completed", None).await;
    assert_eq!(tools.count("furnace"), 1, "the refused call never ran");
    assert!(
        run["output"]
            .as_str()
            .unwrap()
            .contains("F3 is being relined"),
        "the model is told why: {run}"
    );
    let frames = keel.events(&refused, None, None).await;
    let denial = frames
        .iter()
        .find(|f| f.event == "policy_decision" && f.data["decision"] == "deny")
        .unwrap();
    assert_eq!(denial.data["rule"], "before_tool_call_hook[0]");
    assert!(
        !frames.iter().any(|f| f.event == "tool_call"),
        "no tool_call event"
    );

    // Fails closed: a hook that cannot be reached refuses the call.
    let down = hook("http://127.0.0.1:1/admit");
    let keel = Keel::start_with(&e, |c| format!("{c}\n{down}")).await;
    let id = keel.start_run("How is furnace F2?", None).await;
    let run = keel.wait_status(&id, "completed", None).await;
    assert_eq!(tools.count("furnace"), 1, "nothing ran");
    assert!(
        run["output"]
            .as_str()
            .unwrap()
            .contains("could not be reached"),
        "{run}"
    );
}
