//! What one load has found so far, and where each key came from, so later
//! passes can point at the right line without re-walking the tree.

use std::collections::{BTreeMap, BTreeSet};

use crate::problem::{Problem, Severity};
use crate::tree::{KeyPath, Origin};

pub(crate) struct Findings {
    file: String,
    problems: Vec<(Option<Origin>, Problem)>,
    origins: BTreeMap<String, Origin>,
    /// Keys whose value was wrong and replaced by a placeholder; later checks
    /// skip them so one mistake is reported once.
    invalid: BTreeSet<String>,
}

impl Findings {
    pub(crate) fn new(file: &str) -> Self {
        Self {
            file: file.to_string(),
            problems: Vec::new(),
            origins: BTreeMap::new(),
            invalid: BTreeSet::new(),
        }
    }

    pub(crate) fn error(&mut self, key: &KeyPath, origin: Option<&Origin>, message: String) {
        self.push(Severity::Error, key, origin, message);
    }

    pub(crate) fn warning(&mut self, key: &KeyPath, origin: Option<&Origin>, message: String) {
        self.push(Severity::Warning, key, origin, message);
    }

    fn push(
        &mut self,
        severity: Severity,
        key: &KeyPath,
        origin: Option<&Origin>,
        message: String,
    ) {
        let problem = Problem {
            severity,
            key: key.render(),
            location: origin.map(|o| o.render(&self.file)),
            message,
        };
        self.problems.push((origin.cloned(), problem));
    }

    /// An error at a key the tree has seen, located at that key or, for a
    /// default value, at the nearest enclosing key that was written.
    pub(crate) fn error_at(&mut self, key: &KeyPath, message: String) {
        let origin = self.origin_of(key);
        self.error(key, origin.as_ref(), message);
    }

    pub(crate) fn warning_at(&mut self, key: &KeyPath, message: String) {
        let origin = self.origin_of(key);
        self.warning(key, origin.as_ref(), message);
    }

    pub(crate) fn record(&mut self, key: &KeyPath, origin: &Origin) {
        self.origins.insert(key.render(), origin.clone());
    }

    pub(crate) fn origin_of(&self, key: &KeyPath) -> Option<Origin> {
        let mut at = Some(key.clone());
        while let Some(path) = at {
            if let Some(origin) = self.origins.get(&path.render()) {
                return Some(origin.clone());
            }
            at = path.parent();
        }
        None
    }

    /// A location string for messages that point at a second place.
    pub(crate) fn location_of(&self, key: &KeyPath) -> Option<String> {
        self.origin_of(key).map(|o| o.render(&self.file))
    }

    pub(crate) fn mark_invalid(&mut self, key: &KeyPath) {
        self.invalid.insert(key.render());
    }

    pub(crate) fn is_invalid(&self, key: &KeyPath) -> bool {
        self.invalid.contains(&key.render())
    }

    pub(crate) fn has_errors(&self) -> bool {
        self.problems.iter().any(|(_, p)| p.is_error())
    }

    /// Problems in file order, then those from environment overrides, then
    /// those that belong to no place.
    pub(crate) fn into_problems(mut self) -> Vec<Problem> {
        self.problems.sort_by(|(a, _), (b, _)| match (a, b) {
            (Some(a), Some(b)) => a.cmp(b),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        });
        self.problems.into_iter().map(|(_, p)| p).collect()
    }
}
