//! Starts real `keel serve` processes against a fake model and a real HTTP
//! tool backend, and talks to them over HTTP like any client would.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use keel_test_support::sse::{Frame, read_frames};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub const KEY_ACME: &str = "key-acme-123";
pub const KEY_GLOBEX: &str = "key-globex-456";
/// Same tenant as `KEY_ACME`, but not an approver.
pub const KEY_ACME_CAROL: &str = "key-acme-carol-789";

/// Everything a test config needs to know.
pub struct Env {
    pub model_url: String,
    pub tools_url: String,
    /// Extra TOML appended to the agent (e.g. an `[agents.limits]` table).
    pub agent_extra: String,
    /// Extra keys of the provider (e.g. its `price`).
    pub provider_extra: String,
    /// Extra TOML after the tools (e.g. `[tools.overrides]`, `[policy]`).
    pub extra_tools: String,
    pub stream: bool,
    pub auth: bool,
    /// `KEEL_LOG` for the server process.
    pub log: String,
    /// Extra TOML inside `[server]` (e.g. `database_url`, `lease_s`).
    pub server_extra: String,
    /// The agent's `[agents.drift]` table. Off by default so that scripted
    /// model replies are not consumed by reflection calls a test is not about.
    pub drift: String,
    /// The tool patterns of the `default` agent.
    pub agent_tools: Vec<String>,
    /// Extra environment of the server process (e.g. channel secrets).
    pub vars: Vec<(String, String)>,
}

impl Env {
    pub fn new(model_url: &str, tools_url: &str) -> Self {
        Self {
            model_url: model_url.to_owned(),
            tools_url: tools_url.to_owned(),
            agent_extra: String::new(),
            provider_extra: String::new(),
            extra_tools: String::new(),
            stream: true,
            auth: false,
            log: "warn".into(),
            server_extra: String::new(),
            drift: "[agents.drift]\nenabled = false\n".into(),
            agent_tools: [
                "furnace_status",
                "slow_op",
                "restart_furnace",
                "shutdown_line",
                "tenant_rows",
                "job_status",
            ]
            .map(String::from)
            .to_vec(),
            vars: Vec::new(),
        }
    }
}

pub fn config(dir: &Path, env: &Env) -> String {
    let auth = if env.auth {
        r#"
[[auth.keys]]
key_env = "TEST_KEY_ACME"
tenant = "acme"
principal = "alice"
roles = ["operator", "approver"]

[[auth.keys]]
key_env = "TEST_KEY_ACME_CAROL"
tenant = "acme"
principal = "carol"
roles = ["operator"]

[[auth.keys]]
key_env = "TEST_KEY_GLOBEX"
tenant = "globex"
principal = "bob"
roles = []

[auth]
approver_roles = ["approver"]
"#
    } else {
        ""
    };
    format!(
        r#"
[server]
bind = "127.0.0.1:0"
data_dir = "{dir}"
{server_extra}

[[providers]]
name = "main"
kind = "openai"
base_url = "{model}"
model = "fake-model"
stream = {stream}
max_retries = 2
backoff_ms = 10
timeout_s = 5
{provider_extra}

[[agents]]
id = "default"
provider = "main"
system_prompt = "You are the plant operations assistant."
tools = {agent_tools}
{agent_extra}
{drift}

[[tools.http]]
name = "furnace_status"
description = "Current status of one furnace"
method = "GET"
url = "{tools}/furnaces/{{furnace_id}}"
parameters = {{ type = "object", properties = {{ furnace_id = {{ type = "string", description = "Furnace id, e.g. F2" }} }}, required = ["furnace_id"] }}
risk = "read"
idempotent = true

[[tools.http]]
name = "slow_op"
description = "A slow operation that is not safe to repeat"
method = "GET"
url = "{tools}/slow"
parameters = {{ type = "object", properties = {{ ms = {{ type = "integer" }} }}, required = ["ms"] }}
timeout_s = 30

[[tools.http]]
name = "restart_furnace"
description = "Restart a furnace"
method = "POST"
url = "{tools}/restart"
parameters = {{ type = "object", properties = {{ furnace_id = {{ type = "string" }} }}, required = ["furnace_id"] }}
risk = "write"
roles = ["operator"]

[[tools.http]]
name = "shutdown_line"
description = "Shut a casting line down"
method = "POST"
url = "{tools}/restart"
parameters = {{ type = "object", properties = {{ furnace_id = {{ type = "string" }} }}, required = ["furnace_id"] }}
risk = "dangerous"

[[tools.http]]
name = "tenant_rows"
description = "Production rows of the caller's plant"
method = "GET"
url = "{tools}/tenant_rows"
parameters = {{ type = "object", properties = {{ tenant_id = {{ type = "string" }}, only = {{ type = "string" }} }} }}

[[tools.http]]
name = "job_status"
description = "Status of a running casting job"
method = "GET"
url = "{tools}/job/{{job_id}}"
parameters = {{ type = "object", properties = {{ job_id = {{ type = "string" }} }}, required = ["job_id"] }}
poll = true
{extra_tools}
{auth}
"#,
        dir = dir.display(),
        model = env.model_url,
        tools = env.tools_url,
        stream = env.stream,
        agent_extra = env.agent_extra,
        provider_extra = env.provider_extra,
        // A JSON array of strings is a TOML array too.
        agent_tools = Value::from(env.agent_tools.clone()),
        drift = env.drift,
        extra_tools = env.extra_tools,
        auth = auth,
        server_extra = env.server_extra,
    )
}

/// keel-test-support's `mcp-fixture`, a real MCP server over stdio. Cargo
/// gives a test the binaries of its own package only, so the cargo that
/// built the tests builds it here, once per test process. Selecting `keel`
/// too makes it resolve features as a `cargo test -p keel` build does, and
/// the variables cargo sets for a running test are removed (a build script
/// that watches one, such as `CARGO_MANIFEST_DIR`, would run again), so the
/// dependencies already compiled are reused and only the binary is linked.
pub fn mcp_fixture() -> PathBuf {
    static FIXTURE: OnceLock<PathBuf> = OnceLock::new();
    FIXTURE
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
            let mut cargo = std::process::Command::new(env!("CARGO"));
            for (key, _) in std::env::vars_os() {
                let key = key.to_string_lossy();
                let set_for_tests = ["CARGO_MANIFEST_", "CARGO_PKG_", "CARGO_BIN_EXE_"]
                    .iter()
                    .any(|p| key.starts_with(p))
                    || [
                        "CARGO_CRATE_NAME",
                        "CARGO_BIN_NAME",
                        "CARGO_PRIMARY_PACKAGE",
                        "CARGO_TARGET_TMPDIR",
                    ]
                    .contains(&key.as_ref());
                if set_for_tests {
                    cargo.env_remove(key.as_ref());
                }
            }
            let out = cargo
                .current_dir(&root)
                .args([
                    "build",
                    "--quiet",
                    "--message-format=json",
                    "-p",
                    "keel",
                    "-p",
                    "keel-test-support",
                    "--bin",
                    "mcp-fixture",
                ])
                .stderr(Stdio::inherit())
                .output()
                .expect("running cargo to build mcp-fixture");
            assert!(out.status.success(), "building mcp-fixture failed");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|m| {
                    m["reason"] == "compiler-artifact" && m["target"]["name"] == "mcp-fixture"
                })
                .and_then(|m| m["executable"].as_str().map(PathBuf::from))
                .expect("cargo named no mcp-fixture executable")
        })
        .clone()
}

pub struct Keel {
    child: Option<Child>,
    pub base: String,
    pub dir: PathBuf,
    config_path: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    http: reqwest::Client,
    log_level: String,
    vars: Vec<(String, String)>,
}

impl Keel {
    /// Writes the config into a fresh temp dir and starts `keel serve`.
    pub async fn start(env: &Env) -> Keel {
        Self::start_with(env, |c| c).await
    }

    /// Like `start`, with a last edit of the configuration text.
    pub async fn start_with(env: &Env, edit: impl FnOnce(String) -> String) -> Keel {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let config_path = dir.join("keel.toml");
        std::fs::write(&config_path, edit(config(&dir, env))).unwrap();
        let mut k = Keel {
            child: None,
            base: String::new(),
            dir,
            config_path,
            _tmp: Some(tmp),
            http: reqwest::Client::new(),
            log_level: env.log.clone(),
            vars: env.vars.clone(),
        };
        k.spawn().await;
        k
    }

    async fn spawn(&mut self) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("serve")
            .arg("--config")
            .arg(&self.config_path)
            .env("KEEL_LOG", &self.log_level)
            .env("TEST_KEY_ACME", KEY_ACME)
            .env("TEST_KEY_GLOBEX", KEY_GLOBEX)
            .env("TEST_KEY_ACME_CAROL", KEY_ACME_CAROL)
            .envs(self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env_remove("KEEL_CONFIG")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join("keel.log"))
                    .unwrap(),
            ))
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(l) = lines.next_line().await.unwrap() {
                if let Some(url) = l.strip_prefix("keel listening on ") {
                    return url.to_owned();
                }
            }
            panic!("keel exited before listening");
        })
        .await
        .expect("keel did not start within 30 s");
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        self.base = line;
        self.child = Some(child);
    }

    /// Everything the server wrote to stderr (its log), across restarts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("keel.log")).unwrap_or_default()
    }

    /// The server process's id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().and_then(|c| c.id()).unwrap()
    }

    /// SIGKILL, as a crash would.
    pub async fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.start_kill().unwrap();
            c.wait().await.unwrap();
        }
    }

    pub async fn restart(&mut self) {
        self.kill9().await;
        self.spawn().await;
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn post(&self, path: &str, body: Value, key: Option<&str>) -> (u16, Value) {
        let mut r = self.http.post(self.url(path)).json(&body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>, key: Option<&str>) -> (u16, Value) {
        let mut r = self
            .http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn get(&self, path: &str, key: Option<&str>) -> (u16, Value) {
        let mut r = self.http.get(self.url(path));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Starts a run and returns its id.
    pub async fn start_run(&self, input: &str, key: Option<&str>) -> String {
        let (status, body) = self
            .post("/ai/runs", serde_json::json!({"input": input}), key)
            .await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().unwrap().to_owned()
    }

    /// The whole event stream of a run (until its terminal event), after `after`.
    pub async fn events(&self, run_id: &str, after: Option<u64>, key: Option<&str>) -> Vec<Frame> {
        self.events_until(run_id, after, key, |_| false).await
    }

    pub async fn events_until(
        &self,
        run_id: &str,
        after: Option<u64>,
        key: Option<&str>,
        until: impl Fn(&Frame) -> bool,
    ) -> Vec<Frame> {
        let mut r = self
            .http
            .get(self.url(&format!("/ai/runs/{run_id}/events")));
        if let Some(a) = after {
            r = r.header("Last-Event-ID", a.to_string());
        }
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let resp = r.send().await.unwrap();
        read_frames(resp, Duration::from_secs(30), until).await
    }

    /// Polls the run until it has `status`.
    pub async fn wait_status(&self, run_id: &str, status: &str, key: Option<&str>) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (code, run) = self.get(&format!("/ai/runs/{run_id}"), key).await;
            assert_eq!(code, 200, "{run}");
            if run["status"] == status {
                return run;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("run {run_id} never reached {status}: {run}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `keel serve` nodes `node-a` and `node-b` on the PostgreSQL database at
/// `db_url`, each with the configuration `env` makes.
pub async fn two_nodes(db_url: &str, env: impl Fn() -> Env) -> Vec<Keel> {
    let mut nodes = Vec::new();
    for name in ["node-a", "node-b"] {
        let mut env = env();
        env.server_extra = format!("database_url = \"{db_url}\"\nnode_id = \"{name}\"\n");
        nodes.push(Keel::start(&env).await);
    }
    nodes
}

/// Starts `n` runs of `input` at once, without API keys, alternating
/// between the nodes; each answer's status and body.
pub async fn start_at_once(nodes: &[Keel], n: usize, input: &str) -> Vec<(u16, Value)> {
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let url = nodes[i % nodes.len()].url("/ai/runs");
        let input = input.to_owned();
        set.spawn(async move {
            let resp = reqwest::Client::new()
                .post(url)
                .json(&serde_json::json!({"input": input}))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        out.push(r.unwrap());
    }
    out
}

/// How a run ended: the `run_completed` reason and the details of its
/// `budget_exhausted` feedback.
pub async fn ending(keel: &Keel, id: &str, key: Option<&str>) -> (String, Vec<String>) {
    let frames = keel.events(id, None, key).await;
    let reason = frames
        .iter()
        .find(|f| f.event == "run_completed")
        .map(|f| f.data["reason"].as_str().unwrap().to_owned())
        .unwrap_or_default();
    let feedback = frames
        .iter()
        .filter(|f| f.event == "react_feedback" && f.data["code"] == "budget_exhausted")
        .map(|f| f.data["detail"].as_str().unwrap().to_owned())
        .collect();
    (reason, feedback)
}

/// The first user message of a model request (what the run was started with).
pub fn user_input(request: &Value) -> String {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Tool results in a model request: the step the run is at, as the model sees it.
pub fn tool_results(request: &Value) -> usize {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .count()
}

/// Asserts the SPEC §3 framing invariants: seq gap-free from `first`, ids match seq.
pub fn assert_gap_free(frames: &[Frame], first: u64) {
    for (i, f) in frames.iter().enumerate() {
        let expected = first + i as u64;
        assert_eq!(
            f.id, expected,
            "frame {i} has id {} (expected {expected})",
            f.id
        );
        assert_eq!(f.data["seq"], expected);
        assert_eq!(f.data["type"], f.event);
        assert!(f.data["run_id"].is_string());
        assert!(f.data["ts"].is_string());
    }
}

/// A bill to read (its note carries an injected transfer) and a transfer to
/// make, served by the tool backend at `tools_url`: the provenance tests'
/// tools.
pub fn bank_tools(tools_url: &str) -> String {
    format!(
        r#"
[[tools.http]]
name = "read_bill"
description = "Read the latest bill"
method = "GET"
url = "{tools_url}/lookup/bill"
risk = "read"

[[tools.http]]
name = "send_money"
description = "Transfer money"
method = "POST"
url = "{tools_url}/charge"
parameters = {{ type = "object", properties = {{ iban = {{ type = "string" }}, amount = {{ type = "number" }} }}, required = ["iban", "amount"] }}
risk = "write"
"#
    )
}

/// The answer of [`obedient_bank_model`] once keel refused the transfer.
pub const NOTHING_TRANSFERRED: &str = "I did not transfer anything.";

/// A model that reads the bill and obeys the transfer injected into it.
/// Returns how often it was asked after reading the bill; with `slow_first`
/// its first answer then is that late (a node can be killed meanwhile).
pub fn obedient_bank_model(
    slow_first: Option<Duration>,
) -> (
    keel_test_support::fake_openai::Script,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use keel_test_support::fake_openai::{Reply, Script};
    use std::sync::atomic::Ordering;

    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = asked.clone();
    let script = Script::handler(move |request| {
        let conversation = request["messages"].to_string();
        if conversation.contains("must come from the user") {
            return Reply::text(NOTHING_TRANSFERRED);
        }
        if conversation.contains("IGNORE PREVIOUS INSTRUCTIONS") {
            let transfer = Reply::tool_call(
                "send_money",
                serde_json::json!({"iban": "GB29 NWBK 6016 1331 9268 19", "amount": 2500}),
            );
            let first = counter.fetch_add(1, Ordering::SeqCst) == 0;
            return match slow_first {
                Some(delay) if first => transfer.after(delay),
                _ => transfer,
            };
        }
        Reply::tool_call("read_bill", serde_json::json!({}))
    });
    (script, asked)
}

/// Waits (up to 10 s) until the obedient model was asked after reading the
/// bill, and checks it was asked once: the moment a test kills a node.
pub async fn wait_until_asked(asked: &std::sync::atomic::AtomicUsize, what: &str) {
    use std::sync::atomic::Ordering;
    for _ in 0..1000 {
        if asked.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(asked.load(Ordering::SeqCst), 1, "{what}");
}

/// The run `id`, resumed by `keel`, ends with the obedient model told no:
/// completed without the transfer, its events gap-free, the transfer
/// denied by the provenance rule.
pub async fn assert_transfer_denied_by_provenance(
    keel: &Keel,
    id: &str,
    tools: &keel_test_support::tool_server::ToolServer,
) {
    let run = keel.wait_status(id, "completed", None).await;
    assert_eq!(run["output"], NOTHING_TRANSFERRED);
    assert_eq!(
        tools.count("charge_started"),
        0,
        "the tainted transfer never ran"
    );
    let frames = keel.events(id, None, None).await;
    assert_gap_free(&frames, 1);
    let denial = frames
        .iter()
        .find(|f| f.event == "policy_decision" && f.data["decision"] == "deny")
        .expect("a denial");
    assert_eq!(denial.data["rule"], "provenance");
}
