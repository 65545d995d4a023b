//! The text `keel check` prints.

use crate::problem::{ConfigErrors, Loaded};

/// Every problem on its own line, then one summary line.
pub fn render_report(origin: &str, result: &Result<Loaded, ConfigErrors>) -> String {
    let mut out = String::new();
    match result {
        Ok(loaded) => {
            for w in &loaded.warnings {
                out.push_str(&format!("{w}\n"));
            }
            let c = &loaded.config;
            let counts = [
                count(c.providers.len(), "provider", "providers"),
                count(c.agents.len(), "agent", "agents"),
                count(c.tools.mcp.len(), "mcp server", "mcp servers"),
                count(c.tools.http.len(), "http tool", "http tools"),
                count(c.tools.overrides.len(), "tool override", "tool overrides"),
                count(c.auth.keys.len(), "api key", "api keys"),
            ];
            out.push_str(&format!("{origin}: OK ({})", counts.join(", ")));
            if !loaded.warnings.is_empty() {
                out.push_str(&format!(
                    ", {}",
                    count(loaded.warnings.len(), "warning", "warnings")
                ));
            }
            out.push('\n');
        }
        Err(errors) => {
            for p in &errors.0 {
                out.push_str(&format!("{p}\n"));
            }
            let e = errors.errors().count();
            let w = errors.warnings().count();
            out.push_str(&format!("{origin}: {}", count(e, "error", "errors")));
            if w > 0 {
                out.push_str(&format!(", {}", count(w, "warning", "warnings")));
            }
            out.push('\n');
        }
    }
    out
}

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
