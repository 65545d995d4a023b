//! `keel run "<question>"`: one run in this process, its timeline printed live.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use keel_core::StartRun;
use keel_protocol::{EventKind, Principal};

use crate::timeline::Timeline;

pub async fn run(
    config: Option<&Path>,
    question: String,
    agent: Option<String>,
    session: Option<String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let source = crate::app::resolve_source(config);
    let config = crate::app::load_config(&source)?;
    let exporter = crate::otel_export::start(&config.telemetry)?;
    let app = crate::app::build(config).await?;
    let principal = Principal {
        tenant: "default".into(),
        id: "cli".into(),
        roles: Vec::new(),
    };
    let (run, mut events) = app
        .runtime
        .start_run_followed(
            &principal,
            StartRun {
                input: question,
                session,
                agent,
                ..StartRun::default()
            },
        )
        .await?;
    let mut timeline = Timeline::new(json);
    let mut code = ExitCode::FAILURE;
    while let Some(event) = events.recv().await {
        timeline.print(&event);
        match &event.kind {
            // After a handoff the person at the terminal is the one asked.
            EventKind::ClarificationNeeded { .. } | EventKind::HandoffRequested { .. } => {
                let answer = read_answer().await?;
                app.runtime
                    .input(&principal.tenant, &run.id, answer)
                    .await?;
            }
            EventKind::RunCompleted { .. } => code = ExitCode::SUCCESS,
            EventKind::RunCancelled { .. } => code = ExitCode::from(130),
            _ => {}
        }
    }
    app.tools.shutdown().await;
    if let Some(exporter) = exporter {
        let _ = tokio::task::spawn_blocking(move || exporter.shutdown()).await;
    }
    Ok(code)
}

async fn read_answer() -> anyhow::Result<String> {
    print!("  your answer> ");
    std::io::stdout().flush()?;
    let line = tokio::task::spawn_blocking(|| {
        let mut s = String::new();
        std::io::stdin().read_line(&mut s).map(|_| s)
    })
    .await??;
    let line = line.trim().to_owned();
    if line.is_empty() {
        anyhow::bail!("no answer given (end of input)");
    }
    Ok(line)
}
