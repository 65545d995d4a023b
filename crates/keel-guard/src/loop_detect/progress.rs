//! Which records of a [`CallHistory`](super::CallHistory) show progress:
//! their call returned something other than that call's previous run in
//! the window.
//!
//! `repeat` reads this on every check, and the run loop checks every call,
//! so working it out again from the whole window each time made every
//! check grow with the run. It is kept as the records come, and worked out
//! again only when the window drops records (the first run of a call left
//! in the window then has nothing to differ from) or is read back.

use std::collections::HashMap;

use super::CallRecord;

#[derive(Debug, Clone, Default)]
pub(super) struct Progress {
    /// One flag per record of the window, oldest first.
    changed: Vec<bool>,
    /// The latest outcome of each call fingerprint in the window.
    last: HashMap<String, String>,
}

impl Progress {
    pub(super) fn of(records: &[CallRecord]) -> Self {
        let mut progress = Self::default();
        for rec in records {
            progress.push(rec);
        }
        progress
    }

    /// Flags `rec`, appended to the window.
    pub(super) fn push(&mut self, rec: &CallRecord) {
        let changed = rec.outcome.as_deref().is_some_and(|outcome| {
            match self.last.get_mut(rec.call.as_str()) {
                Some(previous) if previous.as_str() == outcome => false,
                Some(previous) => {
                    outcome.clone_into(previous);
                    true
                }
                None => {
                    self.last.insert(rec.call.clone(), outcome.to_owned());
                    false
                }
            }
        });
        self.changed.push(changed);
    }

    /// The flags, one per record of the window, oldest first.
    pub(super) fn flags(&self) -> &[bool] {
        &self.changed
    }
}
