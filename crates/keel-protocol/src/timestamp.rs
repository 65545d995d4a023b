//! Event timestamps written as JSON without chrono's formatting machinery.
//!
//! Every event carries its `ts`, and chrono's `Serialize` goes through
//! `Display` and `fmt::Write` for each one, a cost of the same order as the
//! rest of a small event. This writes the same text directly: RFC 3339 in
//! UTC with the fraction chrono would print (none, or 3, 6 or 9 digits).
//! What it does not cover (years outside 0–9999, leap seconds) is left to
//! chrono.

use chrono::{DateTime, Datelike, Timelike, Utc};
use serde::Serializer;

/// `serialize_with` for a `DateTime<Utc>` field: the text chrono's own
/// `Serialize` writes.
pub(crate) fn serialize<S: Serializer>(
    ts: &DateTime<Utc>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut buf = [0u8; 30];
    match write(ts, &mut buf) {
        Some(text) => serializer.serialize_str(text),
        None => serde::Serialize::serialize(ts, serializer),
    }
}

/// `value` as `width` decimal digits, zero-padded, at `buf[at..]`.
fn put(buf: &mut [u8; 30], at: usize, value: u32, width: usize) {
    let mut rest = value;
    for slot in buf[at..at + width].iter_mut().rev() {
        *slot = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.fff[fff[fff]]]Z` into `buf`, or `None` where the
/// value needs chrono's general formatting.
fn write<'a>(ts: &DateTime<Utc>, buf: &'a mut [u8; 30]) -> Option<&'a str> {
    let year = u32::try_from(ts.year()).ok().filter(|y| *y <= 9999)?;
    let nanos = ts.nanosecond();
    if nanos >= 1_000_000_000 {
        return None; // a leap second
    }
    put(buf, 0, year, 4);
    buf[4] = b'-';
    put(buf, 5, ts.month(), 2);
    buf[7] = b'-';
    put(buf, 8, ts.day(), 2);
    buf[10] = b'T';
    put(buf, 11, ts.hour(), 2);
    buf[13] = b':';
    put(buf, 14, ts.minute(), 2);
    buf[16] = b':';
    put(buf, 17, ts.second(), 2);
    let width = if nanos == 0 {
        0
    } else if nanos.is_multiple_of(1_000_000) {
        3
    } else if nanos.is_multiple_of(1_000) {
        6
    } else {
        9
    };
    let mut at = 19;
    if width > 0 {
        buf[19] = b'.';
        put(buf, 20, nanos / 10u32.pow(9 - width as u32), width);
        at = 20 + width;
    }
    buf[at] = b'Z';
    std::str::from_utf8(&buf[..=at]).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use chrono::TimeZone;

    #[derive(serde::Serialize)]
    struct Ours(#[serde(serialize_with = "serialize")] DateTime<Utc>);

    fn same_as_chrono(ts: DateTime<Utc>) {
        assert_eq!(
            serde_json::to_string(&Ours(ts)).unwrap(),
            serde_json::to_string(&ts).unwrap(),
            "{ts:?}"
        );
    }

    #[test]
    fn the_text_is_chronos_for_every_kind_of_fraction() {
        let base = Utc.with_ymd_and_hms(2026, 11, 26, 7, 36, 4).unwrap();
        for nanos in [
            0,
            1,
            7_000,
            93_207_000,
            93_000_000,
            93_207_123,
            100_000_000,
            999_999_999,
        ] {
            same_as_chrono(base + chrono::Duration::nanoseconds(nanos));
        }
        same_as_chrono(Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0).unwrap());
        same_as_chrono(Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap());
        same_as_chrono(keel_now());
    }

    #[test]
    fn what_it_does_not_cover_is_left_to_chrono() {
        // Beyond year 9999, and a leap second.
        same_as_chrono(Utc.with_ymd_and_hms(10_000, 1, 1, 0, 0, 0).unwrap());
        let leap = chrono::NaiveDate::from_ymd_opt(2016, 12, 31)
            .unwrap()
            .and_hms_nano_opt(23, 59, 59, 1_500_000_000)
            .unwrap()
            .and_utc();
        same_as_chrono(leap);
        let mut buf = [0u8; 30];
        assert!(write(&leap, &mut buf).is_none());
    }

    fn keel_now() -> DateTime<Utc> {
        crate::now()
    }
}
