//! The `body` of an `events` row: one commit's events, one JSON object per
//! line, stored LZ4-compressed when that makes it smaller.
//!
//! A tool turn's events come to about 1.5 KB of text, more than half of a
//! 2 KiB page, so every commit took a page of its own for them: a new leaf,
//! a new entry in the table's interior page and a new page count in the
//! header page, three pages of the commit's WAL frames, and one more page
//! for the checkpoint to copy back. The lines repeat the run id, the time
//! and the field names, so LZ4 makes them less than half as long and two or
//! three commits share a leaf. Rows written as text (before this, or when
//! compressing would not shrink them) are read as they are: SQLite keeps
//! each value's own type, so a text body and a compressed blob tell
//! themselves apart.

use std::borrow::Cow;

use rusqlite::types::{Value, ValueRef};

use keel_protocol::StoreError;

/// Bodies shorter than this stay text: a small one gains no page.
const COMPRESS_FROM: usize = 512;

/// The largest text a compressed body may claim to expand to. A commit's
/// events are bounded far below this; a larger claim is a damaged row, and
/// is refused before anything is allocated for it.
const MAX_TEXT: usize = 256 * 1024 * 1024;

/// The value to store for a commit's events text.
pub(super) fn encode(text: String) -> Value {
    if text.len() >= COMPRESS_FROM {
        let packed = lz4_flex::block::compress_prepend_size(text.as_bytes());
        if packed.len() < text.len() {
            return Value::Blob(packed);
        }
    }
    Value::Text(text)
}

/// The events text of a stored body, text or compressed.
pub(super) fn decode(body: ValueRef<'_>) -> Result<Cow<'_, str>, StoreError> {
    match body {
        ValueRef::Text(bytes) => std::str::from_utf8(bytes)
            .map(Cow::Borrowed)
            .map_err(|e| damaged(format!("its text is not UTF-8: {e}"))),
        ValueRef::Blob(packed) => String::from_utf8(unpack(packed)?)
            .map(Cow::Owned)
            .map_err(|e| damaged(format!("its text is not UTF-8: {e}"))),
        other => Err(damaged(format!(
            "its body is {:?}, neither text nor a compressed blob",
            other.data_type()
        ))),
    }
}

/// The bytes of a compressed body: its size prefix read and bounded first,
/// then the block expanded to that size.
fn unpack(packed: &[u8]) -> Result<Vec<u8>, StoreError> {
    let unreadable = |e| damaged(format!("its compressed form is unreadable: {e}"));
    let (len, block) = lz4_flex::block::uncompressed_size(packed).map_err(unreadable)?;
    if len > MAX_TEXT {
        return Err(damaged(format!(
            "it claims {len} bytes of text, more than the {MAX_TEXT} a row may hold"
        )));
    }
    lz4_flex::block::decompress(block, len).map_err(unreadable)
}

fn damaged(why: String) -> StoreError {
    StoreError::Backend(format!("a stored events row is damaged: {why}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn roundtrip(text: &str) -> (Value, String) {
        let stored = encode(text.to_owned());
        let back = decode(ValueRef::from(&stored)).unwrap().into_owned();
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
        let e = decode(ValueRef::Blob(&packed)).unwrap_err().to_string();
        assert!(e.contains("damaged"), "{e}");
        // A size header claiming 4 GiB is refused before allocating.
        let e = decode(ValueRef::Blob(&[0xff, 0xff, 0xff, 0xff, 0]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than"), "{e}");
        let e = decode(ValueRef::Integer(7)).unwrap_err().to_string();
        assert!(e.contains("neither text"), "{e}");
    }
}
