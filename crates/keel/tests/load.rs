//! keel under load, through its HTTP API: thousands of runs submitted at
//! once, a thousand clients following one run, and hundreds of runs
//! streaming a megabyte each. Each test checks that nothing is lost (every
//! run ends with its answer, every subscriber sees every event once, in
//! order) and that other work still gets through meanwhile; it prints the
//! server's peak memory (`VmHWM`), which `docs/load.md` reports.
//!
//! Memory and speed are reported, not asserted: they are measurements of
//! the machine as much as of keel.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Env, Keel, assert_gap_free, tool_results, user_input};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::sse::read_frames;
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};

/// Peak and current resident memory of a process, in MiB.
fn memory_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Starts `inputs` through `base` with at most `parallel` requests at once;
/// returns the run ids in input order.
async fn submit(base: &str, inputs: Vec<String>, parallel: usize) -> Vec<String> {
    let http = reqwest::Client::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(parallel));
    let mut set = tokio::task::JoinSet::new();
    for (i, input) in inputs.into_iter().enumerate() {
        let http = http.clone();
        let url = format!("{base}/ai/runs");
        let gate = gate.clone();
        set.spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            let resp = http
                .post(url)
                .json(&json!({"input": input}))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap();
            assert_eq!(status, 201, "{body}");
            (i, body["id"].as_str().unwrap().to_owned())
        });
    }
    let mut ids = vec![String::new(); set.len()];
    while let Some(r) = set.join_next().await {
        let (i, id) = r.unwrap();
        ids[i] = id;
    }
    ids
}

/// Waits until every run has ended; returns the runs as last read.
async fn wait_all(keel: &Keel, ids: &[String], limit: Duration) -> Vec<Value> {
    let deadline = Instant::now() + limit;
    let mut done: Vec<Option<Value>> = vec![None; ids.len()];
    loop {
        let mut open = 0;
        for (i, id) in ids.iter().enumerate() {
            if done[i].is_some() {
                continue;
            }
            let (code, run) = keel.get(&format!("/ai/runs/{id}"), None).await;
            assert_eq!(code, 200, "{run}");
            if ["completed", "failed", "cancelled"].contains(&run["status"].as_str().unwrap()) {
                done[i] = Some(run);
            } else {
                open += 1;
            }
        }
        if open == 0 {
            return done.into_iter().map(Option::unwrap).collect();
        }
        assert!(Instant::now() < deadline, "{open} runs never ended");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Another run, started while the load runs, must still get its answer.
async fn probe_run(keel: &Keel) -> Value {
    let ids = submit(&keel.base, vec!["probe: status of F1".into()], 1).await;
    let run = wait_all(keel, &ids, Duration::from_secs(300))
        .await
        .remove(0);
    assert_eq!(run["status"], "completed", "{run}");
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_thousand_runs_submitted_at_once_all_answer() {
    const RUNS: usize = 5_000;
    let model = FakeOpenAi::start(Script::handler(|req| {
        let input = user_input(req);
        if input.starts_with("probe") {
            return Reply::text("probe answered");
        }
        // A short wait, as a real model has: runs pile up in flight.
        Reply::text(format!("answer to {input}")).after(Duration::from_millis(50))
    }))
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&Env::new(&model.base_url(), &tools.base_url())).await;
    let began = Instant::now();
    let inputs: Vec<String> = (0..RUNS).map(|n| format!("job {n}")).collect();
    let submitting = {
        let base = keel.base.clone();
        tokio::spawn(async move { submit(&base, inputs, 64).await })
    };
    // While thousands are queued: health and another run get through.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (code, _) = keel.get("/healthz", None).await;
    assert_eq!(code, 200);
    let probe = probe_run(&keel).await;
    let probe_done = began.elapsed();
    let ids = submitting.await.unwrap();
    let submitted = began.elapsed();
    let runs = wait_all(&keel, &ids, Duration::from_secs(600)).await;
    let all_done = began.elapsed();
    for (n, run) in runs.iter().enumerate() {
        assert_eq!(run["status"], "completed", "{run}");
        assert_eq!(run["output"], format!("answer to job {n}"), "{run}");
    }
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), RUNS);
    assert_eq!(probe["output"], "probe answered");
    let (peak, now) = memory_mib(keel.pid());
    println!(
        "load: runs={RUNS} submitted_in={:.1}s all_answered_in={:.1}s probe_answered_at={:.1}s \
         peak_rss_mib={peak:.0} rss_after_mib={now:.0}",
        submitted.as_secs_f64(),
        all_done.as_secs_f64(),
        probe_done.as_secs_f64(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_subscribers_of_one_run_each_see_every_event_once() {
    const SUBSCRIBERS: usize = 1_000;
    const TURNS: usize = 40;
    let model = FakeOpenAi::start(Script::handler(|req| {
        if user_input(req).starts_with("probe") {
            return Reply::text("probe answered");
        }
        let n = tool_results(req);
        if n < TURNS {
            Reply::tool_call(
                "furnace_status",
                json!({"furnace_id": format!("F{}", n % 9)}),
            )
            .with_text(format!("checking furnace {n}; "))
            .after(Duration::from_millis(25))
        } else {
            Reply::text("all furnaces checked").after(Duration::from_millis(25))
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    // Forty status reads of nine furnaces repeat calls on purpose.
    env.agent_extra = "[agents.limits]\nmax_steps = 60\nmax_tool_calls = 60\n\n[agents.loop_detection]\nenabled = false\n".into();
    let keel = Keel::start(&env).await;
    let began = Instant::now();
    let id = submit(&keel.base, vec!["check every furnace".into()], 1)
        .await
        .remove(0);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..SUBSCRIBERS {
        let http = http.clone();
        let url = keel.url(&format!("/ai/runs/{id}/events"));
        set.spawn(async move {
            let resp = http.get(url).send().await.unwrap();
            read_frames(resp, Duration::from_secs(300), |_| false).await
        });
    }
    let probe = probe_run(&keel).await;
    let mut streams = Vec::new();
    while let Some(r) = set.join_next().await {
        streams.push(r.unwrap());
    }
    let all_done = began.elapsed();
    let stored = keel.events(&id, None, None).await;
    assert_gap_free(&stored, 1);
    assert_eq!(stored.last().unwrap().event, "run_completed");
    let expected: Vec<u64> = stored.iter().map(|f| f.id).collect();
    for frames in &streams {
        let seen: Vec<u64> = frames.iter().map(|f| f.id).collect();
        assert_eq!(
            seen, expected,
            "a subscriber missed, repeated or reordered events"
        );
    }
    assert_eq!(probe["output"], "probe answered");
    let (peak, now) = memory_mib(keel.pid());
    println!(
        "load: subscribers={SUBSCRIBERS} events_each={} frames_delivered={} all_done_in={:.1}s \
         peak_rss_mib={peak:.0} rss_after_mib={now:.0}",
        expected.len(),
        expected.len() * SUBSCRIBERS,
        all_done.as_secs_f64(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_runs_each_streaming_a_megabyte() {
    const RUNS: usize = 200;
    // Three turns of text beside a tool call, then the answer: 4 × 256,000
    // bytes of deltas per run (an answer is capped at 256 KiB).
    const PIECE: usize = 256_000;
    const TURNS: usize = 3;
    let model = FakeOpenAi::start(Script::handler(|req| {
        let input = user_input(req);
        if input.starts_with("probe") {
            return Reply::text("probe answered");
        }
        let n = tool_results(req);
        let fill = |turn: usize| -> String {
            let line = format!("{input} turn {turn} ");
            line.repeat(PIECE / line.len() + 1)[..PIECE].to_owned()
        };
        if n < TURNS {
            Reply::tool_call("furnace_status", json!({"furnace_id": format!("F{n}")}))
                .with_text(fill(n))
        } else {
            Reply::text(fill(n))
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    // A megabyte of history is far past the default context window: the
    // load is the stream, not compaction (which would call the model more).
    env.agent_extra = "[agents.compaction]\nenabled = false\n".into();
    let keel = Keel::start(&env).await;
    let began = Instant::now();
    let inputs: Vec<String> = (0..RUNS).map(|n| format!("job{n:03}")).collect();
    let ids = submit(&keel.base, inputs, RUNS).await;
    let probe = probe_run(&keel).await;
    let probe_done = began.elapsed();
    let runs = wait_all(&keel, &ids, Duration::from_secs(600)).await;
    let all_done = began.elapsed();
    for (n, run) in runs.iter().enumerate() {
        assert_eq!(run["status"], "completed", "{run}");
        let output = run["output"].as_str().unwrap();
        assert_eq!(output.len(), PIECE, "run {n}");
        assert!(output.starts_with(&format!("job{n:03} turn {TURNS} ")));
    }
    // Every delta of a sample of runs, as a late follower replays them.
    let mut streamed = 0;
    for id in ids.iter().step_by(20) {
        let frames = keel.events(id, None, None).await;
        assert_gap_free(&frames, 1);
        let bytes: usize = frames
            .iter()
            .filter(|f| f.event == "message_delta")
            .map(|f| f.data["text"].as_str().unwrap().len())
            .sum();
        assert_eq!(bytes, PIECE * (TURNS + 1), "run {id}");
        streamed += bytes;
    }
    assert_eq!(probe["output"], "probe answered");
    let (peak, now) = memory_mib(keel.pid());
    println!(
        "load: runs={RUNS} delta_bytes_per_run={} probe_answered_at={:.1}s all_done_in={:.1}s \
         sampled_delta_bytes={streamed} peak_rss_mib={peak:.0} rss_after_mib={now:.0}",
        PIECE * (TURNS + 1),
        probe_done.as_secs_f64(),
        all_done.as_secs_f64(),
    );
}
