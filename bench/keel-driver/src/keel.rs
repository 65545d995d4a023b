//! The keel server under test: its binary, its config, its process and the
//! figures read from /proc about it (keel is the framework process here, so
//! CPU and memory are its, not the driver's).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Same text as `bench_common.py:SYSTEM_PROMPT`.
pub const SYSTEM_PROMPT: &str = "You are a benchmark agent. Call the lookup tool when asked.";

/// `KEEL_BIN`, else `release/keel` under `CARGO_TARGET_DIR`, the repo's own
/// `target/`, or the team's shared `~/.cache/keel-target`, first found.
pub fn binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("KEEL_BIN") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("KEEL_BIN={} is not a file", p.display()))
        };
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut dirs = Vec::new();
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        dirs.push(PathBuf::from(t));
    }
    dirs.push(repo.join("target"));
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cache/keel-target"));
    }
    dirs.iter()
        .map(|d| d.join("release/keel"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "no keel binary: set KEEL_BIN or run `cargo build --release -p keel` in {}",
                repo.display()
            )
        })
}

/// A TOML basic string: JSON's escapes (`\"`, `\\`, `\n`, `\uXXXX`, …) are
/// all valid TOML escapes, so serde_json does the quoting.
fn toml_str(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

pub fn config(
    data_dir: &Path,
    database_url: Option<&str>,
    llm_base_url: &str,
    tool_addr: SocketAddr,
) -> String {
    let data_dir = toml_str(&data_dir.to_string_lossy());
    let database = database_url.map_or_else(String::new, |u| {
        format!(
            "database_url = {}                 # PostgreSQL\n",
            toml_str(u)
        )
    });
    let base_url = toml_str(llm_base_url);
    let prompt = toml_str(SYSTEM_PROMPT);
    let lookup_url = toml_str(&format!("http://{tool_addr}/lookup?key={{key}}"));
    format!(
        r#"# written by keel-driver for the shared benchmark harness
[server]
bind = "127.0.0.1:0"
data_dir = {data_dir}
{database}
[[providers]]
name = "fake"
kind = "openai"
base_url = {base_url}
model = "bench"
stream = false                 # the Python peers use non-streamed JSON too

[[agents]]
id = "default"
provider = "fake"
system_prompt = {prompt}
tools = ["lookup"]

[agents.limits]
max_steps = 1000
max_tool_calls = 1000
max_wall_time_s = 3600

[agents.loop_detection]
repeat_warning = 1000
repeat_critical = 1000
max_tool_calls_breaker = 100000

# The peers have no drift correction or reflection: every guard feature that
# adds model or tool calls must be off here, so each run stays one model call
# and one tool call per turn plus the final answer (k tool calls, k + 1 model calls).
[agents.drift]
enabled = false

# No peer keeps a long-term memory: without this the local embedding model is
# loaded at start-up (about 145 MB more peak RSS) for a workload that never
# searches memory.
[memory]
embedder = "none"

[[tools.http]]
name = "lookup"
description = "Look up a key and return its record as JSON."
method = "GET"
url = {lookup_url}
parameters = {{ type = "object", properties = {{ key = {{ type = "string", description = "the key" }} }}, required = ["key"] }}
idempotent = true
"#
    )
}

/// keel's environment: ours minus every `KEEL_*` override (a stray
/// `KEEL_CONFIG` or `KEEL_SERVER__…` would change what is measured) and
/// minus proxies (everything is on 127.0.0.1).
fn command(bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("KEEL_") || k.to_ascii_lowercase().ends_with("_proxy") {
            cmd.env_remove(&*k);
        }
    }
    cmd.env("KEEL_LOG", "warn");
    cmd
}

/// `keel check --config FILE`: a bad config should fail loudly before
/// anything is timed.
pub async fn check(bin: &Path, config: &Path) -> Result<(), String> {
    let out = command(bin)
        .arg("check")
        .arg("--config")
        .arg(config)
        .output()
        .await
        .map_err(|e| format!("running keel check: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "keel check failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

pub struct Server {
    child: Child,
    pub pid: u32,
    pub url: String,
}

impl Server {
    /// Spawns `keel serve` and waits for its `keel listening on http://ADDR` line.
    pub async fn start(bin: &Path, config: &Path) -> Result<Server, String> {
        let mut child = command(bin)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", bin.display()))?;
        let pid = child.id().ok_or("keel exited at once")?;
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let mut lines = BufReader::new(stdout).lines();
        let wait_line = async {
            while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
                if let Some(addr) = line.trim().strip_prefix("keel listening on ") {
                    return Ok(addr.trim_end_matches('/').to_owned());
                }
            }
            Err("keel exited before it listened".to_owned())
        };
        let url = tokio::time::timeout(Duration::from_secs(60), wait_line)
            .await
            .map_err(|_| "keel did not listen within 60 s".to_owned())??;
        // Keep draining stdout so keel never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Server { child, pid, url })
    }

    /// SIGTERM (keel shuts down cleanly), SIGKILL after 5 s.
    pub async fn stop(mut self) {
        if let Ok(pid) = i32::try_from(self.pid) {
            // SAFETY: plain kill(2) on our own child's pid, which we have not reaped yet.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// utime + stime of every thread of `pid`, in seconds (/proc/PID/stat fields 14, 15).
pub fn cpu_seconds(pid: u32) -> Result<f64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 2..])
        .ok_or("malformed /proc stat")?;
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| -> Result<f64, String> {
        f.get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .map(|v| v as f64)
            .ok_or_else(|| format!("/proc/{pid}/stat field {}", i + 3))
    };
    Ok((tick(11)? + tick(12)?) / clock_ticks())
}

/// A `kB` line of /proc/PID/status, e.g. `VmHWM` (peak RSS) or `VmRSS`.
pub fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

/// This process's own CPU (client and tool backend), for comparison.
pub fn self_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_turns_drift_off() {
        let toml = config(
            Path::new("data"),
            None,
            "http://127.0.0.1:1/v1",
            ([127, 0, 0, 1], 2).into(),
        );
        let drift = toml.find("[agents.drift]\nenabled = false\n");
        let tools = toml.find("[[tools.http]]");
        assert!(drift.is_some() && drift < tools, "{toml}");
        let memory = toml.find("[memory]\nembedder = \"none\"\n");
        assert!(memory.is_some() && memory < tools, "{toml}");
        assert!(!toml.contains("database_url"), "{toml}");
    }

    #[test]
    fn config_names_the_database() {
        let toml = config(
            Path::new("data"),
            Some("postgres://127.0.0.1/keel_bench_1"),
            "http://127.0.0.1:1/v1",
            ([127, 0, 0, 1], 2).into(),
        );
        assert!(
            toml.contains("database_url = \"postgres://127.0.0.1/keel_bench_1\""),
            "{toml}"
        );
    }
}
