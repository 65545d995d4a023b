//! Where a tool's `risk` and `requires_approval` come from. MCP annotations
//! are hints, configuration is authority (SPEC §5), so the values are
//! layered: what the tool says about itself (an MCP server's annotations,
//! or an HTTP tool's own entry), then the `[[tools.mcp]]` server-wide
//! settings, then every matching `[tools.overrides]` key from least to most
//! specific. The layer that set each value last is kept, so an operator can
//! see which tools run on keel's defaults rather than on a decision of theirs.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use keel_config::{ToolOverride, ToolsConfig};
use keel_protocol::{Risk, Tool, ToolSpec};

use crate::apply_override;

/// The layer that decided one of a tool's trust settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RiskSource {
    /// An MCP tool's `readOnlyHint` / `destructiveHint`.
    Annotations,
    /// An MCP tool that gave neither hint: keel's default, `write` without
    /// approval (the operator marks what is dangerous).
    NoAnnotations,
    /// An HTTP tool's own `[[tools.http]]` entry (`read`, no approval, when
    /// the entry sets nothing).
    HttpTool,
    /// The `risk` / `requires_approval` of the tool's `[[tools.mcp]]` server.
    Server,
    /// The most specific `[tools.overrides]` key that set the value.
    Override(String),
}

impl fmt::Display for RiskSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Annotations => f.write_str("mcp annotations"),
            Self::NoAnnotations => f.write_str("no mcp annotations"),
            Self::HttpTool => f.write_str("[[tools.http]]"),
            Self::Server => f.write_str("[[tools.mcp]] server-wide setting"),
            Self::Override(key) => write!(f, "[tools.overrides.{key:?}]"),
        }
    }
}

/// Where each of a tool's two trust settings came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustOrigin {
    pub risk: RiskSource,
    pub requires_approval: RiskSource,
}

impl TrustOrigin {
    pub(crate) fn both(source: RiskSource) -> Self {
        Self {
            risk: source.clone(),
            requires_approval: source,
        }
    }
}

/// Applies every `[tools.overrides]` entry matching the tool, least
/// specific first (see `ToolsConfig::overrides_for`), and notes which key
/// set the trust settings.
pub(crate) fn apply_overrides(spec: &mut ToolSpec, origin: &mut TrustOrigin, cfg: &ToolsConfig) {
    for (key, o) in cfg.overrides_for(&spec.name) {
        apply_override(spec, o);
        note_override(origin, key, o);
    }
}

fn note_override(origin: &mut TrustOrigin, key: &str, o: &ToolOverride) {
    if o.risk.is_some() {
        origin.risk = RiskSource::Override(key.to_owned());
    }
    if o.requires_approval.is_some() {
        origin.requires_approval = RiskSource::Override(key.to_owned());
    }
}

/// Whether a call of the tool stops for a human before it runs: it says so
/// itself, or its risk reaches the policy's `approval_risk`. (Policy rules
/// may ask for approval of more calls, depending on their arguments.)
pub fn needs_approval(spec: &ToolSpec, approval_risk: Risk) -> bool {
    spec.requires_approval || spec.risk >= approval_risk
}

/// The two lists an operator checks after a start: the tools that wait for
/// approval, and the MCP tools whose risk is keel's default because their
/// server said nothing about them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustSummary {
    pub needs_approval: Vec<String>,
    pub unannotated: Vec<String>,
}

impl TrustSummary {
    pub fn of(
        tools: &[Arc<dyn Tool>],
        origins: &BTreeMap<String, TrustOrigin>,
        approval_risk: Risk,
    ) -> Self {
        let mut summary = Self::default();
        for tool in tools {
            let spec = tool.spec();
            if needs_approval(spec, approval_risk) {
                summary.needs_approval.push(spec.name.clone());
            }
            if origins
                .get(&spec.name)
                .is_some_and(|o| o.risk == RiskSource::NoAnnotations)
            {
                summary.unannotated.push(spec.name.clone());
            }
        }
        summary.needs_approval.sort();
        summary.unannotated.sort();
        summary
    }
}

/// What the configuration alone says about approval, for `keel check`,
/// which starts no MCP server: MCP tools are only known once their server
/// lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfiguredTrust {
    /// HTTP tools that need approval, then `<server>.*` for servers whose
    /// server-wide settings ask for it, then override keys under an MCP
    /// server's prefix that do.
    pub needs_approval: Vec<String>,
    /// Names of the MCP servers, whose tools are listed at start.
    pub mcp_servers: Vec<String>,
}

impl ConfiguredTrust {
    pub fn of(cfg: &ToolsConfig, approval_risk: Risk) -> Self {
        let mut needs = Vec::new();
        for http in &cfg.http {
            let mut spec = ToolSpec::new(http.name.clone(), String::new(), serde_json::json!({}));
            (spec.risk, spec.requires_approval) = crate::http::own_trust(http);
            let mut origin = TrustOrigin::both(RiskSource::HttpTool);
            apply_overrides(&mut spec, &mut origin, cfg);
            if needs_approval(&spec, approval_risk) {
                needs.push(spec.name);
            }
        }
        for server in &cfg.mcp {
            if server.requires_approval == Some(true)
                || server.risk.is_some_and(|r| r >= approval_risk)
            {
                needs.push(format!("{}.*", server.name));
            }
        }
        for (key, o) in &cfg.overrides {
            let under_server = cfg
                .mcp
                .iter()
                .any(|s| key.starts_with(&format!("{}.", s.name)));
            if under_server
                && (o.requires_approval == Some(true) || o.risk.is_some_and(|r| r >= approval_risk))
            {
                needs.push(key.clone());
            }
        }
        Self {
            needs_approval: needs,
            mcp_servers: cfg.mcp.iter().map(|s| s.name.clone()).collect(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn tools(toml_text: &str) -> ToolsConfig {
        let loaded = keel_config::load_str(toml_text, "keel.toml", &keel_config::MapEnv::new());
        loaded.unwrap().config.tools
    }

    #[test]
    fn overrides_layer_from_general_to_specific_and_name_the_key() {
        let cfg = tools(
            r#"
[tools.overrides."plant.*"]
risk = "read"
roles = ["viewer"]
[tools.overrides."plant.restart_*"]
requires_approval = true
[tools.overrides."plant.restart_furnace"]
risk = "dangerous"
"#,
        );
        let mut spec = ToolSpec::new("plant.restart_furnace", "", serde_json::json!({}));
        spec.risk = Risk::Write;
        let mut origin = TrustOrigin::both(RiskSource::NoAnnotations);
        apply_overrides(&mut spec, &mut origin, &cfg);
        assert_eq!((spec.risk, spec.requires_approval), (Risk::Dangerous, true));
        assert_eq!(
            spec.roles,
            vec!["viewer".to_string()],
            "a field only the glob sets holds"
        );
        assert_eq!(
            origin,
            TrustOrigin {
                risk: RiskSource::Override("plant.restart_furnace".into()),
                requires_approval: RiskSource::Override("plant.restart_*".into()),
            }
        );

        let mut other = ToolSpec::new("plant.batch_output", "", serde_json::json!({}));
        let mut origin = TrustOrigin::both(RiskSource::NoAnnotations);
        apply_overrides(&mut other, &mut origin, &cfg);
        assert_eq!((other.risk, other.requires_approval), (Risk::Read, false));
        assert_eq!(origin.risk, RiskSource::Override("plant.*".into()));
        assert_eq!(origin.requires_approval, RiskSource::NoAnnotations);
    }

    #[test]
    fn configured_trust_lists_what_configuration_decides() {
        let cfg = tools(
            r#"
[[tools.mcp]]
name = "plant"
command = "python3"
[[tools.mcp]]
name = "line"
command = "python3"
requires_approval = true
[[tools.mcp]]
name = "lab"
command = "python3"
risk = "dangerous"

[[tools.http]]
name = "furnace_status"
description = "d"
url = "http://127.0.0.1:1/"
risk = "read"
[[tools.http]]
name = "vent"
description = "d"
url = "http://127.0.0.1:1/"
[[tools.http]]
name = "purge"
description = "d"
url = "http://127.0.0.1:1/"
risk = "dangerous"

[tools.overrides.vent]
requires_approval = true
[tools.overrides."plant.restart_furnace"]
risk = "dangerous"
requires_approval = true
[tools.overrides."plant.*"]
risk = "read"
"#,
        );
        let trust = ConfiguredTrust::of(&cfg, Risk::Dangerous);
        assert_eq!(
            trust.needs_approval,
            ["vent", "purge", "line.*", "lab.*", "plant.restart_furnace"]
        );
        assert_eq!(trust.mcp_servers, ["plant", "line", "lab"]);
        let stricter = ConfiguredTrust::of(&cfg, Risk::Read);
        assert!(
            stricter
                .needs_approval
                .contains(&"furnace_status".to_string())
        );
    }
}
