#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The real `keel` binary with the embedded local model (the SmolLM2 GGUF
//! that scripts/setup-local-model.sh fetches): the core guardrail scenarios
//! hold end to end, and a first run with no configuration answers offline.
#![cfg(feature = "local")]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use keel_test_support::sse::{Frame, read_frames};
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

fn gguf() -> PathBuf {
    let path = std::env::var_os("KEEL_TEST_GGUF")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| {
                PathBuf::from(h).join(".cache/keel-models/SmolLM2-135M-Instruct.Q4_1.gguf")
            })
        })
        .expect("HOME or KEEL_TEST_GGUF must be set");
    assert!(
        path.is_file(),
        "the test model {} is missing: run scripts/setup-local-model.sh (or set KEEL_TEST_GGUF)",
        path.display()
    );
    path
}

struct Keel {
    _child: Child,
    base: String,
    http: reqwest::Client,
    _tmp: tempfile::TempDir,
}

/// `keel serve` with a local provider; `agent` is TOML for the agent
/// (its `tools` and limits), `tools` the tool definitions.
async fn start(agent: &str, tools: &str, max_output_tokens: u32) -> Keel {
    start_with(&gguf(), "", agent, tools, max_output_tokens).await
}

/// As [`start`], running the GGUF at `model` with `provider` (TOML lines)
/// added to the provider.
async fn start_with(
    model: &Path,
    provider: &str,
    agent: &str,
    tools: &str,
    max_output_tokens: u32,
) -> Keel {
    let tmp = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
[server]
bind = "127.0.0.1:0"
data_dir = "{dir}"

[[providers]]
name = "local"
kind = "local"
model = "smollm2-135m"
model_path = "{gguf}"
threads = 1
context_window = 2048
max_output_tokens = {max_output_tokens}
{provider}

[[agents]]
id = "default"
provider = "local"
system_prompt = "You are the plant operations assistant. Answer briefly."
{agent}

{tools}
"#,
        dir = tmp.path().display(),
        gguf = model.display(),
    );
    let path = tmp.path().join("keel.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .env("KEEL_LOG", "warn")
        .env_remove("KEEL_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(tmp.path().join("keel.log")).unwrap(),
        ))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let base = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(l) = lines.next_line().await.unwrap() {
            if let Some(url) = l.strip_prefix("keel listening on ") {
                return url.to_owned();
            }
        }
        let log = std::fs::read_to_string(tmp.path().join("keel.log")).unwrap_or_default();
        panic!("keel exited before listening:\n{log}");
    })
    .await
    .expect("keel did not start within 60 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Keel {
        _child: child,
        base,
        http: reqwest::Client::new(),
        _tmp: tmp,
    }
}

impl Keel {
    async fn start_run(&self, input: &str) -> String {
        let resp = self
            .http
            .post(format!("{}/ai/runs", self.base))
            .json(&json!({"input": input}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 201);
        let body: Value = resp.json().await.unwrap();
        body["id"].as_str().unwrap().to_owned()
    }

    async fn events_until(&self, id: &str, until: impl Fn(&Frame) -> bool) -> Vec<Frame> {
        let resp = self
            .http
            .get(format!("{}/ai/runs/{id}/events", self.base))
            .send()
            .await
            .unwrap();
        read_frames(resp, Duration::from_secs(120), until).await
    }

    async fn run(&self, id: &str) -> Value {
        self.http
            .get(format!("{}/ai/runs/{id}", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

const PLANT_TOOLS: &str = r#"
[[tools.http]]
name = "plant_overview"
description = "Overview of the whole plant"
method = "GET"
url = "TOOLS/furnaces/ALL"
parameters = { type = "object", properties = {} }
risk = "read"
"#;

fn with_tools(url: &str) -> String {
    PLANT_TOOLS.replace("TOOLS", url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_general_question_is_answered_streamed_and_never_waits_for_input() {
    let tools = ToolServer::start().await;
    let keel = start(
        "tools = [\"plant_overview\"]\n[agents.limits]\nmax_steps = 3\n",
        &with_tools(&tools.base_url()),
        48,
    )
    .await;
    let id = keel.start_run("What is the foundry industry?").await;
    let frames = keel.events_until(&id, |_| false).await;
    let last = frames.last().unwrap();
    assert_eq!(last.event, "run_completed", "{:?}", last.data);
    assert!(
        ["answered", "budget_exhausted", "fallback"]
            .contains(&last.data["reason"].as_str().unwrap()),
        "{:?}",
        last.data
    );
    assert!(
        !frames.iter().any(|f| f.event == "clarification_needed"),
        "a general question asked the user"
    );
    assert!(
        frames.iter().any(|f| f.event == "message_delta"),
        "the answer was not streamed"
    );
    let run = keel.run(&id).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert!(
        !run["output"].as_str().unwrap_or("").trim().is_empty(),
        "{run}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_end_the_run_with_an_answer_from_what_is_known() {
    let tools = ToolServer::start().await;
    // A context budget smaller than any prompt: the first step is over budget.
    let keel = start(
        "tools = [\"plant_overview\"]\n[agents.limits]\nmax_context_chars = 40\n",
        &with_tools(&tools.base_url()),
        32,
    )
    .await;
    let id = keel.start_run("Give me the plant overview.").await;
    let frames = keel.events_until(&id, |_| false).await;
    let last = frames.last().unwrap();
    assert_eq!(last.event, "run_completed");
    assert_eq!(last.data["reason"], "budget_exhausted", "{:?}", last.data);
    assert!(
        frames
            .iter()
            .any(|f| f.event == "react_feedback" && f.data["code"] == "budget_exhausted")
    );
    let run = keel.run(&id).await;
    assert!(
        !run["output"].as_str().unwrap_or("").trim().is_empty(),
        "{run}"
    );

    // One step: whatever the model does first, a tool call cannot be followed
    // by another model decision, so the run ends on its budget.
    let keel = start(
        "tools = [\"plant_overview\"]\n[agents.limits]\nmax_steps = 1\n",
        &with_tools(&tools.base_url()),
        32,
    )
    .await;
    let id = keel.start_run("Show me the plant overview, please.").await;
    let frames = keel.events_until(&id, |_| false).await;
    let last = frames.last().unwrap();
    assert_eq!(last.event, "run_completed");
    let called = frames
        .iter()
        .any(|f| f.event == "tool_started" || f.event == "tool_call");
    let reason = last.data["reason"].as_str().unwrap();
    if called {
        assert_eq!(reason, "budget_exhausted", "{:?}", last.data);
    } else {
        assert_eq!(reason, "answered", "{:?}", last.data);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_mid_generation_ends_the_run_promptly() {
    let keel = start("tools = []\n", "", 1500).await;
    let id = keel
        .start_run("Write a very long story about a furnace, with many chapters.")
        .await;
    // Wait until the model is streaming text.
    let frames = keel.events_until(&id, |f| f.event == "message_delta").await;
    assert_eq!(frames.last().unwrap().event, "message_delta");
    let cancelled_at = Instant::now();
    let resp = keel
        .http
        .post(format!("{}/ai/runs/{id}/cancel", keel.base))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let frames = keel.events_until(&id, |f| f.event == "run_cancelled").await;
    assert_eq!(frames.last().unwrap().event, "run_cancelled");
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(2),
        "cancel took {:?}",
        cancelled_at.elapsed()
    );
    // The worker is free again: a new run is answered.
    let id = keel.start_run("Say hello.").await;
    let frames = keel.events_until(&id, |_| false).await;
    assert_eq!(frames.last().unwrap().event, "run_completed");
}

/// `keel run` in an empty directory with no configuration: the local
/// default model (found in the shared cache the setup script fills) answers
/// offline, streamed; `keel model pull` puts a verified copy in the data dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_config_first_run_answers_offline() {
    let home = tempfile::tempdir().unwrap();
    let cache = home.path().join(".cache/keel-models");
    std::fs::create_dir_all(&cache).unwrap();
    std::os::unix::fs::symlink(gguf(), cache.join("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let work = tempfile::tempdir().unwrap();
    let keel = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_keel"));
        cmd.args(args)
            .current_dir(work.path())
            .env("HOME", home.path())
            .env_remove("KEEL_LOG")
            .env("KEEL_PROVIDERS__DEFAULT__THREADS", "1")
            .env("KEEL_PROVIDERS__DEFAULT__MAX_OUTPUT_TOKENS", "32")
            .env_remove("KEEL_CONFIG")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("KEEL_MODEL")
            .stdin(Stdio::null());
        cmd
    };
    // As a new user sees it: on a pseudo-terminal, with no KEEL_LOG.
    let output = keel(&["run", "What is a furnace?"]).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // The 135M model picks tools close to randomly: the run may end on an
    // answer, a loop block or a budget, but it always completes with one.
    assert!(stdout.contains("✔ completed ("), "{stdout}");
    assert!(
        stdout.contains("  … "),
        "the answer was not streamed: {stdout}"
    );
    let screen = on_a_terminal(
        work.path(),
        home.path(),
        &[env!("CARGO_BIN_EXE_keel"), "run", "What is a furnace?"],
    );
    assert!(!screen.contains('\u{1b}'), "colour codes: {screen:?}");
    for level in [" INFO ", " WARN ", " ERROR ", " DEBUG "] {
        assert!(!screen.contains(level), "a log line on screen:\n{screen}");
    }
    let notices: Vec<&str> = screen.lines().filter(|l| l.starts_with("keel: ")).collect();
    assert!(
        notices.len() <= 1
            && notices
                .iter()
                .all(|l| l.contains("setup-embedder.sh") && l.len() < 120),
        "at most one short line about the embedder:\n{screen}"
    );
    assert!(screen.contains("▶ run started"), "{screen}");
    // The log went to the data dir instead, with the defaults in use.
    let log = std::fs::read_to_string(work.path().join("data/keel.log")).unwrap();
    assert!(
        log.contains("no keel.toml — defaults: local model `smollm2-135m`")
            && log.contains("OPENAI_BASE_URL")
            && log.contains("applied sqlite migration"),
        "{log}"
    );
    assert!(!log.contains('\u{1b}'), "colour codes in the log file");
    assert!(Path::new(&work.path().join("data/keel.db")).exists());

    let output = keel(&["model", "pull", "smollm2-135m"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("verified (sha256 b179c952"), "{stderr}");
    let pulled = work
        .path()
        .join("data/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(pulled.is_file() && !pulled.is_symlink(), "{stderr}");
    // Pulling again finds the verified copy.
    let output = keel(&["model", "pull"]).output().await.unwrap();
    assert!(String::from_utf8_lossy(&output.stderr).contains("already in"));
    let output = keel(&["model", "list"]).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("smollm2-135m") && stdout.contains("present at ./data/models"),
        "{stdout}"
    );
}

/// `requantize_q4_1` in keel.toml decides whether the Q4_1 model runs from
/// a Q8_0 copy written beside it: on by default, none with `false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_q8_0_weight_copy_follows_the_config() {
    for (setting, copies) in [("requantize_q4_1 = false", 0), ("", 1)] {
        let models = tempfile::tempdir().unwrap();
        let model = models.path().join("model.gguf");
        if std::fs::hard_link(gguf(), &model).is_err() {
            std::fs::copy(gguf(), &model).unwrap();
        }
        let keel = start_with(&model, setting, "", "", 64).await;
        let id = keel.start_run("Say hello.").await;
        keel.events_until(&id, |f| f.event == "run_completed").await;
        let written: Vec<String> = std::fs::read_dir(models.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".q8_0"))
            .collect();
        assert_eq!(written.len(), copies, "{setting:?}: {written:?}");
    }
}

/// What `argv` prints on a pseudo-terminal (util-linux `script`), as a
/// person running it would see it: stdout and stderr together.
fn on_a_terminal(dir: &Path, home: &Path, argv: &[&str]) -> String {
    let line = argv
        .iter()
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect::<Vec<_>>()
        .join(" ");
    let out = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .current_dir(dir)
        .env("HOME", home)
        .env("TERM", "xterm-256color")
        .env_remove("KEEL_LOG")
        .env_remove("KEEL_CONFIG")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("KEEL_MODEL")
        .env("KEEL_PROVIDERS__DEFAULT__THREADS", "1")
        .env("KEEL_PROVIDERS__DEFAULT__MAX_OUTPUT_TOKENS", "32")
        .stdin(Stdio::null())
        .output()
        .expect("util-linux `script` runs the command on a pseudo-terminal");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n")
}
