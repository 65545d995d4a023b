//! `exec` (SPEC §5): runs an allowlisted program for the model. Off unless
//! configured, and it needs approval unless the configuration says
//! otherwise.
//!
//! - argv only, never a shell: the program and each argument are passed as
//!   they are, and shell metacharacters are refused outright so that no
//!   argument can even look like a command line;
//! - the program must be on the allowlist, and each argument must match one
//!   of that program's patterns;
//! - the child runs with an empty environment (plus `PATH`), no stdin,
//!   `no_new_privs`, and a Landlock filesystem ruleset: it may read and run
//!   what the system needs plus `read_paths`, and write only `write_paths`;
//! - a timeout kills it, and its output is capped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use keel_protocol::{Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSource, ToolSpec};
use landlock::{
    ABI, Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus,
};
use regex::Regex;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

/// The name the model calls it by.
pub const EXEC: &str = "exec";

/// Characters a shell would read as syntax: refused in every argument.
const SHELL_META: &[char] = &[
    ';', '|', '&', '$', '`', '<', '>', '(', ')', '{', '}', '*', '?', '[', ']', '!', '~', '\n',
    '\r', '\\', '\'', '"',
];

/// Read-and-run access the dynamic loader and common programs need.
const SYSTEM_PATHS: &[&str] = &["/usr", "/lib", "/lib64", "/bin", "/etc"];

/// One allowlisted program.
#[derive(Debug, Clone)]
pub struct Program {
    /// The path that runs (`/usr/bin/touch`); the model may name it by its
    /// file name (`touch`) too.
    pub path: PathBuf,
    /// Each argument must match one of these (anchored by the operator);
    /// none = no arguments allowed.
    pub args: Vec<Regex>,
}

#[derive(Debug, Clone)]
pub struct ExecSettings {
    pub programs: Vec<Program>,
    pub read_paths: Vec<PathBuf>,
    pub write_paths: Vec<PathBuf>,
    /// Where the program runs; the first write path when unset.
    pub cwd: Option<PathBuf>,
    pub timeout: Duration,
    pub max_output_bytes: usize,
    pub requires_approval: bool,
    /// The program that applies the sandbox and then becomes the allowed
    /// program: `keel` itself (`keel __exec-sandbox`) or the
    /// `keel-exec-sandbox` binary, with `helper_args` before its own.
    pub helper: PathBuf,
    pub helper_args: Vec<String>,
}

pub struct Exec {
    spec: ToolSpec,
    settings: Arc<ExecSettings>,
}

impl Exec {
    pub fn new(settings: ExecSettings) -> Self {
        let names: Vec<String> = settings
            .programs
            .iter()
            .filter_map(|p| p.path.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        let mut spec = ToolSpec::new(
            EXEC,
            format!(
                "Run one allowed program with arguments (no shell). Allowed programs: {}.",
                names.join(", ")
            ),
            json!({
                "type": "object",
                "properties": {
                    "program": {"type": "string", "enum": names},
                    "args": {"type": "array", "items": {"type": "string"}}
                },
                "required": ["program"],
                "additionalProperties": false
            }),
        );
        spec.risk = Risk::Exec;
        spec.requires_approval = settings.requires_approval;
        spec.source = ToolSource::Builtin;
        spec.timeout = settings.timeout + Duration::from_secs(1);
        Self {
            spec,
            settings: Arc::new(settings),
        }
    }

    /// The program and arguments to run, or why not.
    fn check(&self, arguments: &Value) -> Result<(PathBuf, Vec<String>), String> {
        let name = arguments
            .get("program")
            .and_then(Value::as_str)
            .ok_or("`program` must be a string")?;
        let args: Vec<String> = match arguments.get("args") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|a| {
                    a.as_str()
                        .map(str::to_owned)
                        .ok_or("every argument must be a string")
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("`args` must be an array of strings".into()),
        };
        let program = self
            .settings
            .programs
            .iter()
            .find(|p| p.path.as_os_str() == name || p.path.file_name().is_some_and(|f| f == name))
            .ok_or_else(|| format!("`{name}` is not an allowed program"))?;
        for a in &args {
            if let Some(c) = a.chars().find(|c| SHELL_META.contains(c)) {
                return Err(format!(
                    "argument {a:?} contains {c:?}: there is no shell here, and shell syntax is refused"
                ));
            }
            if !program.args.iter().any(|r| r.is_match(a)) {
                return Err(format!(
                    "argument {a:?} is not allowed for {}",
                    program.path.display()
                ));
            }
        }
        Ok((program.path.clone(), args))
    }

    async fn run(&self, program: PathBuf, args: Vec<String>) -> Result<ToolOutput, String> {
        // The helper restricts itself (no_new_privs, Landlock) and then
        // executes the program in its place, so the rules bind the program.
        let mut cmd = tokio::process::Command::new(&self.settings.helper);
        cmd.args(&self.settings.helper_args);
        let readable = SYSTEM_PATHS
            .iter()
            .map(PathBuf::from)
            .chain(self.settings.read_paths.iter().cloned())
            .chain(program.parent().map(Path::to_path_buf));
        for path in readable.filter(|p| p.exists()) {
            cmd.arg("--read").arg(path);
        }
        for path in &self.settings.write_paths {
            cmd.arg("--write").arg(path);
        }
        cmd.arg("--")
            .arg(&program)
            .args(&args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(dir) = self
            .settings
            .cwd
            .as_ref()
            .or(self.settings.write_paths.first())
        {
            cmd.current_dir(dir);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("could not start {}: {e}", program.display()))?;
        let cap = self.settings.max_output_bytes;
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let output = async {
            let (out, err) = tokio::join!(
                read_capped(stdout.as_mut(), cap),
                read_capped(stderr.as_mut(), cap)
            );
            let status = child.wait().await;
            (out, err, status)
        };
        let (out, err, status) = tokio::time::timeout(self.settings.timeout, output)
            .await
            .map_err(|_| {
                format!(
                    "{} did not finish within {:?}",
                    program.display(),
                    self.settings.timeout
                )
            })?;
        let status = status.map_err(|e| format!("waiting for {}: {e}", program.display()))?;
        let code = status.code();
        let text = format!(
            "exit code: {}\nstdout:\n{out}\nstderr:\n{err}",
            code.map_or("killed".to_owned(), |c| c.to_string())
        );
        Ok(ToolOutput {
            content: text,
            structured: Some(json!({"exit_code": code})),
            is_error: !status.success(),
        })
    }
}

async fn read_capped<R: tokio::io::AsyncRead + Unpin>(
    reader: Option<&mut R>,
    cap: usize,
) -> String {
    let Some(reader) = reader else {
        return String::new();
    };
    let mut buf = Vec::new();
    let mut limited = reader.take(u64::try_from(cap).unwrap_or(u64::MAX) + 1);
    if limited.read_to_end(&mut buf).await.is_err() {
        return String::new();
    }
    let cut = buf.len() > cap;
    buf.truncate(cap);
    let mut text = String::from_utf8_lossy(&buf).into_owned();
    if cut {
        text.push_str("\n[truncated]");
    }
    text
}

#[async_trait::async_trait]
impl Tool for Exec {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, arguments: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let result = match self.check(&arguments) {
            Ok((program, args)) => self.run(program, args).await,
            Err(why) => Err(why),
        };
        Ok(result.unwrap_or_else(|why| ToolOutput {
            content: format!("exec refused or failed: {why}"),
            structured: None,
            is_error: true,
        }))
    }
}

/// The sandbox helper's whole program: `[--read PATH]... [--write PATH]...
/// -- PROGRAM [ARG]...`. It sets `no_new_privs`, restricts itself with a
/// Landlock ruleset (read and run beneath the read paths, everything
/// beneath the write paths, nothing else), then executes the program in its
/// place. It refuses to run the program unsandboxed.
pub fn sandbox_main(args: Vec<std::ffi::OsString>) -> std::process::ExitCode {
    use std::os::unix::process::CommandExt;

    let mut read = Vec::new();
    let mut write = Vec::new();
    let mut it = args.into_iter();
    let mut rest = Vec::new();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--read") => read.extend(it.next().map(PathBuf::from)),
            Some("--write") => write.extend(it.next().map(PathBuf::from)),
            Some("--") => {
                rest = it.collect();
                break;
            }
            _ => {
                eprintln!("keel exec sandbox: unexpected argument {a:?}");
                return std::process::ExitCode::from(126);
            }
        }
    }
    let Some((program, program_args)) = rest.split_first() else {
        eprintln!("keel exec sandbox: no program given");
        return std::process::ExitCode::from(126);
    };
    if let Err(e) = restrict(&read, &write) {
        eprintln!("keel exec sandbox: {e}");
        return std::process::ExitCode::from(126);
    }
    let err = std::process::Command::new(program)
        .args(program_args)
        .exec();
    eprintln!("keel exec sandbox: could not run {program:?}: {err}");
    std::process::ExitCode::from(127)
}

fn restrict(read: &[PathBuf], write: &[PathBuf]) -> Result<(), String> {
    let abi = ABI::V2;
    let read_access = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let mut ruleset = Ruleset::default()
        .handle_access(all)
        .and_then(|r| r.create())
        .map_err(|e| e.to_string())?;
    for path in read {
        let fd = PathFd::new(path).map_err(|e| format!("{}: {e}", path.display()))?;
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, read_access))
            .map_err(|e| e.to_string())?;
    }
    for path in write {
        let fd = PathFd::new(path).map_err(|e| format!("{}: {e}", path.display()))?;
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, all))
            .map_err(|e| e.to_string())?;
    }
    let status = ruleset.restrict_self().map_err(|e| e.to_string())?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err("Landlock is not available on this kernel; refusing to run unsandboxed".into());
    }
    Ok(())
}
