//! How a [`CallHistory`] is stored: as JSON, with the run's loop state, on
//! every commit of the run.
//!
//! Encoding every record again on each commit made saving the history grow
//! with the run: at fifty calls it was most of the cost of writing the
//! loop state. Each record is encoded once, when it is recorded, and the
//! history writes the kept text; the JSON is the same as the records'
//! own serialization.

use std::collections::BTreeMap;

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
            // The history is then encoded whole, as it was before.
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

impl Serialize for CallHistory {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("CallHistory", 4)?;
        match self.encoded.for_records(&self.records) {
            Some(encoded) => s.serialize_field("records", encoded)?,
            None => s.serialize_field("records", &self.records)?,
        }
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
    records: Vec<CallRecord>,
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
        Ok(CallHistory {
            encoded: EncodedRecords::of(&records),
            progress: super::progress::Progress::of(&records),
            records,
            recorded,
            executed,
            outcomes,
        })
    }
}
