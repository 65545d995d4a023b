//! Loading: parse, apply environment overrides, check the shape, build the
//! model, cross-check it. Each stage adds to one list of problems so a
//! single run reports everything that is wrong.

use std::path::Path;

use toml::de::DeTable;

use crate::env::Env;
use crate::findings::Findings;
use crate::model::Config;
use crate::problem::{ConfigErrors, Loaded, Problem, Severity};
use crate::tree::{KeyPath, Lines};
use crate::{overrides, schema, semantic, tree};

/// Loads a configuration file; `path` as given is how problems name it.
pub fn load_file(path: &Path, env: &dyn Env) -> Result<Loaded, ConfigErrors> {
    let origin = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => load_str(&text, &origin, env),
        Err(e) => Err(ConfigErrors(vec![Problem {
            severity: Severity::Error,
            key: String::new(),
            location: Some(origin),
            message: format!("cannot read the configuration file: {e}"),
        }])),
    }
}

/// Loads configuration text; `origin` names it in problem locations
/// (`keel.toml:23:1`).
pub fn load_str(text: &str, origin: &str, env: &dyn Env) -> Result<Loaded, ConfigErrors> {
    let lines = Lines::new(text);
    let (doc, syntax_errors) = DeTable::parse_recoverable(text);
    if !syntax_errors.is_empty() {
        // What the parser recovered is not what was meant, so checking its
        // keys would only add noise: report the syntax and stop.
        let problems = syntax_errors
            .iter()
            .map(|e| Problem {
                severity: Severity::Error,
                key: String::new(),
                location: Some(lines.origin(e.span().map_or(0, |s| s.start)).render(origin)),
                message: format!("TOML syntax error: {}", e.message().trim_end()),
            })
            .collect();
        return Err(ConfigErrors(problems));
    }

    let mut found = Findings::new(origin);
    let mut root = tree::from_document(&doc, &lines);
    overrides::apply(&mut root, env, &mut found);
    schema::check_root(&mut root, &mut found);

    let config: Config = match root.to_toml().try_into() {
        Ok(config) => config,
        Err(e) => {
            // The schema walk should have caught anything serde rejects; if
            // the two ever disagree, say so rather than lose the problem.
            found.error(
                &KeyPath::root(),
                None,
                format!("configuration does not match the model: {e}"),
            );
            return Err(ConfigErrors(found.into_problems()));
        }
    };
    semantic::check(&config, env, &mut found);

    if found.has_errors() {
        Err(ConfigErrors(found.into_problems()))
    } else {
        Ok(Loaded {
            config,
            warnings: found.into_problems(),
        })
    }
}
