//! What loading found wrong. Problems are plain data so `keel check`, the
//! server's startup log and tests can all present them their own way.

use std::fmt;

use crate::model::Config;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

/// One thing wrong with a configuration, named by its key path so that a
/// person can find it without reading the whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub severity: Severity,
    /// Dotted key path such as `agents[0].limits.max_steps` or
    /// `tools.overrides."plant.restart_furnace".risk`; empty for problems
    /// that belong to no key (a syntax error, an unreadable file).
    pub key: String,
    /// `keel.toml:23:1` for a place in the file, `env KEEL_…` for a value
    /// that came from an environment override.
    pub location: Option<String>,
    pub message: String,
}

impl Problem {
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(location) = &self.location {
            write!(f, "{location}: ")?;
        }
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        f.write_str(&self.message)
    }
}

/// A configuration that loaded, with what was merely suspicious about it.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub warnings: Vec<Problem>,
}

/// Every problem found when a configuration did not load: the errors and,
/// so that one report tells the whole story, the warnings too.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<Problem>);

impl ConfigErrors {
    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.0.iter().filter(|p| p.is_error())
    }

    pub fn warnings(&self) -> impl Iterator<Item = &Problem> {
        self.0.iter().filter(|p| !p.is_error())
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_place_key_and_message() {
        let p = Problem {
            severity: Severity::Error,
            key: "agents[0].provider".into(),
            location: Some("keel.toml:23:1".into()),
            message: "no provider named \"mian\" (known: main)".into(),
        };
        assert_eq!(
            p.to_string(),
            "keel.toml:23:1: agents[0].provider: no provider named \"mian\" (known: main)"
        );
        let w = Problem {
            severity: Severity::Warning,
            key: String::new(),
            location: None,
            message: "m".into(),
        };
        assert_eq!(w.to_string(), "warning: m");
        let all = ConfigErrors(vec![p, w]);
        assert_eq!(all.to_string().lines().count(), 2);
        assert_eq!(all.errors().count(), 1);
    }
}
