//! `keel migrate`: brings the configured database to this build's schema
//! and exits, so that an upgrade can migrate once before any node starts.
//! (`keel serve` migrates at start too; concurrent migrations are safe.)

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

pub async fn migrate(config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let source = crate::app::resolve_source(config);
    let config = crate::app::load_config(&source)?;
    let url = crate::app::database_url(&config);
    let version = keel_store::migrate(&url)
        .await
        .with_context(|| format!("migrating {}", crate::app::scheme_of(&url)))?;
    println!(
        "{} is at schema version {version}",
        crate::app::scheme_of(&url)
    );
    Ok(ExitCode::SUCCESS)
}
