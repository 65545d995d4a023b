//! The process environment behind a trait, so loading can be tested without
//! touching the real environment, and the only ways secrets are read.

use std::collections::BTreeMap;

use secrecy::SecretString;

/// Where `KEEL_*` overrides and env-referenced secrets come from.
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
    fn vars(&self) -> Vec<(String, String)>;
}

/// The real process environment. Variables that are not valid Unicode are
/// treated as unset: no config value or secret can use them anyway.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn vars(&self) -> Vec<(String, String)> {
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect()
    }
}

/// A fixed environment, for tests and for embedding keel with a config
/// assembled in memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapEnv(pub BTreeMap<String, String>);

impl MapEnv {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one variable, builder style.
    pub fn with(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.0.insert(name.into(), value.into());
        self
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for MapEnv {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

impl Env for MapEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }

    fn vars(&self) -> Vec<(String, String)> {
        self.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

/// Reads a secret from the variable the config names. An empty value counts
/// as unset: an empty API key is never what anyone meant.
pub fn secret_from_env(env: &dyn Env, var: &str) -> Option<SecretString> {
    env.var(var)
        .filter(|v| !v.is_empty())
        .map(SecretString::from)
}

/// Expands `${VAR}` references (header values, MCP server environments).
/// `$${` stands for a literal `${`; a `$` not followed by `{` is kept as is.
/// The error names the first missing variable, or says what is malformed.
pub fn expand_env_refs(template: &str, env: &dyn Env) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    for piece in scan_refs(template)? {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Var(name) => match env.var(name) {
                Some(value) => out.push_str(&value),
                None => return Err(format!("environment variable {name} is not set")),
            },
        }
    }
    Ok(out)
}

/// The variable names a template references, or what is malformed about it.
pub(crate) fn referenced_vars(template: &str) -> Result<Vec<&str>, String> {
    Ok(scan_refs(template)?
        .into_iter()
        .filter_map(|p| match p {
            Piece::Var(name) => Some(name),
            Piece::Text(_) => None,
        })
        .collect())
}

enum Piece<'a> {
    Text(&'a str),
    Var(&'a str),
}

fn scan_refs(template: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        let after = &rest[at + 1..];
        if let Some(escaped) = after.strip_prefix("${") {
            pieces.push(Piece::Text(&rest[..at]));
            pieces.push(Piece::Text("${"));
            rest = escaped;
        } else if let Some(inner) = after.strip_prefix('{') {
            pieces.push(Piece::Text(&rest[..at]));
            let Some(end) = inner.find('}') else {
                return Err(format!("unclosed \"${{\" in {template:?}"));
            };
            let name = &inner[..end];
            if !is_var_name(name) {
                return Err(format!(
                    "\"${{{name}}}\" is not a valid environment variable reference"
                ));
            }
            pieces.push(Piece::Var(name));
            rest = &inner[end + 1..];
        } else {
            pieces.push(Piece::Text(&rest[..=at]));
            rest = after;
        }
    }
    pieces.push(Piece::Text(rest));
    Ok(pieces)
}

fn is_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

    fn env() -> MapEnv {
        MapEnv::new().with("TOKEN", "s3cret").with("EMPTY", "")
    }

    #[test]
    fn expands_references() {
        let e = env();
        assert_eq!(
            expand_env_refs("Bearer ${TOKEN}", &e).unwrap(),
            "Bearer s3cret"
        );
        assert_eq!(
            expand_env_refs("${TOKEN}/${TOKEN}", &e).unwrap(),
            "s3cret/s3cret"
        );
        assert_eq!(expand_env_refs("a${EMPTY}b", &e).unwrap(), "ab");
        assert_eq!(expand_env_refs("no refs", &e).unwrap(), "no refs");
        assert_eq!(expand_env_refs("costs $5", &e).unwrap(), "costs $5");
        assert_eq!(expand_env_refs("x$", &e).unwrap(), "x$");
    }

    #[test]
    fn escape_keeps_literal() {
        assert_eq!(
            expand_env_refs("$${TOKEN} is ${TOKEN}", &env()).unwrap(),
            "${TOKEN} is s3cret"
        );
    }

    #[test]
    fn missing_and_malformed_references_are_errors() {
        let e = env();
        let err = expand_env_refs("Bearer ${NOPE}", &e).unwrap_err();
        assert!(err.contains("NOPE"), "{err}");
        assert!(
            expand_env_refs("Bearer ${TOKEN", &e)
                .unwrap_err()
                .contains("unclosed")
        );
        assert!(expand_env_refs("${1X}", &e).is_err());
        assert!(expand_env_refs("${}", &e).is_err());
    }

    #[test]
    fn lists_referenced_vars() {
        assert_eq!(
            referenced_vars("${A}-$${B}-${C_2}").unwrap(),
            vec!["A", "C_2"]
        );
    }

    #[test]
    fn secrets_come_from_env() {
        let e = env();
        assert_eq!(
            secret_from_env(&e, "TOKEN").unwrap().expose_secret(),
            "s3cret"
        );
        assert!(secret_from_env(&e, "EMPTY").is_none());
        assert!(secret_from_env(&e, "MISSING").is_none());
    }

    #[test]
    fn process_env_reads_real_environment() {
        // PATH is set in every environment cargo runs tests in.
        assert!(ProcessEnv.var("PATH").is_some());
        assert!(ProcessEnv.vars().iter().any(|(k, _)| k == "PATH"));
    }
}
