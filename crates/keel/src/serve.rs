//! `keel serve`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use keel_server::{AppState, Auth};

pub async fn serve(config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let source = crate::app::resolve_source(config);
    let config = crate::app::load_config(&source)?;
    let exporter = crate::otel_export::start(&config.telemetry)?;
    let bind: SocketAddr = config.server.bind.parse().with_context(|| {
        format!(
            "server.bind `{}` is not an address like 127.0.0.1:8780",
            config.server.bind
        )
    })?;
    let app = crate::app::build(config).await?;
    let auth = if app.keys.is_empty() {
        if !bind.ip().is_loopback() {
            bail!(
                "server.bind {bind} is not a loopback address and no API keys are configured: \
                 add [[auth.keys]] or bind 127.0.0.1"
            );
        }
        Auth::open()
    } else {
        Auth::with_keys(app.keys.clone())
    };
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .with_context(|| format!("binding {bind}"))?;
    let local = listener.local_addr().context("reading the bound address")?;
    crate::app::follow_tool_changes(
        app.runtime.clone(),
        app.tools.clone(),
        app.memory.clone(),
        app.config.policy.approval_risk,
        app.config.tools.web_fetch.clone(),
        app.config.tools.exec.clone(),
    );
    let resumed = app
        .runtime
        .resume_unfinished()
        .await
        .context("resuming unfinished runs")?;
    let state = AppState {
        runtime: app.runtime.clone(),
        auth: Arc::new(auth),
        max_body_bytes: app.config.server.max_body_bytes,
        metrics: keel_server::metrics::handle(),
        memory: Some(app.memory.clone()),
        gateway: app.gateway.clone(),
    };
    tracing::info!(
        addr = %local,
        config = %source,
        agents = %app.runtime.agent_ids().join(","),
        tools = app.runtime.tools().len(),
        resumed,
        node = app.runtime.node_id(),
        "keel serving on http://{local}"
    );
    #[cfg(unix)]
    if let Some(gateway) = app.gateway.clone() {
        tokio::spawn(reload_routing_on_hangup(source, gateway));
    }
    // One plain line on stdout, for people and for scripts waiting for readiness.
    println!("keel listening on http://{local}");
    println!("console: http://{local}/");
    keel_server::serve(listener, state, shutdown_signal())
        .await
        .context("serving HTTP")?;
    // Other nodes sharing the store take this node's runs over at once.
    if let Err(e) = app.runtime.release_runs().await {
        tracing::warn!(error = %e, "could not release this node's runs; they move after the lease");
    }
    app.tools.shutdown().await;
    if let Some(exporter) = exporter {
        // Blocks until the queued spans are sent.
        let _ = tokio::task::spawn_blocking(move || exporter.shutdown()).await;
    }
    Ok(ExitCode::SUCCESS)
}

/// SIGHUP re-reads the configuration and routes chat messages by its
/// bindings, `dm_scope` and identity links from then on. A configuration
/// with errors is not applied: the running routing stays.
#[cfg(unix)]
async fn reload_routing_on_hangup(
    source: crate::app::Source,
    gateway: Arc<keel_server::gateway::Gateway>,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP; routing reloads need a restart");
        return;
    };
    while hangup.recv().await.is_some() {
        match crate::app::load_config(&source) {
            Ok(config) => {
                gateway.reload_routing(&config);
                tracing::info!("configuration reloaded: chat routing follows it from now on");
            }
            Err(e) => tracing::warn!(
                error = %format!("{e:#}"),
                "configuration not reloaded; the running routing stays"
            ),
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down; unfinished runs resume on the next start");
}
