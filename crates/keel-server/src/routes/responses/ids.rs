//! Response and output-item ids. They encode the keel run and the event
//! sequence number they start at, so everything needed to continue a
//! conversation is derived from the run and its event log: nothing lives
//! only in this process's memory, and ids stay valid across restarts.
//!
//! - response: `resp_<run id>_<seq>` — the part of the run after event `seq`
//!   (0 for a fresh run; the run's last event when it was resumed);
//! - message item: `msg_<run id>_<seq>`, function call item:
//!   `fc_<run id>_<seq>` — the event the item was built from.
//!
//! Stateless clients (the Agents SDK by default) replay output items instead
//! of sending `previous_response_id`; the run is found from those item ids.

pub fn response_id(run_id: &str, start: u64) -> String {
    format!("resp_{run_id}_{start}")
}

pub fn message_id(run_id: &str, seq: u64) -> String {
    format!("msg_{run_id}_{seq}")
}

pub fn call_item_id(run_id: &str, seq: u64) -> String {
    format!("fc_{run_id}_{seq}")
}

/// `(run id, start seq)` of a response id keel issued; `None` for any other id.
pub fn parse_response_id(id: &str) -> Option<(String, u64)> {
    split(id.strip_prefix("resp_")?)
}

/// The run an output item keel issued belongs to; `None` for other ids
/// (items of another server, or ones the client made up).
pub fn run_of_item(id: &str) -> Option<String> {
    let rest = id.strip_prefix("msg_").or_else(|| id.strip_prefix("fc_"))?;
    split(rest).map(|(run, _)| run)
}

fn split(rest: &str) -> Option<(String, u64)> {
    let (run, seq) = rest.rsplit_once('_')?;
    let hex = run.strip_prefix("run_")?;
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    let seq = seq.parse().ok()?;
    Some((run.to_owned(), seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        let run = "run_0190f3a1b2c3";
        assert_eq!(
            parse_response_id(&response_id(run, 17)),
            Some((run.to_owned(), 17))
        );
        assert_eq!(run_of_item(&message_id(run, 4)).as_deref(), Some(run));
        assert_eq!(run_of_item(&call_item_id(run, 9)).as_deref(), Some(run));
    }

    #[test]
    fn foreign_ids_are_not_ours() {
        for id in [
            "resp_abc",
            "resp_67ccd2bed1ec8190",
            "msg_67ccd3acc8d48190a77525dc6de64b4104becd",
            "fc_12345xyz",
            "resp_run__3",
            "resp_run_x-y_3",
            "resp_run_ab_x",
            "call_1",
        ] {
            assert_eq!(parse_response_id(id), None, "{id}");
            assert_eq!(run_of_item(id), None, "{id}");
        }
    }
}
