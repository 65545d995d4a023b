//! The `keel` command: serve the API, run one question in the terminal, or
//! check a configuration file.

mod app;
mod approvals_cmd;
mod check;
mod run_cmd;
mod serve;
mod timeline;

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

fn main() -> std::process::ExitCode {
    init_tracing();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("keel: cannot start the async runtime: {e}");
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
            eprintln!("keel: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KEEL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
