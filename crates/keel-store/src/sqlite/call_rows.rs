//! Loop detection's call records (schema v11): stored in the `calls` column
//! of the events row of the commit that made them, one per line (`n`, a
//! space, the record), so that a tool turn writes no row of its own for
//! them. A commit with records and no events, or with a record holding a
//! line break (compact JSON never does), writes them to the `run_calls`
//! table as earlier versions did; reads merge both.

use rusqlite::{Connection, params};

use keel_protocol::{StoreError, StoredCall};

use super::codec::{db, to_i64, to_u64};

/// The place of the commit's last record, after checking that every place
/// is new: each one past the run's last (`last_call`) and past the one
/// before it. `None` when the commit has no records.
pub(super) fn last_place(last_call: i64, calls: &[StoredCall]) -> Result<Option<i64>, StoreError> {
    let mut last = last_call;
    for call in calls {
        let n = to_i64(call.n, "call record place")?;
        if n <= last {
            return Err(StoreError::Conflict(format!(
                "call record place {n} is not after the run's last, {last}"
            )));
        }
        last = n;
    }
    Ok((!calls.is_empty()).then_some(last))
}

/// The `calls` column of the commit's events row: `None` when there are no
/// records, or when one cannot be a line, and then [`insert_rows`] takes
/// them.
pub(super) fn column(calls: &[StoredCall]) -> Option<String> {
    if calls.is_empty() || calls.iter().any(|c| c.record.contains('\n')) {
        return None;
    }
    let mut text = String::with_capacity(calls.iter().map(|c| c.record.len() + 24).sum());
    for call in calls {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&call.n.to_string());
        text.push(' ');
        text.push_str(&call.record);
    }
    Some(text)
}

/// The records as rows of `run_calls`.
pub(super) fn insert_rows(
    conn: &Connection,
    run_id: &str,
    calls: &[StoredCall],
) -> Result<(), StoreError> {
    let mut insert = conn
        .prepare_cached("INSERT INTO run_calls (run_id, n, record) VALUES (?1, ?2, ?3)")
        .map_err(db("preparing call record insert"))?;
    for call in calls {
        insert
            .execute(params![
                run_id,
                to_i64(call.n, "call record place")?,
                call.record
            ])
            .map_err(db("inserting call record"))?;
    }
    Ok(())
}

/// The run's last `limit` call records, oldest first.
pub(super) fn read(
    conn: &Connection,
    run_id: &str,
    limit: u32,
) -> Result<Vec<StoredCall>, StoreError> {
    let wanted = usize::try_from(limit).unwrap_or(usize::MAX);
    // Newest first: the events rows in reverse, each row's lines in reverse.
    let mut calls = Vec::new();
    let mut stmt = conn
        .prepare_cached(
            "SELECT calls FROM events WHERE run_id = ?1 AND calls IS NOT NULL \
             ORDER BY last_seq DESC",
        )
        .map_err(db("preparing call records query"))?;
    let mut rows = stmt.query([run_id]).map_err(db("reading call records"))?;
    while calls.len() < wanted {
        let Some(row) = rows.next().map_err(db("reading call records"))? else {
            break;
        };
        let text = row.get_ref(0).map_err(db("reading call records"))?;
        let text = text
            .as_str()
            .map_err(|e| damaged(format!("its calls are not text: {e}")))?;
        for line in text.rsplit('\n') {
            calls.push(parse_line(line)?);
            if calls.len() == wanted {
                break;
            }
        }
    }
    // Records of commits without events, and of earlier versions.
    let mut stmt = conn
        .prepare_cached(
            "SELECT n, record FROM run_calls WHERE run_id = ?1 ORDER BY n DESC LIMIT ?2",
        )
        .map_err(db("preparing call records query"))?;
    let rows = stmt
        .query_map(params![run_id, limit], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
        })
        .map_err(db("reading call records"))?;
    for row in rows {
        let (n, record) = row.map_err(db("reading call record"))?;
        calls.push(StoredCall {
            n: to_u64(n, "call record place")?,
            record,
        });
    }
    calls.sort_unstable_by_key(|c| std::cmp::Reverse(c.n));
    calls.truncate(wanted);
    calls.reverse();
    Ok(calls)
}

fn parse_line(line: &str) -> Result<StoredCall, StoreError> {
    let (n, record) = line
        .split_once(' ')
        .ok_or_else(|| damaged(format!("a line has no place: {line:.40}")))?;
    let n = n
        .parse()
        .map_err(|e| damaged(format!("a line's place {n:.20} is not a number: {e}")))?;
    Ok(StoredCall {
        n,
        record: record.to_owned(),
    })
}

fn damaged(why: String) -> StoreError {
    StoreError::Backend(format!(
        "a stored events row's call records are damaged: {why}"
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn call(n: u64, record: &str) -> StoredCall {
        StoredCall {
            n,
            record: record.into(),
        }
    }

    #[test]
    fn records_become_lines_and_come_back() {
        let calls = [call(7, r#"{"tool":"t","args":"a b"}"#), call(8, "{}")];
        let text = column(&calls).unwrap();
        assert_eq!(text, "7 {\"tool\":\"t\",\"args\":\"a b\"}\n8 {}");
        let back: Vec<StoredCall> = text.split('\n').map(|l| parse_line(l).unwrap()).collect();
        assert_eq!(back, calls);
        assert_eq!(column(&[]), None);
        assert_eq!(column(&[call(1, "{}"), call(2, "a\nb")]), None);
    }

    #[test]
    fn places_must_move_on() {
        assert_eq!(last_place(3, &[]).unwrap(), None);
        assert_eq!(
            last_place(3, &[call(4, "{}"), call(6, "{}")]).unwrap(),
            Some(6)
        );
        let e = last_place(3, &[call(4, "{}"), call(4, "{}")]).unwrap_err();
        assert!(e.to_string().contains("place 4"), "{e}");
        assert!(last_place(3, &[call(3, "{}")]).is_err());
    }

    #[test]
    fn a_damaged_line_is_an_error_that_says_so() {
        let e = parse_line("x {}").unwrap_err().to_string();
        assert!(e.contains("damaged") && e.contains("not a number"), "{e}");
        let e = parse_line("nospace").unwrap_err().to_string();
        assert!(e.contains("no place"), "{e}");
    }
}
