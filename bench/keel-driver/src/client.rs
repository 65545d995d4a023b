//! One agent run through keel's HTTP API, checked: completed, final answer
//! `done`, exactly K tool calls and K + 1 model calls.

use std::time::Duration;

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde_json::Value;

use crate::args::Wait;

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    runs_url: String,
    wait: Wait,
    poll: Duration,
}

impl Client {
    pub fn new(
        keel_url: &str,
        wait: Wait,
        poll: Duration,
        fresh_conn: bool,
    ) -> Result<Client, String> {
        let mut builder = reqwest::Client::builder().no_proxy().tcp_nodelay(true);
        if fresh_conn {
            builder = builder.pool_max_idle_per_host(0);
        }
        let http = builder.build().map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Client {
            http,
            runs_url: format!("{keel_url}/ai/runs"),
            wait,
            poll,
        })
    }

    /// Runs `run K=<k>` to the end; returns the number of tool turns.
    pub async fn run(&self, k: u64) -> Result<u64, String> {
        match self.wait {
            Wait::Sse => self.run_sse(k).await,
            Wait::Poll => self.run_poll(k).await,
        }
    }

    fn post(&self, k: u64) -> reqwest::RequestBuilder {
        self.http
            .post(&self.runs_url)
            .header(CONTENT_TYPE, "application/json")
            .body(format!(r#"{{"input":"run K={k}"}}"#))
    }

    async fn run_sse(&self, k: u64) -> Result<u64, String> {
        let mut resp = self
            .post(k)
            .header(ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| format!("POST /ai/runs: {e}"))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            return Err(format!("POST /ai/runs: HTTP {status}: {body}"));
        }
        let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
        let mut answer: Option<String> = None;
        let mut scanned = 0;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| format!("event stream: {e}"))?
        {
            buf.extend_from_slice(&chunk);
            loop {
                let Some(end) = find_frame_end(&buf, scanned) else {
                    scanned = buf.len().saturating_sub(1);
                    break;
                };
                let outcome = on_frame(&buf[..end], k, &mut answer);
                buf.drain(..end + 2);
                scanned = 0;
                if let Some(result) = outcome {
                    // Read to the end so the connection goes back to the pool.
                    while let Ok(Some(_)) = resp.chunk().await {}
                    return result;
                }
            }
        }
        Err("event stream ended before run_completed".into())
    }

    async fn run_poll(&self, k: u64) -> Result<u64, String> {
        let resp = self
            .post(k)
            .send()
            .await
            .map_err(|e| format!("POST /ai/runs: {e}"))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| format!("POST /ai/runs: {e}"))?;
        if !status.is_success() {
            return Err(format!(
                "POST /ai/runs: HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            ));
        }
        let run: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        let id = run["id"]
            .as_str()
            .ok_or("run object without id")?
            .to_owned();
        let url = format!("{}/{id}", self.runs_url);
        loop {
            tokio::time::sleep(self.poll).await;
            let body = self
                .http
                .get(&url)
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .map_err(|e| format!("GET {url}: {e}"))?
                .bytes()
                .await
                .map_err(|e| format!("GET {url}: {e}"))?;
            let run: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
            match run["status"].as_str() {
                Some("completed") => {
                    let answer = run["output"].as_str().map(str::to_owned);
                    return check(k, answer.as_deref(), &run["usage"]);
                }
                Some("failed" | "cancelled") => {
                    return Err(format!(
                        "run {id} ended {}: {}",
                        run["status"], run["error"]
                    ));
                }
                Some("waiting_input" | "waiting_approval") => {
                    return Err(format!("run {id} waits: {}", run["pending"]));
                }
                _ => {}
            }
        }
    }
}

/// Index of the blank line ending the first SSE frame (`\n\n`), if complete.
fn find_frame_end(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| i + from)
}

/// Handles one frame; `Some` once the run is over. Only the few events the
/// check needs are parsed, the rest are skipped by their `event:` line.
fn on_frame(frame: &[u8], k: u64, answer: &mut Option<String>) -> Option<Result<u64, String>> {
    let text = String::from_utf8_lossy(frame);
    let mut event = "";
    let mut data = String::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            event = v.trim();
        } else if let Some(v) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    match event {
        "final" => {
            let v: Value = serde_json::from_str(&data).ok()?;
            *answer = v["answer"].as_str().map(str::to_owned);
            None
        }
        "run_completed" => Some(match serde_json::from_str::<Value>(&data) {
            Ok(v) => check(k, answer.as_deref(), &v["usage"]),
            Err(e) => Err(format!("run_completed: {e}")),
        }),
        "run_failed" | "run_cancelled" => Some(Err(format!("{event}: {data}"))),
        "clarification_needed" | "approval_required" => {
            Some(Err(format!("run stopped to wait: {event}: {data}")))
        }
        _ => None,
    }
}

/// The run must be exactly the peers' workload: answer `done`, k tool calls
/// and k + 1 model calls (one per turn plus the final answer). Anything else
/// means keel did other work than the peers and the numbers would not compare.
fn check(k: u64, answer: Option<&str>, usage: &Value) -> Result<u64, String> {
    if answer != Some("done") {
        return Err(format!("final answer {answer:?}, expected \"done\""));
    }
    let calls = usage["tool_calls"]
        .as_u64()
        .ok_or_else(|| format!("usage without tool_calls: {usage}"))?;
    if calls != k {
        return Err(format!("run made {calls} tool calls, expected {k}"));
    }
    let llm_calls = usage["llm_calls"]
        .as_u64()
        .ok_or_else(|| format!("usage without llm_calls: {usage}"))?;
    if llm_calls != k + 1 {
        return Err(format!(
            "run made {llm_calls} model calls, expected {} (k + 1 for k = {k}): \
             a guard feature changed the workload (drift correction, reflection, ...)",
            k + 1
        ));
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs every complete frame of `buf` through `on_frame`; the last outcome.
    fn replay(buf: &[u8], k: u64) -> Option<Result<u64, String>> {
        let mut answer = None;
        let mut rest = buf;
        let mut out = None;
        while let Some(end) = find_frame_end(rest, 0) {
            if let Some(r) = on_frame(&rest[..end], k, &mut answer) {
                out = Some(r);
            }
            rest = &rest[end + 2..];
        }
        out
    }

    fn completed(usage: &str) -> Option<Result<u64, String>> {
        let mut answer = Some("done".to_owned());
        let frame = format!("event: run_completed\ndata: {{\"usage\":{usage}}}");
        on_frame(frame.as_bytes(), 3, &mut answer)
    }

    #[test]
    fn frames_are_split_and_checked() {
        let buf = b"id: 1\nevent: final\ndata: {\"answer\":\"done\"}\n\n: ping\n\nid: 2\nevent: run_completed\ndata: {\"usage\":{\"llm_calls\":4,\"tool_calls\":3,\"prompt_tokens\":120,\"completion_tokens\":30}}\n\n";
        assert_eq!(replay(buf, 3), Some(Ok(3)));
    }

    #[test]
    fn wrong_tool_calls_fail() {
        let out = completed(r#"{"llm_calls":4,"tool_calls":2}"#);
        let Some(Err(e)) = out else {
            panic!("expected an error, got {out:?}")
        };
        assert!(e.contains("2 tool calls, expected 3"), "{e}");
    }

    #[test]
    fn extra_model_calls_fail() {
        // k = 3 tool turns plus a reflection call: 5 model calls, not 4.
        let out = completed(r#"{"llm_calls":5,"tool_calls":3}"#);
        let Some(Err(e)) = out else {
            panic!("expected an error, got {out:?}")
        };
        assert!(e.contains("5 model calls, expected 4"), "{e}");
        assert!(e.contains("guard feature changed the workload"), "{e}");
    }

    #[test]
    fn missing_llm_calls_fail() {
        let out = completed(r#"{"tool_calls":3}"#);
        assert!(
            matches!(&out, Some(Err(e)) if e.contains("without llm_calls")),
            "{out:?}"
        );
    }

    #[test]
    fn wrong_answer_fails() {
        let buf = b"event: final\ndata: {\"answer\":\"nope\"}\n\nevent: run_completed\ndata: {\"usage\":{\"llm_calls\":4,\"tool_calls\":3}}\n\n";
        assert!(matches!(replay(buf, 3), Some(Err(_))));
    }
}
