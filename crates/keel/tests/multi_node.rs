//! Three `keel serve` nodes on one PostgreSQL database (SPEC §10): any node
//! accepts runs, streams any run and decides any approval; a node killed
//! with -9 loses its runs to the others, which resume them from their last
//! persisted step without running a non-idempotent call twice.
//!
//! Each test creates its own database on the local server
//! (`KEEL_TEST_PG_URL`, an admin URL, default
//! `postgres://postgres@127.0.0.1:5432/postgres`) and drops it afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::{
    Env, Keel, assert_gap_free, assert_transfer_denied_by_provenance, bank_tools,
    obedient_bank_model, tool_results, user_input, wait_until_asked,
};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tcp_proxy::TcpProxy;
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};
use sqlx::Connection;
use sqlx::postgres::PgConnection;

/// Short, so that a takeover happens within seconds.
const LEASE_S: u64 = 5;

const TERMINAL: [&str; 3] = ["completed", "failed", "cancelled"];

use keel_test_support::pg::TestDb;

/// The node config: the shared database, a short lease, and an agent
/// `multi` with a non-idempotent `charge` tool (each execution is counted
/// by the tool server under its `key`).
fn env(model: &FakeOpenAi, tools: &ToolServer, db: &TestDb, node: &str) -> Env {
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.server_extra = format!(
        "database_url = \"{}\"\nnode_id = \"{node}\"\nlease_s = {LEASE_S}\n",
        db.url
    );
    env.extra_tools = format!(
        r#"
[[tools.http]]
name = "charge"
description = "Charge an account; not safe to repeat"
method = "POST"
url = "{tools}/charge"
parameters = {{ type = "object", properties = {{ key = {{ type = "string" }}, ms = {{ type = "integer" }} }}, required = ["key", "ms"] }}
headers = {{ "x-keel-node" = "{node}" }}
risk = "write"
timeout_s = 30

[[agents]]
id = "multi"
provider = "main"
system_prompt = "You run jobs."
tools = ["charge", "furnace_status", "shutdown_line"]
"#,
        tools = tools.base_url()
    );
    env.log = "warn,keel_core::cluster=info".into();
    env
}

async fn start_nodes(model: &FakeOpenAi, tools: &ToolServer, db: &TestDb) -> Vec<Keel> {
    let mut nodes = Vec::new();
    for name in ["node-a", "node-b", "node-c"] {
        nodes.push(Keel::start(&env(model, tools, db, name)).await);
    }
    nodes
}

async fn start_run(node: &Keel, input: &str) -> String {
    let (status, body) = node
        .post("/ai/runs", json!({"input": input, "agent": "multi"}), None)
        .await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().unwrap().to_owned()
}

/// Starts jobs `jobs` concurrently, job N on node `node(N)`; returns
/// (run id, job, node) for each.
async fn start_many(
    bases: &[String],
    jobs: std::ops::Range<usize>,
    node: impl Fn(usize) -> usize,
) -> Vec<(String, usize, usize)> {
    let http = reqwest::Client::new();
    let mut set = tokio::task::JoinSet::new();
    for n in jobs {
        let at = node(n);
        let url = format!("{}/ai/runs", bases[at]);
        let http = http.clone();
        set.spawn(async move {
            let resp = http
                .post(url)
                .json(&json!({"input": format!("job {n}"), "agent": "multi"}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 201);
            let body: Value = resp.json().await.unwrap();
            (body["id"].as_str().unwrap().to_owned(), n, at)
        });
    }
    let mut runs = Vec::new();
    while let Some(r) = set.join_next().await {
        runs.push(r.unwrap());
    }
    runs
}

/// Text without ANSI colour sequences.
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Run ids a node's log says it took over.
fn taken_over(node: &Keel) -> HashSet<String> {
    plain(&node.log())
        .lines()
        .filter(|l| l.contains("took over run"))
        .filter_map(|l| {
            let start = l.find("run=")? + 4;
            let id: String = l[start..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            Some(id)
        })
        .collect()
}

/// What happens to node A while it executes runs with non-idempotent calls
/// in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// SIGKILL: the node is gone.
    Kill,
    /// SIGSTOP for longer than the lease, then SIGCONT: the node wakes up
    /// believing it still executes runs the others took over.
    Pause,
    /// The node's connection to PostgreSQL goes silent for longer than the
    /// lease (a partition), then comes back.
    Cut,
}

/// How long a paused or cut-off node stays so: well past its lease, so
/// that the other nodes take its runs over meanwhile.
const OUTAGE: Duration = Duration::from_secs(LEASE_S + 4);

/// `url` with its host and port replaced by `addr` (the database URL as
/// seen through a proxy).
fn via(url: &str, addr: std::net::SocketAddr) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[start..];
    let end = rest.find('/').unwrap_or(rest.len());
    let userinfo = rest[..end].rfind('@').map_or(0, |i| i + 1);
    format!(
        "{}{}{addr}{}",
        &url[..start],
        &rest[..userinfo],
        &rest[end..]
    )
}

/// The socket address of the database server in `url`.
async fn server_of(url: &str) -> std::net::SocketAddr {
    let start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[start..];
    let end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[rest[..end].rfind('@').map_or(0, |i| i + 1)..end];
    let authority = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:5432")
    };
    tokio::net::lookup_host(authority)
        .await
        .unwrap()
        .next()
        .unwrap()
}

fn signal(node: &Keel, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(node.pid().to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} failed");
}

/// What a node logs when it stops acting for a run it lost: its commit was
/// refused, its renewal did not keep the run, its fence before a tool call
/// found the run gone, or the database ended its stalled transaction.
const LET_GO: [&str; 4] = [
    "taken over by another node",
    "lease not renewed",
    "lost the run's lease",
    "the store failed",
];

/// Whether `log` has a line in which the node says it stopped acting for `run`.
fn says_it_let_go(log: &str, run: &str) -> bool {
    log.lines()
        .any(|l| l.contains(run) && LET_GO.iter().any(|m| l.contains(m)))
}

/// 200 runs on three nodes; node A suffers `fault` while several of its
/// non-idempotent calls execute. Every run must end exactly once, with a
/// gap-free event log, and no non-idempotent call may execute twice. A
/// node that comes back (pause, cut) must commit nothing and start no tool
/// call for the runs it lost, and say so in its log.
async fn node_a_fails(fault: Fault) {
    const RUNS: usize = 200;
    // Job N: one or two calls of the non-idempotent `charge` (with latency),
    // or a charge then an idempotent status read; then the answer.
    let model = FakeOpenAi::start(Script::handler(|req| {
        let input = user_input(req);
        let n: usize = input
            .strip_prefix("job ")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let delay = Duration::from_millis(50 + (n % 4) as u64 * 25);
        match tool_results(req) {
            0 => Reply::tool_call(
                "charge",
                json!({"key": format!("job-{n}-a"), "ms": 1000 + (n % 5) * 200}),
            )
            .after(delay),
            1 if n.is_multiple_of(2) => Reply::tool_call(
                "charge",
                json!({"key": format!("job-{n}-b"), "ms": 800 + (n % 3) * 200}),
            )
            .after(delay),
            1 => Reply::tool_call(
                "furnace_status",
                json!({"furnace_id": format!("F{}", n % 9)}),
            )
            .after(delay),
            _ => Reply::text(format!("done job {n}")).after(delay),
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let db = TestDb::create().await;
    let proxy = match fault {
        Fault::Cut => Some(TcpProxy::start(server_of(&db.url).await).await),
        _ => None,
    };
    let mut nodes = Vec::new();
    for name in ["node-a", "node-b", "node-c"] {
        let mut env = env(&model, &tools, &db, name);
        if let (Some(proxy), "node-a") = (&proxy, name) {
            env.server_extra = env
                .server_extra
                .replace(&db.url, &via(&db.url, proxy.addr()));
        }
        nodes.push(Keel::start(&env).await);
    }

    // Half the runs spread over the three nodes, all at once; node A fails
    // while its runs are in flight; the other half goes to B and C.
    let began = Instant::now();
    let bases: Vec<String> = nodes.iter().map(|n| n.base.clone()).collect();
    let mut runs = start_many(&bases, 0..RUNS / 2, |n| n % 3).await;
    // Fail A while several of its non-idempotent calls are executing, and
    // none has been sent for a moment: a node stopped in the instant
    // between its last lease check and a request leaving the process sends
    // that request when it wakes (docs/multi-node.md says so); the
    // guarantee tested here is that it decides on no new call once awake.
    let wait_for_calls = Instant::now() + Duration::from_secs(20);
    let (mut sent_by_a, mut quiet_since) = (0, Instant::now());
    loop {
        let calls = tools.calls();
        let keys = |route: &str| -> HashSet<String> {
            calls
                .iter()
                .filter(|(r, a)| r == route && (route == "charge" || a["node"] == "node-a"))
                .filter_map(|(_, a)| a["key"].as_str().map(str::to_owned))
                .collect()
        };
        let started = keys("charge_started");
        if started.len() != sent_by_a {
            (sent_by_a, quiet_since) = (started.len(), Instant::now());
        }
        let in_flight = started.difference(&keys("charge")).count();
        let quiet = quiet_since.elapsed() >= Duration::from_millis(200);
        if (in_flight >= 8 && quiet) || Instant::now() > wait_for_calls {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    match fault {
        Fault::Kill => nodes[0].kill9().await,
        Fault::Pause => signal(&nodes[0], "STOP"),
        Fault::Cut => proxy.as_ref().unwrap().cut(),
    }
    let failed_at = Instant::now();
    // The survivors' logs, watched closely: when did they take runs over?
    let logs: Vec<std::path::PathBuf> = nodes[1..].iter().map(|n| n.dir.join("keel.log")).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let watcher = tokio::spawn(async move {
        let (mut first, mut last, mut seen) = (None, None, 0);
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            let n: usize = logs
                .iter()
                .map(|p| {
                    plain(&std::fs::read_to_string(p).unwrap_or_default())
                        .matches("took over run")
                        .count()
                })
                .sum();
            if n > seen {
                first.get_or_insert(failed_at.elapsed());
                last = Some(failed_at.elapsed());
                seen = n;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        (first, last)
    });
    runs.extend(start_many(&bases, RUNS / 2..RUNS, |n| 1 + n % 2).await);
    let on_a: Vec<&String> = runs
        .iter()
        .filter(|(_, _, node)| *node == 0)
        .map(|(id, _, _)| id)
        .collect();

    // Which of node A's runs were left unfinished by the fault.
    let survivor = &nodes[1];
    let mut orphaned = HashSet::new();
    for id in &on_a {
        let (code, run) = survivor.get(&format!("/ai/runs/{id}"), None).await;
        assert_eq!(code, 200, "{run}");
        if !TERMINAL.contains(&run["status"].as_str().unwrap()) {
            orphaned.insert((*id).clone());
        }
    }
    println!(
        "multi-node {fault:?}: node A failed {:.2}s after the first run, with {} of its {} runs unfinished",
        (failed_at - began).as_secs_f64(),
        orphaned.len(),
        on_a.len()
    );

    // A paused or cut-off node comes back once the others took over.
    let mut woke = None;
    if fault != Fault::Kill {
        tokio::time::sleep(OUTAGE.saturating_sub(failed_at.elapsed())).await;
        woke = Some(tools.calls().len());
        match fault {
            Fault::Pause => signal(&nodes[0], "CONT"),
            _ => proxy.as_ref().unwrap().restore(),
        }
    }

    // Wait for every run to end, watching the survivors take over.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut statuses: HashMap<String, String> = HashMap::new();
    loop {
        for (id, _, _) in &runs {
            if statuses
                .get(id)
                .is_some_and(|s| TERMINAL.contains(&s.as_str()))
            {
                continue;
            }
            let (code, run) = survivor.get(&format!("/ai/runs/{id}"), None).await;
            assert_eq!(code, 200, "{run}");
            statuses.insert(id.clone(), run["status"].as_str().unwrap().to_owned());
        }
        let open = statuses
            .values()
            .filter(|s| !TERMINAL.contains(&s.as_str()))
            .count();
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} runs never ended: {:?}",
            statuses
                .iter()
                .filter(|(_, s)| !TERMINAL.contains(&s.as_str()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all_done = began.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (first_takeover, last_takeover) = watcher.await.unwrap();

    // Every orphaned run was taken over by a survivor.
    let taken: HashSet<String> = nodes[1..].iter().flat_map(taken_over).collect();
    for id in &orphaned {
        assert!(
            taken.contains(id),
            "run {id} of the failed node was never taken over"
        );
    }

    // Every event log, read through a surviving node: gap-free, no
    // duplicate, one start, one end; no charge call started twice.
    let mut unknown_outcomes = 0;
    let mut completed = 0;
    let mut events = 0;
    for (i, (id, n, _)) in runs.iter().enumerate() {
        let reader = &nodes[1 + i % 2];
        let frames = reader.events(id, None, None).await;
        assert_gap_free(&frames, 1);
        events += frames.len();
        let seqs: HashSet<u64> = frames.iter().map(|f| f.id).collect();
        assert_eq!(seqs.len(), frames.len(), "run {id}: duplicate seq");
        assert_eq!(
            frames.iter().filter(|f| f.event == "run_started").count(),
            1,
            "run {id}"
        );
        let last = frames.last().unwrap();
        assert!(
            ["run_completed", "run_failed", "run_cancelled"].contains(&last.event.as_str()),
            "run {id} ends with {}",
            last.event
        );
        let terminal_events = frames
            .iter()
            .filter(|f| f.event.starts_with("run_") && f.event != "run_started")
            .count();
        assert_eq!(terminal_events, 1, "run {id}");
        let mut charge_calls: HashMap<String, usize> = HashMap::new();
        for f in frames.iter().filter(|f| f.event == "tool_call") {
            if f.data["tool"] == "charge" {
                *charge_calls
                    .entry(f.data["call_id"].as_str().unwrap().to_owned())
                    .or_default() += 1;
            }
        }
        assert!(
            charge_calls.values().all(|&c| c == 1),
            "run {id}: a charge call started twice: {charge_calls:?}"
        );
        unknown_outcomes += frames
            .iter()
            .filter(|f| {
                f.event == "tool_result"
                    && f.data["error"]
                        .as_str()
                        .is_some_and(|e| e.contains("outcome") && e.contains("unknown"))
            })
            .count();
        if last.event == "run_completed" {
            completed += 1;
            let (_, run) = reader.get(&format!("/ai/runs/{id}"), None).await;
            assert_eq!(run["output"], format!("done job {n}"), "run {id}");
        }
    }
    let calls = tools.calls();
    let mut executions: HashMap<String, usize> = HashMap::new();
    for (route, args) in &calls {
        if route == "charge_started" {
            *executions
                .entry(args["key"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    let twice: Vec<_> = executions.iter().filter(|(_, c)| **c > 1).collect();
    assert!(
        twice.is_empty(),
        "non-idempotent calls executed twice: {twice:?}"
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
    assert!(
        !orphaned.is_empty(),
        "the fault should have interrupted runs"
    );
    assert!(
        unknown_outcomes > 0,
        "the fault should have interrupted non-idempotent calls, whose outcome the model is told is unknown"
    );
    assert_eq!(completed, RUNS, "every run answers");

    // The node that came back let go of every run it lost, said so, and
    // started no call for any of them once awake.
    let mut late_starts = 0;
    if let Some(woke) = woke {
        let job_of: HashMap<&str, usize> =
            runs.iter().map(|(id, n, _)| (id.as_str(), *n)).collect();
        let lost: Vec<&String> = on_a
            .iter()
            .copied()
            .filter(|id| taken.contains(*id))
            .collect();
        assert!(!lost.is_empty(), "node A should have lost runs");
        let log = plain(&nodes[0].log());
        for id in &lost {
            assert!(
                says_it_let_go(&log, id),
                "node A's log never says it let go of run {id}"
            );
            let n = job_of[id.as_str()];
            let keys = [format!("job-{n}-a"), format!("job-{n}-b")];
            late_starts += calls[woke..]
                .iter()
                .filter(|(r, a)| {
                    r == "charge_started"
                        && a["node"] == "node-a"
                        && keys.iter().any(|k| a["key"] == k.as_str())
                })
                .count();
        }
        assert_eq!(late_starts, 0, "node A started calls for runs it had lost");
        let said: Vec<String> = LET_GO
            .iter()
            .map(|m| format!("{m:?}: {}", log.lines().filter(|l| l.contains(m)).count()))
            .collect();
        println!(
            "multi-node {fault:?}: node A lost {} runs; its log: {}",
            lost.len(),
            said.join(", ")
        );
    }

    println!(
        "multi-node {fault:?}: runs={RUNS} on_failed_node={} orphaned={} takeovers={} \
         first_takeover_after_fault={:.2}s last_takeover_after_fault={:.2}s \
         events={events} lost_runs={} duplicate_events=0 unknown_outcome_results={unknown_outcomes} \
         charge_calls={} max_executions_per_call={} calls_started_after_waking_for_lost_runs={late_starts} \
         all_done_in={:.1}s (lease {LEASE_S}s, outage {}s)",
        on_a.len(),
        orphaned.len(),
        taken.len(),
        first_takeover.unwrap_or_default().as_secs_f64(),
        last_takeover.unwrap_or_default().as_secs_f64(),
        RUNS - completed,
        executions.len(),
        executions.values().max().copied().unwrap_or(0),
        all_done.as_secs_f64(),
        if fault == Fault::Kill {
            0
        } else {
            OUTAGE.as_secs()
        },
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_one_killed_every_run_finishes_once() {
    node_a_fails(Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_one_paused_past_its_lease_wakes_and_lets_go() {
    node_a_fails(Fault::Pause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_one_cut_off_from_the_database_past_its_lease() {
    node_a_fails(Fault::Cut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follow_on_b_approve_on_c_while_the_run_lives_on_a() {
    let model = FakeOpenAi::start(Script::handler(|req| {
        match (user_input(req).as_str(), tool_results(req)) {
            ("shut F2 down", 0) => {
                Reply::tool_call("charge", json!({"key": "before-shutdown", "ms": 300}))
            }
            ("shut F2 down", 1) => Reply::tool_call("shutdown_line", json!({"furnace_id": "F2"})),
            ("shut F2 down", _) => Reply::text("Line F2 is shut down."),
            // A call without its required argument: the run asks the user.
            ("status?", 0) => Reply::tool_call("furnace_status", json!({})),
            ("status?", _) => Reply::text("F4 is running."),
            ("wait for me", 0) => Reply::tool_call("furnace_status", json!({})),
            _ => Reply::text("ok"),
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let db = TestDb::create().await;
    let nodes = start_nodes(&model, &tools, &db).await;
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);

    let id = start_run(a, "shut F2 down").await;
    // A client on node B follows the run from its first event.
    let follower = {
        let base = b.base.clone();
        let id = id.clone();
        tokio::spawn(async move {
            let resp = reqwest::Client::new()
                .get(format!("{base}/ai/runs/{id}/events"))
                .send()
                .await
                .unwrap();
            keel_test_support::sse::read_frames(resp, Duration::from_secs(60), |_| false).await
        })
    };
    let waiting = c.wait_status(&id, "waiting_approval", None).await;
    assert_eq!(waiting["pending"]["tool"], "shutdown_line");
    assert_eq!(tools.count("restart"), 0, "nothing runs before approval");
    let (code, list) = c.get("/ai/approvals?status=pending", None).await;
    assert_eq!(code, 200, "{list}");
    let approval = list["approvals"][0]["id"].as_str().unwrap().to_owned();
    let (code, decided) = c
        .post(
            &format!("/ai/approvals/{approval}"),
            json!({"decision": "approve", "reason": "planned"}),
            None,
        )
        .await;
    assert_eq!(code, 200, "{decided}");
    let run = b.wait_status(&id, "completed", None).await;
    assert_eq!(run["output"], "Line F2 is shut down.");
    assert_eq!(
        tools.count("restart"),
        1,
        "the approved call ran exactly once"
    );

    let frames = tokio::time::timeout(Duration::from_secs(30), follower)
        .await
        .unwrap()
        .unwrap();
    assert_gap_free(&frames, 1);
    let kinds: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    for kind in [
        "run_started",
        "tool_call",
        "approval_required",
        "approval_resolved",
        "final",
    ] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    assert_eq!(kinds.last(), Some(&"run_completed"), "{kinds:?}");
    // The run never moved: node A executed it from start to end.
    for node in &nodes {
        assert!(taken_over(node).is_empty(), "no takeover expected");
    }

    // A clarification answered on node C reaches the run on node A.
    let asking = start_run(a, "status?").await;
    b.wait_status(&asking, "waiting_input", None).await;
    let (code, body) = c
        .post(
            &format!("/ai/runs/{asking}/input"),
            json!({"text": "F4"}),
            None,
        )
        .await;
    assert_eq!(code, 202, "{body}");
    let run = b.wait_status(&asking, "completed", None).await;
    assert_eq!(run["output"], "F4 is running.");

    // A cancel posted on node B stops the run waiting on node A.
    let waiting = start_run(a, "wait for me").await;
    c.wait_status(&waiting, "waiting_input", None).await;
    let (code, body) = b
        .post(&format!("/ai/runs/{waiting}/cancel"), json!({}), None)
        .await;
    assert!(code == 202 || code == 200, "{code} {body}");
    c.wait_status(&waiting, "cancelled", None).await;
    let frames = c.events(&waiting, None, None).await;
    assert_gap_free(&frames, 1);
    assert_eq!(frames.last().unwrap().event, "run_cancelled");

    // Every node reports itself ready, under its own id.
    for (node, name) in nodes.iter().zip(["node-a", "node-b", "node-c"]) {
        let (code, ready) = node.get("/readyz", None).await;
        assert_eq!(code, 200, "{ready}");
        assert_eq!(ready["checks"]["store"], "ok");
        assert_eq!(ready["node"]["id"], name);
        assert_eq!(ready["node"]["owned_runs"], 0, "{ready}");
    }
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn keel_migrate_brings_a_fresh_database_to_the_current_schema() {
    let db = TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("keel.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndata_dir = \"{}\"\ndatabase_url = \"{}\"\n\n[[providers]]\nname = \"main\"\n\
             kind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\n\n\
             [[agents]]\nid = \"default\"\nprovider = \"main\"\n",
            dir.path().display(),
            db.url
        ),
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("migrate")
        .arg("--config")
        .arg(&config)
        .env("KEEL_LOG", "warn")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("schema version"), "{stdout}");
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns \
         WHERE table_name = 'runs' AND column_name IN ('owner', 'lease_until') ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(columns, ["lease_until", "owner"]);
    conn.close().await.unwrap();
}

#[tokio::test]
async fn another_node_taking_over_still_denies_a_tainted_call() {
    // The model reads a bill with an injected transfer and obeys it; its
    // first answer after the read is slow, and node A is killed meanwhile.
    let (script, asked) = obedient_bank_model(Some(Duration::from_secs(60)));
    let model = FakeOpenAi::start(script).await;
    let tools = ToolServer::start().await;
    let db = TestDb::create().await;
    let bank = |node: &str| {
        let mut env = env(&model, &tools, &db, node);
        env.extra_tools.push_str(&bank_tools(&tools.base_url()));
        env.extra_tools.push_str(
            r#"
[[agents]]
id = "bank"
provider = "main"
system_prompt = "You pay bills."
tools = ["read_bill", "send_money"]

[policy]
untrusted_arguments = "deny"
"#,
        );
        env
    };
    let mut a = Keel::start(&bank("node-a")).await;
    let b = Keel::start(&bank("node-b")).await;
    let (status, body) = a
        .post(
            "/ai/runs",
            json!({"input": "Pay my latest bill.", "agent": "bank"}),
            None,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_owned();
    wait_until_asked(&asked, "A waits for the model's answer").await;
    a.kill9().await;
    // B takes the run over once A's lease expires and resumes it.
    assert_transfer_denied_by_provenance(&b, &id, &tools).await;
    assert!(
        plain(&std::fs::read_to_string(b.dir.join("keel.log")).unwrap_or_default())
            .contains("took over run"),
        "node B took the run over"
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}
