//! The coordination port: which node runs which run when several keel nodes
//! share one store, how a command posted to any node reaches the run's
//! owner, and how a node learns that another one committed events
//! (SPEC §10).
//!
//! Kept apart from [`Store`] because it is per node, not per database: it
//! carries a node identity and a lease, and the embedded single-node store
//! (SQLite) needs none of it. [`SingleNode`] is that default: this process
//! owns every run and nothing else is there to hear from.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::{Commit, Event, RunRecord, Store, StoreError};

/// A command waiting in a run's mailbox for the node that owns the run.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedCommand {
    /// Posting order across the whole store.
    pub id: i64,
    pub run_id: String,
    pub tenant: String,
    pub body: Value,
}

/// Something that happened on another node (or this one), as announced by
/// the store. Notices carry no data: the data is read from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Events `first..=last` of a run were committed.
    Events {
        run_id: String,
        first: u64,
        last: u64,
    },
    /// A command was posted to a run's mailbox; `owner` is the node that
    /// owned the run when it was posted, if any did.
    Command {
        run_id: String,
        owner: Option<String>,
    },
    /// The notice stream was interrupted and is back: notices may have been
    /// missed, so whatever depends on them should re-read the store.
    Resync,
}

/// A node's subscription to [`Notice`]s.
#[async_trait::async_trait]
pub trait Notices: Send {
    /// The next notice. After an error the caller may call again: the
    /// subscription reconnects, and reports [`Notice::Resync`] first.
    async fn next(&mut self) -> Result<Notice, StoreError>;
}

/// One node's side of sharing a store with other nodes.
///
/// Ownership is a lease: a run belongs to the node whose lease on it has not
/// expired. Writes of a run's actor go through [`Coordination::commit`],
/// which refuses with [`StoreError::LeaseLost`] once the lease is gone, so an
/// actor that lost its run can never write beside the new owner.
#[async_trait::async_trait]
pub trait Coordination: Send + Sync {
    /// This node's identity, as recorded in the runs it owns.
    fn node_id(&self) -> &str;

    /// Whether other nodes may share the store. When false, this node owns
    /// every run: there is nothing to renew, claim, post or listen to.
    fn is_shared(&self) -> bool;

    /// How long a lease lasts without renewal.
    fn lease(&self) -> Duration;

    /// Takes a run nobody holds a live lease on (a run this node just
    /// created). True when this node owns it now.
    async fn acquire(&self, run_id: &str) -> Result<bool, StoreError>;

    /// Extends this node's leases on `run_ids` (the runs it is executing)
    /// and returns those it still owns; the others were lost.
    async fn renew(&self, run_ids: &[String]) -> Result<Vec<String>, StoreError>;

    /// Takes up to `limit` unfinished runs whose lease expired, or that
    /// nobody owned for a whole lease, and returns them as stored.
    async fn claim(&self, limit: u32) -> Result<Vec<RunRecord>, StoreError>;

    /// Lets every run this node id owns go at once (at shutdown, and at
    /// start for runs an earlier process with the same id left): they are
    /// claimable without waiting for the leases to expire.
    async fn release_all(&self) -> Result<(), StoreError>;

    /// Runs this node holds a live lease on.
    async fn owned_count(&self) -> Result<u64, StoreError>;

    /// [`Store::commit`], but only while this node owns the run; a terminal
    /// status also gives the run up. Announces the new events.
    async fn commit(&self, run_id: &str, commit: Commit) -> Result<Vec<Event>, StoreError>;

    /// Puts a command in a run's mailbox and tells its owner.
    async fn post_command(
        &self,
        run_id: &str,
        tenant: &str,
        body: &Value,
    ) -> Result<(), StoreError>;

    /// Removes and returns, oldest first, the commands waiting for runs this
    /// node owns.
    async fn take_commands(&self) -> Result<Vec<QueuedCommand>, StoreError>;

    /// Subscribes to notices from every node.
    async fn listen(&self) -> Result<Box<dyn Notices>, StoreError>;
}

/// The only node there is: it owns every run, and commits go straight to
/// the store.
pub struct SingleNode {
    store: Arc<dyn Store>,
    node_id: String,
}

impl SingleNode {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            node_id: "local".into(),
        }
    }
}

/// Notices of a single node: there never are any.
struct Silence;

#[async_trait::async_trait]
impl Notices for Silence {
    async fn next(&mut self) -> Result<Notice, StoreError> {
        futures::future::pending().await
    }
}

#[async_trait::async_trait]
impl Coordination for SingleNode {
    fn node_id(&self) -> &str {
        &self.node_id
    }

    fn is_shared(&self) -> bool {
        false
    }

    fn lease(&self) -> Duration {
        Duration::MAX
    }

    async fn acquire(&self, _run_id: &str) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn renew(&self, run_ids: &[String]) -> Result<Vec<String>, StoreError> {
        Ok(run_ids.to_vec())
    }

    async fn claim(&self, _limit: u32) -> Result<Vec<RunRecord>, StoreError> {
        Ok(Vec::new())
    }

    async fn release_all(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn owned_count(&self) -> Result<u64, StoreError> {
        Ok(0)
    }

    async fn commit(&self, run_id: &str, commit: Commit) -> Result<Vec<Event>, StoreError> {
        self.store.commit(run_id, commit).await
    }

    async fn post_command(
        &self,
        run_id: &str,
        _tenant: &str,
        _body: &Value,
    ) -> Result<(), StoreError> {
        Err(StoreError::Conflict(format!(
            "run {run_id} has no mailbox on a single node"
        )))
    }

    async fn take_commands(&self) -> Result<Vec<QueuedCommand>, StoreError> {
        Ok(Vec::new())
    }

    async fn listen(&self) -> Result<Box<dyn Notices>, StoreError> {
        Ok(Box::new(Silence))
    }
}
