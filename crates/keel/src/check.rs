use std::path::Path;
use std::process::ExitCode;

use keel_config::ProcessEnv;

/// `keel check`: every problem of the file, one per line.
pub fn check(config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let path = match crate::app::resolve_source(config) {
        crate::app::Source::File(p) => p,
        crate::app::Source::Defaults => {
            anyhow::bail!("no configuration file: pass --config FILE (or set KEEL_CONFIG)")
        }
    };
    let result = keel_config::load_file(&path, &ProcessEnv);
    let origin = path.display().to_string();
    print!("{}", keel_config::render_report(&origin, &result));
    if let Ok(loaded) = &result {
        print!("{}", trust_report(&loaded.config));
    }
    Ok(if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What the configuration alone says about approval. `keel check` starts
/// no MCP server, so their tools are not known here: a pattern stands for
/// a server or override that covers several, and the log of `keel serve`
/// names every tool once the servers have listed theirs.
fn trust_report(config: &keel_config::Config) -> String {
    let trust = keel_tools::ConfiguredTrust::of(&config.tools, config.policy.approval_risk);
    let needing = if trust.needs_approval.is_empty() {
        "none".to_owned()
    } else {
        trust.needs_approval.join(", ")
    };
    let mut out = format!("tools needing approval (from configuration): {needing}\n");
    if !trust.mcp_servers.is_empty() {
        out.push_str(&format!(
            "mcp tools ({}) are listed when `keel serve` starts their servers; its log names those \
             needing approval and those with no annotations (risk write, no approval, by default)\n",
            trust
                .mcp_servers
                .iter()
                .map(|s| format!("{s}.*"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    out
}
