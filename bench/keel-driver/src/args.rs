//! Command line, with the same names and defaults as
//! /work/shared/bench/peers/common/bench_common.py so run.sh can call every
//! driver the same way.

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
}

const USAGE: &str = "usage: keel-driver --base-url URL [--mode seq|conc] [--k N] [--runs N] \
[--warmup N] [--min-time S] [--label L] [--max-batches N] [--wait sse|poll] [--poll-ms MS] [--keep]";

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
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--keep" {
            o.keep = true;
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
                o.wait = match value.as_str() {
                    "sse" => Wait::Sse,
                    "poll" => Wait::Poll,
                    _ => return Err(bad("sse or poll")),
                }
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
    if o.k == 0 {
        o.k = if o.seq { 50 } else { 5 };
    }
    if o.runs == 0 {
        o.runs = if o.seq { 20 } else { 200 };
    }
    Ok(o)
}
