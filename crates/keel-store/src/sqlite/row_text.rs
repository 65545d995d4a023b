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
//!
//! A commit's messages repeat much of its events' text (the tool's output,
//! the call's id and arguments), so in an events row they are compressed
//! with the row's events text as LZ4's dictionary (schema v13): a tool
//! turn's row then comes to about 900 bytes instead of 1,250, two rows
//! share a 2 KiB leaf, and every other commit adds no page (nor the header
//! page's new page count, nor the interior page's new entry) to the WAL.
//! Such a value's size prefix has its top bit set ([`AGAINST_EVENTS`]);
//! a size never reaches it, so values written before tell themselves apart.

use std::borrow::Cow;

use rusqlite::types::{Value, ValueRef};

use keel_protocol::StoreError;

/// Bodies shorter than this stay text: a small one gains no page.
const COMPRESS_FROM: usize = 512;

/// The largest text a compressed body may claim to expand to. A commit's
/// events are bounded far below this; a larger claim is a damaged row, and
/// is refused before anything is allocated for it.
const MAX_TEXT: usize = 256 * 1024 * 1024;

/// Messages shorter than this stay text in an events row. Against their
/// events, a tool turn's messages (about 500 bytes) shrink to about a third:
/// the bytes that let two rows share a leaf.
const AGAINST_FROM: usize = 64;

/// Set in the size prefix of messages compressed against their row's
/// events text. [`MAX_TEXT`] keeps every real size below it.
const AGAINST_EVENTS: u32 = 1 << 31;

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

/// The value to store for a commit's messages in the events row whose
/// events text is `events`: compressed with that text as the dictionary
/// when that makes it smaller.
pub(super) fn encode_against(text: String, events: &str) -> Value {
    if text.len() >= AGAINST_FROM {
        // Sizes are bounded far below `AGAINST_EVENTS` (`MAX_TEXT`); one
        // that is not is stored as text rather than mistaken for a flag.
        if let Some(size) = u32::try_from(text.len())
            .ok()
            .filter(|n| *n < AGAINST_EVENTS)
        {
            let mut packed = vec![0; 4 + lz4_flex::block::get_maximum_output_size(text.len())];
            packed[..4].copy_from_slice(&(size | AGAINST_EVENTS).to_le_bytes());
            if let Ok(written) = lz4_flex::block::compress_into_with_dict(
                text.as_bytes(),
                &mut packed[4..],
                events.as_bytes(),
            ) && 4 + written < text.len()
            {
                packed.truncate(4 + written);
                return Value::Blob(packed);
            }
        }
    }
    Value::Text(text)
}

/// The text of an events row's messages: compressed against the row's
/// events text (`events`, read only then) or stored as [`decode`] reads.
pub(super) fn decode_against<'a>(
    body: ValueRef<'a>,
    events: ValueRef<'_>,
) -> Result<Cow<'a, str>, StoreError> {
    let ValueRef::Blob(packed) = body else {
        return decode(body, "messages");
    };
    let Some(size) = packed
        .first_chunk::<4>()
        .map(|prefix| u32::from_le_bytes(*prefix))
        .filter(|size| size & AGAINST_EVENTS != 0)
    else {
        return decode(body, "messages");
    };
    let len = bounded(
        usize::try_from(size & !AGAINST_EVENTS).unwrap_or(usize::MAX),
        "messages",
    )?;
    let dictionary = decode(events, "events")?;
    expand(&packed[4..], len, dictionary.as_bytes(), "messages").map(Cow::Owned)
}

/// The text of a stored body, text or compressed; `what` names the table
/// in the error of a damaged row.
pub(super) fn decode<'a>(body: ValueRef<'a>, what: &str) -> Result<Cow<'a, str>, StoreError> {
    match body {
        ValueRef::Text(bytes) => std::str::from_utf8(bytes)
            .map(Cow::Borrowed)
            .map_err(|e| damaged(what, format!("its text is not UTF-8: {e}"))),
        ValueRef::Blob(packed) => {
            let (len, block) =
                lz4_flex::block::uncompressed_size(packed).map_err(|e| unreadable(what, &e))?;
            expand(block, bounded(len, what)?, &[], what).map(Cow::Owned)
        }
        other => Err(damaged(
            what,
            format!(
                "its body is {:?}, neither text nor a compressed blob",
                other.data_type()
            ),
        )),
    }
}

/// `len`, the size a compressed value claims, if a row may hold that much:
/// checked before anything is allocated for it.
fn bounded(len: usize, what: &str) -> Result<usize, StoreError> {
    if len > MAX_TEXT {
        return Err(damaged(
            what,
            format!("it claims {len} bytes of text, more than the {MAX_TEXT} a row may hold"),
        ));
    }
    Ok(len)
}

/// The text of an LZ4 block of `len` bytes, compressed with `dictionary`
/// (empty: none).
fn expand(block: &[u8], len: usize, dictionary: &[u8], what: &str) -> Result<String, StoreError> {
    let bytes = if dictionary.is_empty() {
        lz4_flex::block::decompress(block, len)
    } else {
        lz4_flex::block::decompress_with_dict(block, len, dictionary)
    }
    .map_err(|e| unreadable(what, &e))?;
    String::from_utf8(bytes).map_err(|e| damaged(what, format!("its text is not UTF-8: {e}")))
}

fn unreadable(what: &str, e: &dyn std::fmt::Display) -> StoreError {
    damaged(what, format!("its compressed form is unreadable: {e}"))
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

    /// A tool turn's events and messages, as a commit writes them: the
    /// tool's output is in both.
    fn tool_turn() -> (String, String) {
        let readings: Vec<String> = (0..30)
            .map(|i| format!("{}.{}", 1400 + i * 7, i % 10))
            .collect();
        let output = format!(
            r#"{{\"batch\":\"B-2211\",\"furnace\":\"F3\",\"readings\":[{}]}}"#,
            readings.join(",")
        );
        let events = [
            r#"{"run_id":"run_01","seq":7,"ts":"2026-11-29T21:40:00.000000001Z","type":"react_plan","step":2,"action":"call_tool","tool_calls":[{"call_id":"call_9","tool":"lookup","arguments":{"key":"k0"}}]}"#.to_owned(),
            r#"{"run_id":"run_01","seq":8,"ts":"2026-11-29T21:40:00.000000002Z","type":"policy_decision","step":2,"decision":"execute"}"#.to_owned(),
            format!(r#"{{"run_id":"run_01","seq":9,"ts":"2026-11-29T21:40:00.000000003Z","type":"tool_result","step":2,"call_id":"call_9","tool":"lookup","ok":true,"output":"{output}"}}"#),
        ]
        .join("\n");
        let messages = [
            r#"{"role":"assistant","content":null,"tool_calls":[{"id":"call_9","name":"lookup","arguments":"{\"key\":\"k0\"}"}]}"#.to_owned(),
            format!(r#"{{"role":"tool","call_id":"call_9","name":"lookup","content":"<tool_output tool=\"lookup\">\n{output}\n</tool_output>"}}"#),
        ]
        .join("\n");
        (events, messages)
    }

    fn blob_len(value: &Value) -> usize {
        match value {
            Value::Blob(packed) => packed.len(),
            other => panic!("expected a compressed value, got {other:?}"),
        }
    }

    #[test]
    fn messages_compressed_against_their_events_are_smaller_and_read_back() {
        let (events, messages) = tool_turn();
        // Compressed on their own, as an earlier version stored them.
        let alone = Value::Blob(lz4_flex::block::compress_prepend_size(messages.as_bytes()));
        let against = encode_against(messages.clone(), &events);
        assert!(
            blob_len(&against) * 2 < blob_len(&alone),
            "against the events: {} bytes, alone: {} bytes, text: {} bytes",
            blob_len(&against),
            blob_len(&alone),
            messages.len()
        );
        let stored_events = encode(events.clone());
        let back = decode_against(ValueRef::from(&against), ValueRef::from(&stored_events))
            .unwrap()
            .into_owned();
        assert_eq!(back, messages);
        // Values written before read as they did, whatever the events.
        for earlier in [alone, Value::Text(messages.clone())] {
            let back = decode_against(ValueRef::from(&earlier), ValueRef::Null)
                .unwrap()
                .into_owned();
            assert_eq!(back, messages);
        }
        // Short messages stay text.
        assert_eq!(
            encode_against("{}".to_owned(), &events),
            Value::Text("{}".into())
        );
    }

    #[test]
    fn messages_without_their_events_are_an_error_that_says_so() {
        let (events, messages) = tool_turn();
        let against = encode_against(messages, &events);
        let e = decode_against(ValueRef::from(&against), ValueRef::Null)
            .unwrap_err()
            .to_string();
        assert!(e.contains("stored events row is damaged"), "{e}");
        // A flagged size beyond a row's bound is refused before allocating.
        let stored_events = encode(events);
        let e = decode_against(
            ValueRef::Blob(&[0xff, 0xff, 0xff, 0xff, 0]),
            ValueRef::from(&stored_events),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("stored messages row is damaged") && e.contains("more than"),
            "{e}"
        );
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
