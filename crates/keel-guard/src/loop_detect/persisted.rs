//! How a [`CallHistory`] is stored. Its two counters are JSON in the run's
//! loop state, written with every commit of the run. Its records are not:
//! each is handed to the store once, by the commit that follows it
//! ([`CallHistory::take_unstored`]), and the store keeps them beside the
//! run, whence they are put back when the run is loaded
//! ([`CallHistory::restore`]).
//!
//! Written whole with the state, the records made every commit grow with
//! the run: about 120 bytes a call, so past some thirty calls the run's row
//! no longer fitted its page, and each commit also rewrote the overflow.
//! A state stored that way (by an earlier version) still loads: its records
//! are in it, and its next commit hands them to the store.
//!
//! The outcome counters of the identical-outcomes breaker grew the same
//! way: one entry per distinct result, about 30 bytes each, serialized and
//! written at every commit (half the instructions of preparing a commit in
//! a fifty-call run). Every record carries its outcome and every record is
//! stored, so the counters are counted again from the stored records when
//! the run is loaded; a state from an earlier version, which holds them,
//! loads them as they are.
//!
//! Each record is encoded once, when it is recorded; the store gets that
//! text, the JSON of the record's own serialization.

use std::collections::BTreeMap;

use keel_protocol::StoredCall;
use serde::{Deserialize, Deserializer, Serialize, Serializer, ser::SerializeStruct};
use serde_json::value::{RawValue, to_raw_value};

use super::{CallHistory, CallRecord};

/// The JSON of each record of the window, oldest first; used only while
/// it has exactly one entry per record (it always does, unless a record
/// failed to encode, which the history's own types cannot).
#[derive(Debug, Clone, Default)]
pub(super) struct EncodedRecords(Vec<Box<RawValue>>);

impl EncodedRecords {
    /// Encodes `rec`, about to be appended to `records`.
    pub(super) fn push(&mut self, records: &[CallRecord], rec: &CallRecord) {
        if self.0.len() != records.len() {
            return;
        }
        match to_raw_value(rec) {
            Ok(raw) => self.0.push(raw),
            // Each record is then encoded when it is stored.
            Err(_) => self.0.clear(),
        }
    }

    /// Drops the `n` oldest, as the window does with its records.
    pub(super) fn drop_oldest(&mut self, n: usize) {
        self.0.drain(..n.min(self.0.len()));
    }

    fn for_records<'a>(&'a self, records: &[CallRecord]) -> Option<&'a [Box<RawValue>]> {
        (self.0.len() == records.len()).then_some(&self.0[..])
    }

    fn of(records: &[CallRecord]) -> Self {
        records
            .iter()
            .map(to_raw_value)
            .collect::<Result<Vec<_>, _>>()
            .map_or_else(|_| Self::default(), Self)
    }
}

/// A stored record that does not read back as one.
#[derive(Debug, thiserror::Error)]
#[error("call record {n} of the stored history is not valid: {source}")]
pub struct BadRecord {
    pub n: u64,
    #[source]
    pub source: serde_json::Error,
}

impl CallHistory {
    /// The records made since the last call, each with its place among the
    /// run's calls, for the commit that stores the state they counted in.
    pub fn take_unstored(&mut self) -> Vec<StoredCall> {
        // The newest `recorded - stored` records are the unstored ones:
        // those still in the window, after those that already left it.
        let new = self.recorded.saturating_sub(self.stored) as usize;
        let start = self.records.len().saturating_sub(new);
        let mut out = std::mem::take(&mut self.overflow);
        out.reserve(self.records.len() - start);
        for (i, rec) in self.records.iter().enumerate().skip(start) {
            if let Some(record) = self.encoded_at(i, rec) {
                out.push(StoredCall {
                    n: self.place_of(i),
                    record,
                });
            }
        }
        self.stored = self.recorded;
        out
    }

    /// Keeps, for the next commit, the unstored ones among the `excess`
    /// oldest records, about to leave the window.
    pub(super) fn keep_unstored_leaving(&mut self, excess: usize) {
        for i in 0..excess.min(self.records.len()) {
            let n = self.place_of(i);
            if n <= u64::from(self.stored) {
                continue;
            }
            if let Some(record) = self.encoded_at(i, &self.records[i]) {
                self.overflow.push(StoredCall { n, record });
            }
        }
    }

    /// The place among the run's calls of the window's `i`-th record.
    /// Places start at 1: the window's first record is the one after
    /// those that left it.
    fn place_of(&self, i: usize) -> u64 {
        u64::from(self.recorded).saturating_sub(self.records.len() as u64) + 1 + i as u64
    }

    /// The JSON of the window's `i`-th record, `rec`.
    fn encoded_at(&self, i: usize, rec: &CallRecord) -> Option<String> {
        match self.encoded.for_records(&self.records) {
            Some(encoded) => Some(encoded[i].get().to_owned()),
            // Cannot fail for the history's own types; the record is then
            // left out of the stored history.
            None => serde_json::to_string(rec).ok(),
        }
    }

    /// Whether the history was loaded from a state that keeps its records
    /// apart, and still lacks them: a history with calls always holds the
    /// latest of them in its window otherwise.
    pub fn awaits_records(&self) -> bool {
        self.records.is_empty() && self.recorded > 0
    }

    /// How many of the run's stored records [`Self::restore`] needs, the
    /// latest first: all of them when the outcome counters are to be
    /// counted again, else those of the window.
    pub fn records_to_restore(&self) -> u32 {
        if self.outcomes_unloaded {
            u32::MAX
        } else {
            u32::try_from(super::HISTORY_WINDOW).unwrap_or(u32::MAX)
        }
    }

    /// Puts back the records of the stored history, oldest first: the
    /// window keeps the last [`super::HISTORY_WINDOW`]; the outcome
    /// counters, when the state did not hold them, are counted over all
    /// (the run's every record, as [`Self::records_to_restore`] asks).
    pub fn restore(&mut self, stored: Vec<StoredCall>) -> Result<(), BadRecord> {
        let skip = stored.len().saturating_sub(super::HISTORY_WINDOW);
        let mut records = Vec::with_capacity(stored.len() - skip);
        let mut encoded = Vec::with_capacity(stored.len() - skip);
        let recount = self.outcomes_unloaded;
        let mut outcomes = BTreeMap::new();
        for (i, StoredCall { n, record }) in stored.into_iter().enumerate() {
            if i < skip && !recount {
                continue;
            }
            let rec: CallRecord =
                serde_json::from_str(&record).map_err(|source| BadRecord { n, source })?;
            if recount {
                super::count_outcome(&mut outcomes, &rec);
            }
            if i >= skip {
                let raw =
                    RawValue::from_string(record).map_err(|source| BadRecord { n, source })?;
                records.push(rec);
                encoded.push(raw);
            }
        }
        if recount {
            self.outcomes = outcomes;
            self.outcomes_unloaded = false;
        }
        self.progress = super::progress::Progress::of(&records);
        self.encoded = EncodedRecords(encoded);
        self.records = records;
        self.stored = self.recorded;
        Ok(())
    }
}

impl Serialize for CallHistory {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("CallHistory", 2)?;
        s.serialize_field("recorded", &self.recorded)?;
        s.serialize_field("executed", &self.executed)?;
        s.end()
    }
}

/// The stored form, every field optional (an older or empty one loads).
#[derive(Default, Deserialize)]
#[serde(default)]
struct Stored {
    /// Present only in a state stored by an earlier version.
    records: Option<Vec<CallRecord>>,
    recorded: u32,
    executed: u32,
    /// Present only in a state stored by an earlier version.
    outcomes: Option<BTreeMap<String, u32>>,
}

impl<'de> Deserialize<'de> for CallHistory {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Stored {
            records,
            recorded,
            executed,
            outcomes,
        } = Stored::deserialize(deserializer)?;
        let (records, stored) = match records {
            // Stored inside the state: none of them is in the store yet.
            Some(records) => {
                let stored = recorded.saturating_sub(records.len() as u32);
                (records, stored)
            }
            None => (Vec::new(), recorded),
        };
        // Without its counters, a state that holds its records counts them
        // from those; one that does not waits for the store's.
        let outcomes_unloaded = outcomes.is_none() && records.is_empty() && recorded > 0;
        let outcomes = outcomes.unwrap_or_else(|| {
            let mut counted = BTreeMap::new();
            for rec in &records {
                super::count_outcome(&mut counted, rec);
            }
            counted
        });
        Ok(CallHistory {
            encoded: EncodedRecords::of(&records),
            progress: super::progress::Progress::of(&records),
            records,
            recorded,
            executed,
            outcomes,
            outcomes_unloaded,
            overflow: Vec::new(),
            stored,
        })
    }
}
