//! The `body` of an `events` or a `messages` row, and the `messages` of an
//! `events` row: one commit's events, or one commit's messages, one JSON
//! object per line, stored LZ4-compressed when that makes it smaller.
//!
//! A tool turn's events come to about 1.5 KB of text and its messages to
//! about 600 bytes; with 2 KiB pages, a row per commit of either took much
//! of a page of its own: a new leaf, a new entry in the table's interior
//! page and a new page count in the header page, pages of the commit's WAL
//! frames, and more pages for the checkpoint to copy back. The lines repeat
//! ids, times and field names, so LZ4 makes them about half as long and
//! several commits share a leaf. Rows written as text (by earlier
//! versions, or when compressing would not shrink them) are read as they
//! are: SQLite keeps each value's own type, so a text body and a compressed
//! blob tell themselves apart. Compact JSON has no line break of its own (a
//! string's is escaped), so a line is always one whole object.

use std::borrow::Cow;

use rusqlite::types::{Value, ValueRef};

use keel_protocol::StoreError;

/// Bodies shorter than this stay text: a small one gains no page.
const COMPRESS_FROM: usize = 512;

/// The largest text a compressed body may claim to expand to. A commit's
/// events are bounded far below this; a larger claim is a damaged row, and
/// is refused before anything is allocated for it.
const MAX_TEXT: usize = 256 * 1024 * 1024;

/// The value to store for a commit's events or messages text.
pub(super) fn encode(text: String) -> Value {
    if text.len() >= COMPRESS_FROM {
        let packed = lz4_flex::block::compress_prepend_size(text.as_bytes());
        if packed.len() < text.len() {
            return Value::Blob(packed);
        }
    }
    Value::Text(text)
}

/// The text of a stored body, text or compressed; `what` names the table
/// in the error of a damaged row.
pub(super) fn decode<'a>(body: ValueRef<'a>, what: &str) -> Result<Cow<'a, str>, StoreError> {
    match body {
        ValueRef::Text(bytes) => std::str::from_utf8(bytes)
            .map(Cow::Borrowed)
            .map_err(|e| damaged(what, format!("its text is not UTF-8: {e}"))),
        ValueRef::Blob(packed) => String::from_utf8(unpack(packed, what)?)
            .map(Cow::Owned)
            .map_err(|e| damaged(what, format!("its text is not UTF-8: {e}"))),
        other => Err(damaged(
            what,
            format!(
                "its body is {:?}, neither text nor a compressed blob",
                other.data_type()
            ),
        )),
    }
}

/// The bytes of a compressed body: its size prefix read and bounded first,
/// then the block expanded to that size.
fn unpack(packed: &[u8], what: &str) -> Result<Vec<u8>, StoreError> {
    let unreadable = |e| damaged(what, format!("its compressed form is unreadable: {e}"));
    let (len, block) = lz4_flex::block::uncompressed_size(packed).map_err(unreadable)?;
    if len > MAX_TEXT {
        return Err(damaged(
            what,
            format!("it claims {len} bytes of text, more than the {MAX_TEXT} a row may hold"),
        ));
    }
    lz4_flex::block::decompress(block, len).map_err(unreadable)
}

fn damaged(what: &str, why: String) -> StoreError {
    StoreError::Backend(format!("a stored {what} row is damaged: {why}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn roundtrip(text: &str) -> (Value, String) {
        let stored = encode(text.to_owned());
        let back = decode(ValueRef::from(&stored), "events")
            .unwrap()
            .into_owned();
        (stored, back)
    }

    #[test]
    fn a_turns_events_are_stored_compressed_and_read_back_whole() {
        let line = r#"{"run_id":"run_01a223e84ec270c3a86ba2e4aa47dc9b","seq":93,"ts":"2026-11-28T20:45:56.805419191Z","type":"policy_decision","step":16,"decision":"execute"}"#;
        let text = [line; 6].join("\n");
        let (stored, back) = roundtrip(&text);
        assert!(
            matches!(&stored, Value::Blob(packed) if packed.len() * 2 < text.len()),
            "{} bytes of text stored as {stored:?}",
            text.len()
        );
        assert_eq!(back, text);
    }

    #[test]
    fn short_or_incompressible_text_stays_text() {
        let (stored, back) = roundtrip(r#"{"seq":1}"#);
        assert_eq!(stored, Value::Text(r#"{"seq":1}"#.into()));
        assert_eq!(back, r#"{"seq":1}"#);
        // Pseudo-random printable text (xorshift): LZ4 cannot shrink it.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let noise: String = (0..2000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'!' + (x % 90) as u8)
            })
            .collect();
        let (stored, back) = roundtrip(&noise);
        assert!(matches!(stored, Value::Text(_)), "{stored:?}");
        assert_eq!(back, noise);
    }

    #[test]
    fn a_damaged_blob_is_an_error_that_says_so() {
        let mut packed = lz4_flex::block::compress_prepend_size(&[b'a'; 4096]);
        packed.truncate(packed.len() - 3);
        let e = decode(ValueRef::Blob(&packed), "messages")
            .unwrap_err()
            .to_string();
        assert!(e.contains("stored messages row is damaged"), "{e}");
        // A size header claiming 4 GiB is refused before allocating.
        let e = decode(ValueRef::Blob(&[0xff, 0xff, 0xff, 0xff, 0]), "events")
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than"), "{e}");
        let e = decode(ValueRef::Integer(7), "events")
            .unwrap_err()
            .to_string();
        assert!(e.contains("neither text"), "{e}");
    }
}
