//! Who is calling.

use serde::{Deserialize, Serialize};

/// The caller behind an API key: everything it touches is scoped by `tenant`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    pub tenant: String,
    pub id: String,
    #[serde(default)]
    pub roles: Vec<String>,
}

impl Principal {
    /// The single tenant served when no API keys are configured.
    pub fn local_default() -> Self {
        Self {
            tenant: "default".into(),
            id: "local".into(),
            roles: Vec::new(),
        }
    }

    pub fn has_any_role(&self, roles: &[String]) -> bool {
        roles.iter().any(|r| self.roles.contains(r))
    }
}
