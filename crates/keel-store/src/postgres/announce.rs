//! Announces a node's committed events to the other nodes, right after the
//! commits, from one task per node.
//!
//! A `NOTIFY` inside a commit's own transaction would make every commit of
//! the cluster wait for the previous one: PostgreSQL serializes notifying
//! transactions with one lock, held until their commit record is flushed,
//! so commits of concurrent runs could never share a WAL flush (16 clients
//! committing one small row each: about 480 commits/s with the `NOTIFY`,
//! 8,200 without, on a 2-core machine). Sent here instead, many commits'
//! notices share one statement, and that statement's own commit needs no
//! flush: a notice is only a wake-up, the events are already stored.
//!
//! A notice can now be lost without its commit being lost (the node dies
//! in between, or the statement fails); the followers' periodic resync
//! (`docs/multi-node.md`) then delivers those events.

use std::collections::HashMap;
use std::sync::OnceLock;

use sqlx::PgPool;
use tokio::sync::mpsc;

/// At most this many commits' notices go in one statement.
const MAX_BATCH: usize = 512;

/// Events `first..=last` of `run_id` were committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Committed {
    pub run_id: String,
    pub first: u64,
    pub last: u64,
}

/// The sending side; the task stops once this is dropped and what was
/// queued is sent.
pub(super) struct Announcer {
    pool: PgPool,
    channel: &'static str,
    // Started by the first commit, which runs inside the runtime the task
    // needs; a node that never commits starts none.
    queue: OnceLock<mpsc::UnboundedSender<Committed>>,
}

impl Announcer {
    pub(super) fn new(pool: PgPool, channel: &'static str) -> Self {
        Self {
            pool,
            channel,
            queue: OnceLock::new(),
        }
    }

    pub(super) fn announce(&self, committed: Committed) {
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(send_all(self.pool.clone(), self.channel, rx));
            tx
        });
        // The task only ends when this sender is gone.
        let _ = queue.send(committed);
    }
}

async fn send_all(
    pool: PgPool,
    channel: &'static str,
    mut queue: mpsc::UnboundedReceiver<Committed>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let payloads = payloads(&batch);
        batch.clear();
        // `synchronous_commit` off for this transaction only: it writes
        // nothing that must survive a crash of the database.
        let sent = sqlx::query(
            "SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, p) \
             FROM UNNEST($2::text[]) AS p",
        )
        .bind(channel)
        .bind(&payloads)
        .execute(&pool)
        .await;
        if let Err(e) = sent {
            tracing::warn!(
                error = %e,
                notices = payloads.len(),
                "announcing committed events failed; followers on other nodes catch up at their next resync"
            );
        }
    }
}

/// One payload `<run_id> <first> <last>` per run, covering all its commits
/// in the batch (a run's commits are queued in order and follow each other).
fn payloads(batch: &[Committed]) -> Vec<String> {
    let mut merged: Vec<Committed> = Vec::with_capacity(batch.len());
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(batch.len());
    for c in batch {
        match index.get(c.run_id.as_str()) {
            Some(&i) => {
                if let Some(m) = merged.get_mut(i) {
                    m.first = m.first.min(c.first);
                    m.last = m.last.max(c.last);
                }
            }
            None => {
                index.insert(&c.run_id, merged.len());
                merged.push(c.clone());
            }
        }
    }
    merged
        .into_iter()
        .map(|c| format!("{} {} {}", c.run_id, c.first, c.last))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(run_id: &str, first: u64, last: u64) -> Committed {
        Committed {
            run_id: run_id.into(),
            first,
            last,
        }
    }

    #[test]
    fn a_runs_commits_in_one_batch_make_one_notice() {
        let batch = [c("a", 1, 3), c("b", 1, 1), c("a", 4, 4), c("a", 5, 9)];
        assert_eq!(payloads(&batch), ["a 1 9", "b 1 1"]);
    }

    #[test]
    fn each_run_keeps_its_first_place() {
        let batch = [c("b", 7, 7), c("a", 2, 2), c("b", 8, 8)];
        assert_eq!(payloads(&batch), ["b 7 8", "a 2 2"]);
    }
}
