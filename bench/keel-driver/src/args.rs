//! Command line, with the same names and defaults as the shared benchmark
//! harness's `peers/common/bench_common.py` so run.sh can call every driver
//! the same way.

use std::time::Duration;

/// How the driver learns that a run has finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// `POST /ai/runs` with `Accept: text/event-stream`; read to `run_completed`.
    Sse,
    /// `POST /ai/runs` (201), then `GET /ai/runs/{id}` every `poll` interval.
    Poll,
}

#[derive(Debug, Clone)]
pub struct Opts {
    pub base_url: String,
    pub seq: bool,
    pub k: u64,
    pub runs: usize,
    pub warmup: usize,
    pub label: String,
    pub min_time: f64,
    pub max_batches: usize,
    pub wait: Wait,
    pub poll: Duration,
    /// Keep the temp dir (config, SQLite file) for inspection.
    pub keep: bool,
    /// A new TCP connection per run instead of keep-alive (to see how the
    /// SSE tail latency depends on the connection's ACK state).
    pub fresh_conn: bool,
    /// `postgres://…` of a server where the driver may create a database:
    /// keel then runs on PostgreSQL, in a database of its own made for this
    /// process and dropped at its end. Unset: keel's default SQLite file.
    pub database_url: Option<String>,
}

const USAGE: &str = "usage: keel-driver --base-url URL [--mode seq|conc] [--k N] [--runs N] \
[--warmup N] [--min-time S] [--label L] [--max-batches N] [--wait auto|sse|poll] [--poll-ms MS] [--fresh-conn] [--keep] [--database-url postgres://…]";

pub fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        base_url: String::new(),
        seq: true,
        k: 0,
        runs: 0,
        warmup: 2,
        label: "keel".into(),
        min_time: 1.0,
        max_batches: 50,
        wait: Wait::Sse,
        poll: Duration::from_millis(1),
        keep: false,
        fresh_conn: false,
        database_url: None,
    };
    let mut wait: Option<Wait> = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--keep" {
            o.keep = true;
            continue;
        }
        if flag == "--fresh-conn" {
            o.fresh_conn = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.into());
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let bad = |what: &str| format!("{flag}: `{value}` is not {what}");
        match flag.as_str() {
            "--base-url" => o.base_url = value.trim_end_matches('/').to_owned(),
            "--mode" => {
                o.seq = match value.as_str() {
                    "seq" => true,
                    "conc" => false,
                    _ => return Err(bad("seq or conc")),
                }
            }
            "--k" => o.k = value.parse().map_err(|_| bad("a number"))?,
            "--runs" => o.runs = value.parse().map_err(|_| bad("a number"))?,
            "--warmup" => o.warmup = value.parse().map_err(|_| bad("a number"))?,
            "--label" => o.label = value,
            "--min-time" => o.min_time = value.parse().map_err(|_| bad("a number"))?,
            "--max-batches" => o.max_batches = value.parse().map_err(|_| bad("a number"))?,
            "--wait" => {
                wait = match value.as_str() {
                    "auto" => None,
                    "sse" => Some(Wait::Sse),
                    "poll" => Some(Wait::Poll),
                    _ => return Err(bad("auto, sse or poll")),
                }
            }
            "--database-url" => {
                if !value.starts_with("postgres://") && !value.starts_with("postgresql://") {
                    return Err(bad("a postgres:// URL"));
                }
                o.database_url = Some(value);
            }
            "--poll-ms" => {
                let ms: f64 = value.parse().map_err(|_| bad("a number"))?;
                o.poll = Duration::from_secs_f64(ms.max(0.0) / 1000.0);
            }
            _ => return Err(format!("unknown argument {flag}\n{USAGE}")),
        }
    }
    if o.base_url.is_empty() {
        return Err(format!("--base-url is required\n{USAGE}"));
    }
    // auto: whichever measured cheaper, which is now the stream in both
    // modes. Seq used to poll every millisecond while keel's API socket had
    // Nagle on (SSE then lost ~40 ms at each run's tail); with TCP_NODELAY
    // the stream costs less than the polls (bench/README.md).
    o.wait = wait.unwrap_or(Wait::Sse);
    if o.k == 0 {
        o.k = if o.seq { 50 } else { 5 };
    }
    if o.runs == 0 {
        o.runs = if o.seq { 20 } else { 200 };
    }
    Ok(o)
}
