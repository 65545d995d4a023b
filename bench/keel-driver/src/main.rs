//! keel's driver for the shared side-by-side benchmark (the `ours` slot of
//! its run.sh; the harness lives beside the repo, `../shared/bench`).
//!
//! Starts a `lookup` tool backend and a `keel serve` pointed at the fake LLM,
//! then runs the bench workload through keel's HTTP API (seq or conc, the
//! same phases as bench_common.py) and prints one `RESULT {json}` line. CPU
//! and peak RSS are keel's (the framework is the server process here).

mod args;
mod backend;
mod client;
mod keel;
mod pg;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::args::{Opts, Wait};
use crate::client::Client;

fn main() -> ExitCode {
    let o = match args::parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    raise_fd_limit();
    // One thread, like raw-rust: the driver is the client, not what is measured.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("keel-driver: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(main_async(o)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keel-driver: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Thousands of concurrent runs need thousands of sockets, in the driver
/// and in keel (which inherits the limit).
fn raise_fd_limit() {
    // SAFETY: get/setrlimit on a struct we own.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("keel-bench-{}-{nanos:08x}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }
}

async fn main_async(o: Opts) -> Result<(), String> {
    let bin = keel::binary()?;
    let (tool_addr, lookups) = backend::start()
        .await
        .map_err(|e| format!("lookup backend: {e}"))?;
    let tmp = TempDir::new().map_err(|e| format!("temp dir: {e}"))?;
    let database = match &o.database_url {
        Some(admin) => Some(pg::Database::create(admin).await?),
        None => None,
    };
    let result = with_database(
        &o,
        &bin,
        tool_addr,
        &tmp,
        database.as_ref().map(|d| d.url.as_str()),
    )
    .await;
    if let Some(db) = database {
        db.drop_now().await;
    }
    if !o.keep {
        let _ = std::fs::remove_dir_all(&tmp.0);
    }
    let mut res = result?;
    res.insert("lookup_requests".into(), json!(lookups.get()));
    res.insert("keel_bin".into(), json!(bin.display().to_string()));
    println!("RESULT {}", Value::Object(res));
    Ok(())
}

/// Starts keel on its store, measures, stops it.
async fn with_database(
    o: &Opts,
    bin: &std::path::Path,
    tool_addr: std::net::SocketAddr,
    tmp: &TempDir,
    database_url: Option<&str>,
) -> Result<serde_json::Map<String, Value>, String> {
    let config_path = tmp.0.join("keel.toml");
    std::fs::write(
        &config_path,
        keel::config(&tmp.0.join("data"), database_url, &o.base_url, tool_addr),
    )
    .map_err(|e| format!("writing {}: {e}", config_path.display()))?;
    keel::check(bin, &config_path).await?;
    let server = keel::Server::start(bin, &config_path).await?;
    eprintln!(
        "keel-driver: keel {} pid {} on {} (lookup on {tool_addr}, data in {})",
        bin.display(),
        server.pid,
        server.url,
        tmp.0.display()
    );
    let client = Client::new(&server.url, o.wait, o.poll, o.fresh_conn)?;
    let outcome = bench(o, &client, server.pid).await;
    let peak_rss_kb = keel::status_kb(server.pid, "VmHWM");
    let end_rss_kb = keel::status_kb(server.pid, "VmRSS");
    let threads = keel::status_kb(server.pid, "Threads");
    server.stop().await;
    let Value::Object(mut obj) = outcome? else {
        return Err("result is not an object".into());
    };
    obj.insert("proc_peak_rss_kb".into(), json!(peak_rss_kb));
    obj.insert("proc_end_rss_kb".into(), json!(end_rss_kb));
    obj.insert("proc_threads".into(), json!(threads));
    obj.insert("llm_wire".into(), json!("json"));
    obj.insert(
        "store".into(),
        json!(if database_url.is_some() {
            "postgres"
        } else {
            "sqlite"
        }),
    );
    obj.insert("fresh_conn".into(), json!(o.fresh_conn));
    obj.insert(
        "wait".into(),
        json!(match o.wait {
            Wait::Sse => "sse".to_owned(),
            Wait::Poll => format!("poll {} ms", o.poll.as_secs_f64() * 1e3),
        }),
    );
    Ok(obj)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => s[n / 2],
        _ => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// The two phases of bench_common.py:bench, with CPU read from keel's /proc.
async fn bench(o: &Opts, client: &Client, pid: u32) -> Result<Value, String> {
    if o.seq {
        for _ in 0..o.warmup {
            client
                .run(o.k)
                .await
                .map_err(|e| format!("warm-up run: {e}"))?;
        }
        let mut run_ms = Vec::with_capacity(o.runs);
        let (cpu0, dcpu0) = (keel::cpu_seconds(pid)?, keel::self_cpu_seconds());
        let t0 = Instant::now();
        for _ in 0..o.runs {
            let t = Instant::now();
            let turns = client.run(o.k).await?;
            run_ms.push(t.elapsed().as_secs_f64() * 1e3);
            if turns != o.k {
                return Err(format!("run made {turns} tool turns, expected {}", o.k));
            }
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = keel::cpu_seconds(pid)? - cpu0;
        let dcpu = keel::self_cpu_seconds() - dcpu0;
        let mean = run_ms.iter().sum::<f64>() / run_ms.len().max(1) as f64;
        let med = median(&run_ms);
        let turns = (o.k * o.runs as u64) as f64;
        Ok(json!({
            "framework": o.label, "mode": "seq", "k": o.k, "runs": o.runs, "warmup": o.warmup,
            "stream": false,
            "run_ms": run_ms, "run_ms_mean": mean, "run_ms_median": med,
            "per_turn_us_mean": mean * 1e3 / o.k as f64, "per_turn_us_median": med * 1e3 / o.k as f64,
            "wall_s": wall, "cpu_s": cpu, "cpu_s_per_1000_turns": cpu * 1000.0 / turns,
            "driver_cpu_s": dcpu, "driver_cpu_s_per_1000_turns": dcpu * 1000.0 / turns,
        }))
    } else {
        let warm = o.warmup.max(1) * 10;
        for r in futures::future::join_all((0..warm).map(|_| client.run(o.k))).await {
            r.map_err(|e| format!("warm-up run: {e}"))?;
        }
        let mut batches: Vec<(f64, u64, u64)> = Vec::new();
        let (cpu0, dcpu0) = (keel::cpu_seconds(pid)?, keel::self_cpu_seconds());
        loop {
            let t0 = Instant::now();
            let outs = futures::future::join_all((0..o.runs).map(|_| client.run(o.k))).await;
            let wall = t0.elapsed().as_secs_f64();
            let (mut turns, mut errors) = (0u64, 0u64);
            for r in outs {
                match r {
                    Ok(t) => turns += t,
                    Err(e) => {
                        if errors < 3 {
                            eprintln!("run error: {e}");
                        }
                        errors += 1;
                    }
                }
            }
            batches.push((wall, turns, errors));
            let timed: f64 = batches.iter().map(|b| b.0).sum();
            if timed >= o.min_time || batches.len() >= o.max_batches {
                break;
            }
        }
        let cpu = keel::cpu_seconds(pid)? - cpu0;
        let dcpu = keel::self_cpu_seconds() - dcpu0;
        let turns: u64 = batches.iter().map(|b| b.1).sum();
        let tps: Vec<f64> = batches.iter().map(|b| b.1 as f64 / b.0).collect();
        let per_1k = |c: f64| c * 1000.0 / turns.max(1) as f64;
        Ok(json!({
            "framework": o.label, "mode": "conc", "k": o.k, "runs": o.runs, "warmup_runs": warm,
            "stream": false,
            "batches": batches.len(), "batch_turns_per_s": tps,
            "turns": turns, "errors": batches.iter().map(|b| b.2).sum::<u64>(),
            "wall_s": batches.iter().map(|b| b.0).sum::<f64>(),
            "turns_per_s": median(&tps),
            "cpu_s": cpu, "cpu_s_per_1000_turns": per_1k(cpu),
            "driver_cpu_s": dcpu, "driver_cpu_s_per_1000_turns": per_1k(dcpu),
        }))
    }
}
