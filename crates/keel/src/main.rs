//! The `keel` command: serve the API, run one question in the terminal, or
//! check a configuration file.

mod app;
mod approvals_cmd;
mod check;
#[cfg(feature = "local")]
mod local_provider;
mod logging;
mod memory_cmd;
mod migrate_cmd;
#[cfg(feature = "local")]
mod model_cmd;
mod otel_export;
mod run_cmd;
mod secrets;
mod serve;
mod similarity;
mod timeline;
mod zero_config;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "keel",
    version,
    about = "A guarded agent runtime: the model decides, code constrains every step."
)]
struct Cli {
    /// Configuration file (default: $KEEL_CONFIG, else ./keel.toml when present, else built-in defaults).
    #[arg(long, global = true, env = "KEEL_CONFIG")]
    config: Option<PathBuf>,
    /// Write the whole log to stderr (as `KEEL_LOG` does), not to
    /// <data_dir>/keel.log.
    #[arg(long, short, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API (runs, SSE events, tools, health, metrics).
    Serve,
    /// Run one question in this process and show its timeline live.
    Run {
        /// The question or task.
        question: String,
        /// Agent id (default: the configured default agent).
        #[arg(long)]
        agent: Option<String>,
        /// Session key, to continue an earlier conversation.
        #[arg(long)]
        session: Option<String>,
        /// Print every event as JSON instead of the readable timeline.
        #[arg(long)]
        json: bool,
    },
    /// Validate a configuration file and print every problem found.
    Check,
    /// Bring the configured database to this build's schema, then exit.
    Migrate,
    /// List and decide human approvals on a running keel.
    Approvals {
        #[command(subcommand)]
        action: ApprovalAction,
        /// keel's base URL.
        #[arg(
            long,
            env = "KEEL_URL",
            default_value = "http://127.0.0.1:8780",
            global = true
        )]
        url: String,
        /// API key (when the server has keys configured).
        #[arg(long, env = "KEEL_API_KEY", global = true)]
        key: Option<String>,
    },
    /// The local model cache (provider `local`): pull and list GGUF models.
    #[cfg(feature = "local")]
    Model {
        #[command(subcommand)]
        action: ModelAction,
    },
    /// Long-term memory on the configured data dir or database.
    Memory {
        #[command(subcommand)]
        action: MemoryAction,
        /// Tenant whose memory to use.
        #[arg(long, default_value = "default", global = true)]
        tenant: String,
    },
}

#[derive(Subcommand)]
enum MemoryAction {
    /// Add (or replace) a document, e.g. a manual or notes in Markdown.
    Add {
        file: PathBuf,
        /// Agent whose memory it joins (default: the default agent).
        #[arg(long)]
        agent: Option<String>,
        /// Title (default: the file name).
        #[arg(long)]
        title: Option<String>,
    },
    /// Re-chunk and re-embed every document.
    Reindex,
    /// Search memory as the memory_search tool does.
    Search {
        query: String,
        #[arg(long)]
        agent: Option<String>,
        #[arg(short, long, default_value_t = 5)]
        k: usize,
        /// Print hits as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[cfg(feature = "local")]
#[derive(Subcommand)]
enum ModelAction {
    /// Fetch a model into <data_dir>/models, verified by sha256: a known
    /// name (smollm2-135m) or <owner>/<repo>/<file>.gguf on the model hub.
    Pull {
        #[arg(default_value = "smollm2-135m")]
        name: String,
        /// Expected sha256 (hub files default to the hub's own hash).
        #[arg(long)]
        sha256: Option<String>,
    },
    /// List known and pulled models.
    List,
}

#[derive(Subcommand)]
enum ApprovalAction {
    /// List approvals (pending by default).
    List {
        #[arg(long, default_value = "pending")]
        status: String,
    },
    /// Approve one: the waiting run executes exactly the call shown.
    Approve {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Deny one: the call never runs and the model is told.
    Deny {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
}

// A server that runs thousands of runs at once allocates and frees small
// buffers on every turn from several threads; jemalloc's per-thread caches
// spend measurably less CPU on that than the system allocator (see
// bench/README.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    // The exec tool's sandbox helper: restricts itself, then becomes the
    // allowed program. Handled first, so nothing else runs in that process.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "__exec-sandbox")
    {
        return keel_tools::exec::sandbox_main(std::env::args_os().skip(2).collect());
    }
    let cli = Cli::parse();
    // A person at the terminal gets the run's timeline, not the log; a
    // server's log is its output.
    let quiet = matches!(cli.command, Command::Run { .. } | Command::Memory { .. })
        || cfg!(feature = "local") && is_model_command(&cli.command);
    let destination = if quiet && !cli.verbose && std::env::var_os("KEEL_LOG").is_none() {
        logging::Destination::File
    } else {
        logging::Destination::Stderr
    };
    logging::init(destination);
    let runtime = match async_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("keel: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve => serve::serve(cli.config.as_deref()).await,
            Command::Run {
                question,
                agent,
                session,
                json,
            } => run_cmd::run(cli.config.as_deref(), question, agent, session, json).await,
            Command::Check => check::check(cli.config.as_deref()),
            Command::Migrate => migrate_cmd::migrate(cli.config.as_deref()).await,
            #[cfg(feature = "local")]
            Command::Model { action } => match action {
                ModelAction::Pull { name, sha256 } => {
                    model_cmd::pull(cli.config.as_deref(), &name, sha256).await
                }
                ModelAction::List => model_cmd::list(cli.config.as_deref()).await,
            },
            Command::Memory { action, tenant } => {
                let config = cli.config.as_deref();
                match action {
                    MemoryAction::Add { file, agent, title } => {
                        let scope = memory_cmd::Scope { tenant, agent };
                        memory_cmd::add(config, scope, &file, title).await
                    }
                    MemoryAction::Reindex => memory_cmd::reindex(config).await,
                    MemoryAction::Search {
                        query,
                        agent,
                        k,
                        json,
                    } => {
                        let scope = memory_cmd::Scope { tenant, agent };
                        memory_cmd::search(config, scope, &query, k, json).await
                    }
                }
            }
            Command::Approvals { action, url, key } => {
                let target = approvals_cmd::Target { url, key };
                match action {
                    ApprovalAction::List { status } => approvals_cmd::list(&target, &status).await,
                    ApprovalAction::Approve { id, reason } => {
                        approvals_cmd::decide(&target, &id, true, &reason).await
                    }
                    ApprovalAction::Deny { id, reason } => {
                        approvals_cmd::decide(&target, &id, false, &reason).await
                    }
                }
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("keel: {}", logging::redact(&format!("{e:#}")));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The async runtime: tokio's work-stealing scheduler with a worker per
/// CPU, or the current-thread scheduler where there is one CPU to use (a
/// container limited to one, a process pinned to one) or
/// `TOKIO_WORKER_THREADS=1` asks for one worker. With one CPU the
/// work-stealing scheduler only adds cost: its worker takes every task
/// through queues shared with other threads, and the main thread, which
/// polls the top-level future, wakes beside it (bench/README.md measured
/// about a fifth less CPU per concurrent turn without it). Blocking work
/// (store reads) still runs on the blocking pool, and the store's writer,
/// the local model and the telemetry exporter on threads of their own.
fn async_runtime() -> Result<tokio::runtime::Runtime, String> {
    let workers = match std::env::var("TOKIO_WORKER_THREADS") {
        Ok(text) => match text.trim().parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(format!(
                    "TOKIO_WORKER_THREADS: must be a whole number of at least 1, got `{text}`"
                ));
            }
        },
        Err(_) => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
    };
    let mut builder = if workers == 1 {
        tracing::info!("async runtime: one thread (current-thread scheduler)");
        let mut builder = tokio::runtime::Builder::new_current_thread();
        // Every thread this runtime starts is its blocking pool's (the
        // store's reads): none preempts the runtime's thread when woken.
        builder.on_thread_start(keel_store::yield_when_woken);
        builder
    } else {
        tracing::info!(workers, "async runtime: work-stealing scheduler");
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(workers);
        builder
    };
    builder
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

#[cfg(feature = "local")]
fn is_model_command(command: &Command) -> bool {
    matches!(command, Command::Model { .. })
}

#[cfg(not(feature = "local"))]
fn is_model_command(_: &Command) -> bool {
    false
}
