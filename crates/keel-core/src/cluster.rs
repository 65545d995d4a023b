//! One node among several sharing a store (SPEC §10): the background work
//! that lets any node accept, follow and steer any run while each run is
//! executed by exactly one node.
//!
//! - **Leases**: every `lease/3` the node renews the leases of the runs it
//!   executes; an actor whose run was lost is stopped (its commits would be
//!   refused anyway, see `Coordination::commit`).
//! - **Claims**: every few seconds the node takes over runs whose node died
//!   (lease expired) and resumes them through the actor's recovery, then
//!   delivers the commands waiting in the mailboxes of the runs it owns.
//! - **Notices**: events committed on other nodes are read from the store
//!   and published on the local bus, so a follower here sees them live;
//!   commands posted on other nodes are picked up at once.
//!
//! The store is the only channel between nodes: no node talks to another.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use keel_protocol::{Event, Notice, RunRecord};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::error::CoreError;
use crate::runtime::{ClientToolOutput, Command, Runtime, Shared};

/// Runs taken over per claim query; a full batch is followed by another.
const CLAIM_BATCH: u32 = 32;

/// How often followed runs of other nodes are re-read even without a
/// notice, in case one was missed.
const RESYNC_EVERY: Duration = Duration::from_secs(10);

/// Pause before retrying the store after a failure.
const RETRY: Duration = Duration::from_secs(1);

const PAGE: u32 = 500;

/// What a node may ask of a run owned by another node.
pub(crate) enum Posted {
    Run(Command),
    Cancel(String),
}

/// A posted command as it travels through the store's command mailbox.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Wire {
    Input { text: String },
    Steer { text: String },
    FollowUp { text: String },
    ApprovalDecided,
    Restore { checkpoint_id: String },
    ToolOutputs { outputs: Vec<ClientToolOutput> },
    Cancel { by: String },
}

impl Posted {
    fn encode(&self) -> Value {
        let wire = match self {
            Self::Run(Command::Input(text)) => Wire::Input { text: text.clone() },
            Self::Run(Command::Steer(text)) => Wire::Steer { text: text.clone() },
            Self::Run(Command::FollowUp(text)) => Wire::FollowUp { text: text.clone() },
            Self::Run(Command::ApprovalDecided) => Wire::ApprovalDecided,
            Self::Run(Command::Restore(id)) => Wire::Restore {
                checkpoint_id: id.clone(),
            },
            Self::Run(Command::ToolOutputs(outputs)) => Wire::ToolOutputs {
                outputs: outputs.clone(),
            },
            Self::Cancel(by) => Wire::Cancel { by: by.clone() },
        };
        serde_json::to_value(wire).unwrap_or(Value::Null)
    }

    /// `None` for a body this version does not understand (logged by the caller).
    fn decode(v: &Value) -> Option<Self> {
        let wire: Wire = serde_json::from_value(v.clone()).ok()?;
        Some(match wire {
            Wire::Input { text } => Self::Run(Command::Input(text)),
            Wire::Steer { text } => Self::Run(Command::Steer(text)),
            Wire::FollowUp { text } => Self::Run(Command::FollowUp(text)),
            Wire::ApprovalDecided => Self::Run(Command::ApprovalDecided),
            Wire::Restore { checkpoint_id } => Self::Run(Command::Restore(checkpoint_id)),
            Wire::ToolOutputs { outputs } => Self::Run(Command::ToolOutputs(outputs)),
            Wire::Cancel { by } => Self::Cancel(by),
        })
    }
}

/// Starts what every node sharing the store does: renewing its leases and
/// hearing from the other nodes. The tasks hold the runtime only weakly,
/// and end once it is gone.
pub(crate) fn start(shared: &Arc<Shared>) {
    let lease = shared.coord.lease();
    let renew_every = (lease / 3).max(Duration::from_millis(100));
    tokio::spawn(renew_loop(Arc::downgrade(shared), renew_every));
    tokio::spawn(notice_loop(Arc::downgrade(shared)));
}

/// Makes this node take over runs of dead nodes from now on: what a server
/// does, and a one-shot `keel run` does not.
pub(crate) fn start_claiming(shared: &Arc<Shared>) {
    let lease = shared.coord.lease();
    let claim_every = (lease / 4).clamp(Duration::from_millis(250), Duration::from_secs(2));
    tokio::spawn(claim_loop(Arc::downgrade(shared), claim_every));
    tracing::info!(
        node = shared.coord.node_id(),
        lease_s = lease.as_secs_f64(),
        "joined the cluster"
    );
}

/// Puts a command in the run's mailbox, for whichever node owns it.
pub(crate) async fn post(
    shared: &Shared,
    run: &RunRecord,
    posted: Posted,
) -> Result<(), CoreError> {
    shared
        .coord
        .post_command(&run.id, &run.tenant, &posted.encode())
        .await
        .map_err(|e| match e {
            keel_protocol::StoreError::NotFound => CoreError::NotFound,
            other => CoreError::Store(other),
        })
}

/// Takes over every claimable run (in batches), then delivers the commands
/// waiting for this node's runs. Returns how many runs were taken.
pub(crate) async fn claim_round(shared: &Arc<Shared>) -> Result<usize, CoreError> {
    let runtime = Runtime::from_shared(shared.clone());
    let mut taken = 0;
    loop {
        let runs = shared.coord.claim(CLAIM_BATCH).await?;
        let full = runs.len() >= CLAIM_BATCH as usize;
        for run in runs {
            tracing::info!(
                node = shared.coord.node_id(),
                run = %run.id,
                status = run.status.as_str(),
                "took over run"
            );
            metrics::counter!("keel_runs_taken_over_total").increment(1);
            match runtime.adopt(&run) {
                Ok(()) => taken += 1,
                Err(e) => tracing::error!(run = %run.id, error = %e, "cannot resume a claimed run"),
            }
        }
        if !full {
            break;
        }
    }
    deliver_commands(shared).await?;
    Ok(taken)
}

/// Hands the commands waiting for this node's runs to their actors,
/// starting an actor where an owned run has none.
async fn deliver_commands(shared: &Arc<Shared>) -> Result<(), CoreError> {
    let commands = shared.coord.take_commands().await?;
    for c in commands {
        let Some(posted) = Posted::decode(&c.body) else {
            tracing::warn!(run = %c.run_id, body = %c.body, "dropping an unreadable command");
            continue;
        };
        if !deliver(shared, &c.run_id, posted) {
            // Owned here but not running: start it, then hand the command over.
            let Some(posted) = Posted::decode(&c.body) else {
                continue;
            };
            match shared.store.get_run(&c.tenant, &c.run_id).await {
                Ok(Some(run)) if !run.status.is_terminal() => {
                    Runtime::from_shared(shared.clone()).adopt(&run)?;
                    if !deliver(shared, &c.run_id, posted) {
                        tracing::warn!(run = %c.run_id, "the run ended before its command arrived");
                    }
                }
                Ok(_) => tracing::debug!(run = %c.run_id, "command for a run that has ended"),
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// Hands a command to the run's actor here; false when it has none.
fn deliver(shared: &Shared, run_id: &str, posted: Posted) -> bool {
    match posted {
        Posted::Cancel(by) => shared.cancel_local(run_id, Some(&by)),
        Posted::Run(cmd) => shared.deliver_local(run_id, cmd).is_ok(),
    }
}

async fn renew_loop(shared: Weak<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let running = shared.active_ids();
        let sent = std::time::Instant::now();
        match shared.coord.renew(&running).await {
            Ok(kept) => {
                shared.leases_renewed(&kept, sent);
                let kept: HashSet<String> = kept.into_iter().collect();
                for id in running.iter().filter(|id| !kept.contains(*id)) {
                    // Ended just now, or taken over: either way this actor is
                    // done. Its commits would be refused by the store anyway.
                    if shared.cancel_local(id, None) {
                        tracing::warn!(
                            run = %id,
                            node = shared.coord.node_id(),
                            "lease not renewed (the run ended or another node took it over); stopping the local actor"
                        );
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "renewing leases failed"),
        }
    }
}

async fn claim_loop(shared: Weak<Shared>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if let Err(e) = claim_round(&shared).await {
            tracing::warn!(error = %e, "claiming runs failed");
        }
    }
}

async fn notice_loop(weak: Weak<Shared>) {
    let Some(coord) = weak.upgrade().map(|s| s.coord.clone()) else {
        return;
    };
    // Receiving runs in a task of its own, so that the handler below can
    // wait on a timer too without ever abandoning a receive halfway.
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let mut notices = match coord.listen().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for notices; retrying");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            if tx.send(Notice::Resync).is_err() {
                return;
            }
            loop {
                match notices.next().await {
                    Ok(n) => {
                        if tx.send(n).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "listening for notices failed; reconnecting");
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
        }
    });
    let mut feed = Feed::default();
    let mut resync = tokio::time::interval(RESYNC_EVERY);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let notice = tokio::select! {
            n = rx.recv() => match n {
                Some(n) => n,
                None => return,
            },
            _ = resync.tick() => Notice::Resync,
        };
        let Some(shared) = weak.upgrade() else {
            return;
        };
        match notice {
            Notice::Events {
                run_id,
                first,
                last,
            } => feed.events(&shared, run_id, first, last).await,
            Notice::Command { owner, .. } => {
                if owner.as_deref().is_none_or(|o| o == shared.coord.node_id())
                    && let Err(e) = deliver_commands(&shared).await
                {
                    tracing::warn!(error = %e, "delivering commands failed");
                }
            }
            Notice::Resync => {
                feed.resync(&shared).await;
                if let Err(e) = deliver_commands(&shared).await {
                    tracing::warn!(error = %e, "delivering commands failed");
                }
            }
        }
    }
}

/// Relays events committed on other nodes to this node's followers. Runs
/// nobody here follows cost nothing but the notice.
#[derive(Default)]
struct Feed {
    /// Highest seq published (or known published) per followed run.
    seen: HashMap<String, u64>,
}

impl Feed {
    async fn events(&mut self, shared: &Shared, run_id: String, first: u64, last: u64) {
        if !shared.bus.is_watched(&run_id) {
            self.seen.remove(&run_id);
            return;
        }
        if shared.has_actor(&run_id) {
            // Its actor here published them when it committed them.
            self.seen.insert(run_id, last);
            return;
        }
        let from = first.saturating_sub(1);
        let after = match self.seen.get(&run_id) {
            Some(&seen) if seen >= last => return,
            Some(&seen) => seen.min(from),
            None => from,
        };
        self.publish_from(shared, &run_id, after).await;
    }

    /// Re-reads every followed run of another node from what was last
    /// published: a missed notice then costs a delay, never an event.
    async fn resync(&mut self, shared: &Shared) {
        let watched = shared.bus.watched();
        let keep: HashSet<&String> = watched.iter().collect();
        self.seen.retain(|id, _| keep.contains(id));
        for run_id in &watched {
            if shared.has_actor(run_id) {
                continue;
            }
            let after = self.seen.get(run_id).copied().unwrap_or(0);
            self.publish_from(shared, run_id, after).await;
        }
    }

    async fn publish_from(&mut self, shared: &Shared, run_id: &str, mut after: u64) {
        loop {
            let batch = match shared.store.events_after(run_id, after, PAGE).await {
                Ok(batch) => batch,
                Err(e) => {
                    // The follower reads the store itself when it sees a gap.
                    tracing::debug!(run = %run_id, error = %e, "reading remote events failed");
                    return;
                }
            };
            let Some(last) = batch.last() else {
                return;
            };
            after = last.seq;
            let ended = batch.iter().any(Event::is_terminal);
            let full = batch.len() >= PAGE as usize;
            shared.bus.publish(batch);
            if ended {
                self.seen.remove(run_id);
                return;
            }
            self.seen.insert(run_id.to_owned(), after);
            if !full {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn posted_commands_round_trip() {
        let cases = vec![
            Posted::Run(Command::Input("F2".into())),
            Posted::Run(Command::Steer("stop".into())),
            Posted::Run(Command::FollowUp("and F3?".into())),
            Posted::Run(Command::ApprovalDecided),
            Posted::Run(Command::Restore("cp_1".into())),
            Posted::Run(Command::ToolOutputs(vec![ClientToolOutput {
                call_id: "c1".into(),
                output: "42".into(),
            }])),
            Posted::Cancel("alice".into()),
        ];
        for posted in cases {
            let encoded = posted.encode();
            let decoded = Posted::decode(&encoded).expect("decodes");
            assert_eq!(decoded.encode(), encoded);
        }
        assert_eq!(
            Posted::Run(Command::Input("F2".into())).encode(),
            json!({"type": "input", "text": "F2"}),
            "the wire shape nodes of an earlier version read"
        );
        assert!(Posted::decode(&json!({"type": "input"})).is_none());
        assert!(Posted::decode(&json!({"type": "reboot"})).is_none());
    }
}
