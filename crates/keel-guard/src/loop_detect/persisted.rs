//! How a [`CallHistory`] is stored. Its counters are JSON in the run's loop
//! state, written with every commit of the run. Its records are not: each
//! is handed to the store once, by the commit that follows it
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
    /// Records that left the window before they were stored are not.
    pub fn take_unstored(&mut self) -> Vec<StoredCall> {
        // The newest `recorded - stored` records are the unstored ones, as
        // many of them as the window still holds.
        let new = self.recorded.saturating_sub(self.stored) as usize;
        let start = self.records.len().saturating_sub(new);
        // Places start at 1: the window's first record is the one after
        // those that left it.
        let first = u64::from(self.recorded).saturating_sub(self.records.len() as u64) + 1;
        let encoded = self.encoded.for_records(&self.records);
        let mut out = Vec::with_capacity(self.records.len() - start);
        for (i, rec) in self.records.iter().enumerate().skip(start) {
            let record = match encoded {
                Some(encoded) => encoded[i].get().to_owned(),
                None => match serde_json::to_string(rec) {
                    Ok(text) => text,
                    // Cannot happen for the history's own types; the
                    // record is then left out of the stored history.
                    Err(_) => continue,
                },
            };
            out.push(StoredCall {
                n: first + i as u64,
                record,
            });
        }
        self.stored = self.recorded;
        out
    }

    /// Whether the history was loaded from a state that keeps its records
    /// apart, and still lacks them: a history with calls always holds the
    /// latest of them in its window otherwise.
    pub fn awaits_records(&self) -> bool {
        self.records.is_empty() && self.recorded > 0
    }

    /// Puts back the records of the stored history: the store's last ones
    /// (at most [`super::HISTORY_WINDOW`]), oldest first.
    pub fn restore(&mut self, stored: Vec<StoredCall>) -> Result<(), BadRecord> {
        let mut records = Vec::with_capacity(stored.len());
        let mut encoded = Vec::with_capacity(stored.len());
        let skip = stored.len().saturating_sub(super::HISTORY_WINDOW);
        for StoredCall { n, record } in stored.into_iter().skip(skip) {
            let rec: CallRecord =
                serde_json::from_str(&record).map_err(|source| BadRecord { n, source })?;
            let raw = RawValue::from_string(record).map_err(|source| BadRecord { n, source })?;
            records.push(rec);
            encoded.push(raw);
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
        let mut s = serializer.serialize_struct("CallHistory", 3)?;
        s.serialize_field("recorded", &self.recorded)?;
        s.serialize_field("executed", &self.executed)?;
        s.serialize_field("outcomes", &self.outcomes)?;
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
    outcomes: BTreeMap<String, u32>,
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
        Ok(CallHistory {
            encoded: EncodedRecords::of(&records),
            progress: super::progress::Progress::of(&records),
            records,
            recorded,
            executed,
            outcomes,
            stored,
        })
    }
}
