//! The operator console in a real headless Chromium, driven over WebDriver
//! (Debian's `chromium` and `chromium-driver`, installed by
//! `scripts/setup-browser.sh`), against a real `keel serve` with API keys.
//!
//! Each test saves a screenshot of every page it visits under
//! `$CARGO_TARGET_TMPDIR/console-screenshots/`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Env, KEY_ACME, KEY_ACME_CAROL, KEY_GLOBEX, Keel};
use fantoccini::{Client, ClientBuilder, Locator};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

/// A scripted plant model: asked to shut a line down it proposes the
/// dangerous `shutdown_line`, otherwise it reads a furnace; once a tool has
/// answered it reports what the tool said.
fn plant_model() -> Script {
    Script::handler(|req: &Value| {
        let messages = req["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or(Value::Null);
        if last["role"] == "tool" {
            let said = last["content"].as_str().unwrap_or_default();
            if said.contains("denied") || said.contains("not approved") {
                return Reply::text("The shutdown was not approved, so line F2 keeps running.");
            }
            return Reply::text("Furnace F2 reported back; all done.");
        }
        let input = last["content"].as_str().unwrap_or_default();
        if input.contains("Shut") {
            Reply::tool_call("shutdown_line", json!({"furnace_id": "F2"}))
        } else {
            Reply::tool_call("furnace_status", json!({"furnace_id": "F2"}))
        }
    })
}

/// chromedriver on a free port, and one browser session through it.
struct Browser {
    client: Client,
    _driver: Child,
    _profile: tempfile::TempDir,
    shots: PathBuf,
    test: &'static str,
}

impl Browser {
    async fn start(test: &'static str) -> Browser {
        let driver_bin = std::env::var("KEEL_CHROMEDRIVER").unwrap_or("chromedriver".into());
        let chromium = std::env::var("KEEL_CHROMIUM").unwrap_or("/usr/bin/chromium".into());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {driver_bin} ({e}); run `bash scripts/setup-browser.sh`")
            });
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({
            "goog:chromeOptions": {
                "binary": chromium,
                // The flags keep Chromium from reaching for Google's hosts
                // on a machine with no network, and from needing a sandbox
                // or a GPU in a container.
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--window-size=1280,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        });
        let Value::Object(caps) = caps else {
            unreachable!()
        };
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("no WebDriver session from {driver_bin}: {e}"),
            }
        };
        let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
        std::fs::create_dir_all(&shots).unwrap();
        Browser {
            client,
            _driver: driver,
            _profile: profile,
            shots,
            test,
        }
    }

    async fn open(&self, keel: &Keel, hash: &str) {
        self.client
            .goto(&keel.url(&format!("/#{hash}")))
            .await
            .unwrap();
    }

    /// Enters an API key the way an operator does: once, in the header form.
    async fn use_key(&self, key: &str) {
        let input = self.wait_for("#key-input").await;
        input.clear().await.unwrap();
        input.send_keys(key).await.unwrap();
        self.client
            .find(Locator::Css("#key-save"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let state = self.wait_for("#key-state").await;
        assert_eq!(state.text().await.unwrap(), "key set for this tab");
    }

    async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(20))
            .every(Duration::from_millis(50))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css} never appeared: {e}"))
    }

    async fn click(&self, css: &str) {
        self.on_fresh(css, |e| async move { e.click().await }).await;
    }

    /// Types into the element `css` names, as an operator does.
    async fn type_into(&self, css: &str, text: &str) {
        self.on_fresh(css, |e| async move { e.send_keys(text).await })
            .await;
    }

    /// Does `act` on the element `css` names. The page may rebuild it
    /// between finding and acting (a live refresh); then the element is
    /// found again, as a person's next click would find the new one.
    async fn on_fresh<'a, F, Fut>(&self, css: &str, act: F)
    where
        F: Fn(fantoccini::elements::Element) -> Fut,
        Fut: std::future::Future<Output = Result<(), fantoccini::error::CmdError>> + 'a,
    {
        for _ in 0..20 {
            match act(self.wait_for(css).await).await {
                Ok(()) => return,
                Err(fantoccini::error::CmdError::Standard(e))
                    if e.error == fantoccini::error::ErrorStatus::StaleElementReference =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{css}: {e}"),
            }
        }
        panic!("{css} kept being replaced");
    }

    async fn eval(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// Polls a page-side expression until it is true.
    async fn until(&self, what: &str, script: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.eval(script).await == Value::Bool(true) {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn screenshot(&self, page: &str) {
        let png = self.client.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a screenshot is a PNG");
        let path = self.shots.join(format!("{}-{page}.png", self.test));
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshot: {}", path.display());
    }

    /// The event types on the run page's timeline, in order.
    async fn timeline(&self) -> Vec<String> {
        let v = self
            .eval(
                "return [...document.querySelectorAll('#timeline li')].map(li => li.dataset.type)",
            )
            .await;
        serde_json::from_value(v).unwrap()
    }

    async fn close(self) {
        self.client.close().await.unwrap();
    }
}

async fn keel(model: &FakeOpenAi, tools: &ToolServer) -> Keel {
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    Keel::start(&env).await
}

#[tokio::test]
async fn a_run_started_through_the_api_shows_up_live_with_its_timeline() {
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let keel = keel(&model, &tools).await;
    let browser = Browser::start("run").await;
    browser.open(&keel, "/runs").await;
    browser.use_key(KEY_ACME).await;
    browser.wait_for("#runs-body").await;

    let started = Instant::now();
    let id = keel
        .start_run("How hot is furnace F2?", Some(KEY_ACME))
        .await;
    browser.wait_for(&format!("tr[data-run='{id}']")).await;
    let seen_after = started.elapsed();
    assert!(
        seen_after <= Duration::from_secs(2),
        "the run appeared in the list after {seen_after:?}"
    );
    keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    browser
        .until(
            "the list to show the run completed",
            &format!(
                "return document.querySelector(\"tr[data-run='{id}'] [data-status]\")?.dataset.status === 'completed'"
            ),
        )
        .await;
    browser.screenshot("runs").await;

    // The filters: by status, agent and session, as the API applies them.
    for (query, shown) in [
        ("status=completed".to_owned(), true),
        ("status=failed".to_owned(), false),
        ("agent=default".to_owned(), true),
        ("agent=planner".to_owned(), false),
        ("session=elsewhere".to_owned(), false),
    ] {
        browser.open(&keel, &format!("/runs?{query}")).await;
        browser
            .wait_for(&format!("#runs[data-loaded='#/runs?{query}']"))
            .await;
        let rows = browser.wait_for("#runs-body").await.text().await.unwrap();
        assert_eq!(rows.contains(&id), shown, "{query}: {rows}");
    }
    let run = keel.get(&format!("/ai/runs/{id}"), Some(KEY_ACME)).await.1;
    let session = run["session"].as_str().unwrap();
    browser
        .open(&keel, &format!("/runs?session={session}"))
        .await;
    browser.wait_for(&format!("tr[data-run='{id}']")).await;

    // The run's page: its live timeline, in the loop's order.
    browser.click(&format!("tr[data-run='{id}'] a")).await;
    browser
        .wait_for("#timeline li[data-type='run_completed']")
        .await;
    let types = browser.timeline().await;
    assert!(
        keel_test_support::sse::is_subsequence(
            &types,
            &[
                "react_plan",
                "policy_decision",
                "tool_call",
                "tool_result",
                "final"
            ]
        ),
        "{types:?}"
    );
    // The timeline is the run's whole event log, nothing dropped or doubled
    // (message deltas are folded into the streamed answer instead).
    let frames = keel.events(&id, None, Some(KEY_ACME)).await;
    let logged: Vec<String> = frames
        .iter()
        .map(|f| f.event.clone())
        .filter(|t| t != "message_delta")
        .collect();
    assert_eq!(types, logged);
    let rule = browser
        .eval(
            "return document.querySelector(\"li[data-type='policy_decision'] .rule\").textContent",
        )
        .await;
    let logged_rule = frames
        .iter()
        .find(|f| f.event == "policy_decision")
        .unwrap()
        .data["rule"]
        .clone();
    assert_eq!(rule, logged_rule, "the decision shows its rule");
    // Every event is written out as text: the plan names its call, and no
    // value is shown as an unrendered object.
    let plan = browser
        .eval("return document.querySelector(\"li[data-type='react_plan']\").innerText")
        .await;
    assert!(plan.as_str().unwrap().contains("furnace_status"), "{plan}");
    let page = browser
        .eval("return document.getElementById('main').innerText")
        .await;
    let page = page.as_str().unwrap();
    assert!(!page.contains("[object"), "{page}");
    assert!(!page.contains("undefined"), "{page}");
    let info = browser.wait_for("#run-info").await.text().await.unwrap();
    assert!(!info.contains("null"), "{info}");
    let output = browser.wait_for("#run-output").await.text().await.unwrap();
    assert_eq!(output, "Furnace F2 reported back; all done.");
    browser.screenshot("run").await;

    // Replay: step back to the start of the finished run, then forward.
    browser.click("#replay-first").await;
    let label = browser
        .wait_for("#replay-label")
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(label, format!("event 1 of {}: run_started", types.len()));
    browser.click("#replay-next").await;
    let visible = browser
        .eval(
            "return [...document.querySelectorAll('#timeline li')].filter(li => !li.hidden).length",
        )
        .await;
    assert_eq!(visible, json!(2));
    browser.screenshot("replay").await;

    // The tools page shows each tool's risk and approval setting.
    browser.open(&keel, "/tools").await;
    let row = browser.wait_for("tr[data-tool='shutdown_line']").await;
    let text = row.text().await.unwrap();
    assert!(
        text.contains("dangerous") && text.contains("required"),
        "{text}"
    );
    browser.screenshot("tools").await;
    browser.close().await;
}

/// Starts a run that needs approval and opens the approvals page on it.
async fn pending(keel: &Keel, browser: &Browser) -> (String, String) {
    let id = keel.start_run("Shut line F2 down", Some(KEY_ACME)).await;
    let run = keel
        .wait_status(&id, "waiting_approval", Some(KEY_ACME))
        .await;
    let approval = run["pending"]["approval_id"].as_str().unwrap().to_owned();
    browser.open(keel, "/approvals").await;
    let card = browser
        .wait_for(&format!("[data-approval='{approval}']"))
        .await;
    let text = card.text().await.unwrap();
    assert!(text.contains("shutdown_line"), "{text}");
    assert!(text.contains("dangerous"), "the risk shows: {text}");
    assert!(
        text.contains("\"furnace_id\": \"F2\""),
        "the arguments show: {text}"
    );
    (id, approval)
}

#[tokio::test]
async fn approving_from_the_console_lets_the_run_finish() {
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let keel = keel(&model, &tools).await;
    let browser = Browser::start("approve").await;
    browser.open(&keel, "/approvals").await;

    // Carol may operate but not approve: the API refuses, the page says so.
    browser.use_key(KEY_ACME_CAROL).await;
    let (id, approval) = pending(&keel, &browser).await;
    browser.click(&format!("[data-approve='{approval}']")).await;
    browser
        .until(
            "the refusal to show",
            "return !document.getElementById('banner').hidden",
        )
        .await;
    let banner = browser.wait_for("#banner").await.text().await.unwrap();
    assert!(banner.starts_with("approve failed"), "{banner}");
    assert_eq!(tools.count("restart"), 0);

    browser.use_key(KEY_ACME).await;
    browser.open(&keel, "/approvals").await;
    browser
        .wait_for(&format!("[data-approval='{approval}']"))
        .await;
    browser.screenshot("approvals").await;
    browser
        .type_into(
            &format!("[data-approval-reason='{approval}']"),
            "planned maintenance",
        )
        .await;
    browser.click(&format!("[data-approve='{approval}']")).await;
    browser.wait_for("#no-approvals").await;

    let run = keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "Furnace F2 reported back; all done.");
    assert_eq!(tools.count("restart"), 1, "the approved call ran once");
    let (_, decided) = keel
        .get(&format!("/ai/approvals/{approval}"), Some(KEY_ACME))
        .await;
    assert_eq!(decided["status"], "approved");
    assert_eq!(decided["decided_by"], "alice");
    assert_eq!(decided["decision_reason"], "planned maintenance");

    browser.open(&keel, &format!("/runs/{id}")).await;
    browser
        .wait_for("#timeline li[data-type='run_completed']")
        .await;
    let types = browser.timeline().await;
    assert!(
        keel_test_support::sse::is_subsequence(
            &types,
            &[
                "approval_required",
                "approval_resolved",
                "tool_call",
                "tool_result",
                "final"
            ]
        ),
        "{types:?}"
    );
    browser.screenshot("approved-run").await;
    browser.close().await;
}

#[tokio::test]
async fn denying_from_the_console_keeps_the_call_from_running() {
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let keel = keel(&model, &tools).await;
    let browser = Browser::start("deny").await;
    browser.open(&keel, "/runs").await;
    browser.use_key(KEY_ACME).await;
    let (id, approval) = pending(&keel, &browser).await;

    // Deny from the run's own page this time.
    browser.open(&keel, &format!("/runs/{id}")).await;
    browser
        .type_into(
            &format!("[data-approval-reason='{approval}']"),
            "line is busy",
        )
        .await;
    browser.screenshot("waiting-run").await;
    browser.click(&format!("[data-deny='{approval}']")).await;
    let run = keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    assert_eq!(
        run["output"],
        "The shutdown was not approved, so line F2 keeps running."
    );
    assert_eq!(tools.count("restart"), 0, "a denied call never runs");
    browser
        .wait_for("#timeline li[data-type='run_completed']")
        .await;
    let resolved = browser
        .eval("return document.querySelector(\"li[data-type='approval_resolved']\").textContent")
        .await;
    let resolved = resolved.as_str().unwrap();
    assert!(
        resolved.contains("deny by alice: line is busy"),
        "{resolved}"
    );
    browser.screenshot("denied-run").await;
    browser.close().await;
}

#[tokio::test]
async fn another_tenant_sees_nothing() {
    let model = FakeOpenAi::start(plant_model()).await;
    let tools = ToolServer::start().await;
    let keel = keel(&model, &tools).await;
    let id = keel.start_run("Shut line F2 down", Some(KEY_ACME)).await;
    keel.wait_status(&id, "waiting_approval", Some(KEY_ACME))
        .await;

    let browser = Browser::start("other-tenant").await;
    browser.open(&keel, "/runs").await;
    browser.use_key(KEY_GLOBEX).await;
    browser.open(&keel, &format!("/runs/{id}")).await;
    let missing = browser
        .wait_for("#run-not-found")
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(missing, format!("Run {id} not found."));
    browser.screenshot("run-not-found").await;

    browser.open(&keel, "/runs").await;
    browser.wait_for("#runs[data-loaded='#/runs']").await;
    let list = browser.wait_for("#runs-body").await.text().await.unwrap();
    assert_eq!(list, "No runs.");
    browser.open(&keel, "/approvals").await;
    browser.wait_for("#no-approvals").await;
    let page = browser.eval("return document.body.innerText").await;
    let page = page.as_str().unwrap();
    assert!(!page.contains(&id), "another tenant's run id shows: {page}");
    assert!(!page.contains("shutdown_line"), "{page}");
    browser.screenshot("other-tenant-approvals").await;

    // The same run with its own tenant's key is there.
    browser.use_key(KEY_ACME).await;
    browser.open(&keel, &format!("/runs/{id}")).await;
    browser
        .wait_for("#timeline li[data-type='approval_required']")
        .await;
    browser.close().await;
}

#[tokio::test]
async fn a_question_is_answered_from_the_run_page() {
    // Asks for the furnace when the user named none, then reads it.
    let model = FakeOpenAi::start(Script::handler(|req: &Value| {
        let messages = req["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or(Value::Null);
        if last["role"] == "tool" {
            return Reply::text("Furnace F2 reported back; all done.");
        }
        let named = messages
            .iter()
            .any(|m| m["role"] == "user" && m["content"].as_str().unwrap_or("").contains("F2"));
        if named {
            Reply::tool_call("furnace_status", json!({"furnace_id": "F2"}))
        } else {
            Reply::tool_call("furnace_status", json!({}))
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let keel = keel(&model, &tools).await;
    let id = keel
        .start_run("How is the furnace doing?", Some(KEY_ACME))
        .await;
    keel.wait_status(&id, "waiting_input", Some(KEY_ACME)).await;

    let browser = Browser::start("answer").await;
    browser.open(&keel, "/runs").await;
    browser.use_key(KEY_ACME).await;
    browser.open(&keel, &format!("/runs/{id}")).await;
    let pending = browser.wait_for("#run-pending").await;
    browser.wait_for("#answer-text").await;
    let asked = pending.text().await.unwrap();
    assert!(asked.contains("furnace_id"), "the question shows: {asked}");
    browser.screenshot("question").await;
    browser
        .type_into("#answer-text", "Sorry, it is furnace F2.")
        .await;
    browser.click("#answer-send").await;
    let run = keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "Furnace F2 reported back; all done.");
    assert_eq!(tools.count("furnace"), 1);
    browser
        .wait_for("#timeline li[data-type='run_completed']")
        .await;
    let types = browser.timeline().await;
    assert!(
        keel_test_support::sse::is_subsequence(
            &types,
            &["clarification_needed", "tool_call", "tool_result", "final"]
        ),
        "{types:?}"
    );
    browser.close().await;
}
