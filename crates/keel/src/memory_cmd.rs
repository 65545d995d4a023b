//! `keel memory`: add documents, rebuild the index and search, in this
//! process, on the configured data dir or database.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};
use keel_config::Config;
use keel_memory::MemoryDocument;

/// Which tenant's memory, and which agent's.
pub struct Scope {
    pub tenant: String,
    pub agent: Option<String>,
}

/// The agent named, or the default one: `default` when configured, else the
/// first agent (as `keel serve` chooses).
fn agent_of(config: &Config, requested: Option<String>) -> anyhow::Result<String> {
    if let Some(agent) = requested {
        if !config.agents.is_empty() && !config.agents.iter().any(|a| a.id == agent) {
            let known: Vec<&str> = config.agents.iter().map(|a| a.id.as_str()).collect();
            bail!("no agent named `{agent}` (known: {})", known.join(", "));
        }
        return Ok(agent);
    }
    Ok(
        if config.agents.iter().any(|a| a.id == "default") || config.agents.is_empty() {
            "default".to_owned()
        } else {
            config.agents[0].id.clone()
        },
    )
}

async fn open(
    config_path: Option<&Path>,
) -> anyhow::Result<(Config, std::sync::Arc<dyn keel_memory::Memory>)> {
    let source = crate::app::resolve_source(config_path);
    let config = crate::app::load_config(&source)?;
    let memory = keel_memory::from_config(&config)
        .await
        .context("opening memory")?;
    let redactor = crate::secrets::redactor(&config, &keel_config::ProcessEnv)?;
    let memory = keel_memory::RedactedMemory::wrap(memory, &redactor);
    if let Some(notice) = memory.status().notice {
        eprintln!("keel: {notice}");
    }
    Ok((config, memory))
}

pub async fn add(
    config_path: Option<&Path>,
    scope: Scope,
    file: &Path,
    title: Option<String>,
) -> anyhow::Result<ExitCode> {
    let text = tokio::fs::read_to_string(file)
        .await
        .with_context(|| format!("reading {}", file.display()))?;
    let name = file.file_name().map_or_else(
        || file.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let (config, memory) = open(config_path).await?;
    let agent = agent_of(&config, scope.agent)?;
    let id = memory
        .add_document(MemoryDocument {
            tenant: scope.tenant,
            agent: agent.clone(),
            source: format!("doc:{name}"),
            title: title.unwrap_or_else(|| name.clone()),
            text,
            created_at: chrono::Utc::now(),
        })
        .await
        .context("adding the document")?;
    println!("{id}\t{name}\t(agent {agent})");
    Ok(ExitCode::SUCCESS)
}

pub async fn reindex(config_path: Option<&Path>) -> anyhow::Result<ExitCode> {
    let (_, memory) = open(config_path).await?;
    let chunks = memory
        .reindex()
        .await
        .context("rebuilding the memory index")?;
    let model = memory
        .status()
        .embedder
        .unwrap_or_else(|| "none (BM25 only)".to_owned());
    println!("reindexed {chunks} chunks (embedder: {model})");
    Ok(ExitCode::SUCCESS)
}

pub async fn search(
    config_path: Option<&Path>,
    scope: Scope,
    query: &str,
    k: usize,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (config, memory) = open(config_path).await?;
    let agent = agent_of(&config, scope.agent)?;
    let hits = memory
        .search(&scope.tenant, &agent, query, k)
        .await
        .context("searching memory")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&hits)?);
        return Ok(ExitCode::SUCCESS);
    }
    if hits.is_empty() {
        println!("no matches");
    }
    for hit in hits {
        println!("{:.3}  {}  [{}]", hit.score, hit.id, hit.source);
        for line in hit.snippet.lines().take(6) {
            println!("       {line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
